"""``framegraph bench runtime``: stage-graph overhead per hop, latency under overload, drops, allocations, RSS."""
from __future__ import annotations

import argparse

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.runtime"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--device", default=None, help="device of the stages' tensors (default: cuda when available)")
    p.add_argument("--hops", type=int, default=4, help="stage-to-stage hand-offs in the chain (default 4)")
    p.add_argument("--frames", type=int, default=10_000, help="frames for the memory run (default 10000)")
    p.add_argument("--fps", type=float, default=50.0, help="source rate for the overload run (default 50)")
    p.add_argument("--relay-ms", type=float, default=5.0, help="relay stage time in the overload run")
    p.add_argument("--seconds", type=float, default=6.0, help="duration of the overload run (default 6)")
    p.add_argument("--sink-ms", type=float, default=20.0,
                   help="sink time per frame in the backpressure run, which paces it (default 20)")
    p.add_argument("--quick", action="store_true", help="small runs (a smoke test, not a measurement)")
