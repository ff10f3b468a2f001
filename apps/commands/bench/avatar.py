"""``framegraph bench avatar``: the talking avatar's speed. It measures time to first frame, FPS and stage p50/p99 per
region size, and concurrent sessions."""
from __future__ import annotations

import argparse
import os

from framegraph import assets
from framegraph.apps.argtypes import AVATAR_RUNTIMES, add_runtime_argument, positive_int, positive_ints, runtime_list

from . import add_out_argument

DEFAULT_AVATAR = os.path.join(str(assets.ROOT), "avatars", "astronaut")

IMPLEMENTATION = "framegraph.apps.bench.avatar"  # its run(args) and figure(data, plt)


def _session_size(text: str) -> int | str:
    """``--session-size``: ``"shipped"`` or a positive region side."""
    return text if text == "shipped" else positive_int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--device", default=None, help="where the models run (default: cuda when available)")
    p.add_argument("--avatar", default=DEFAULT_AVATAR, help="the shipped bundle whose model class is measured "
                                                            "(default assets/avatars/astronaut)")
    p.add_argument("--sizes", type=positive_ints, default=None,
                   help="generated region sides, comma-separated (default 256,384,512; --quick: 64)")
    p.add_argument("--shipped", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure the shipped avatar itself at its native size (default: yes)")
    p.add_argument("--seconds", type=float, default=None,
                   help="speech for the steady-FPS run (default 20 on CUDA, 6 on CPU; --quick: 1)")
    p.add_argument("--repeats", type=int, default=None, help="warm TTFF sessions per mode (default 3; --quick: 1)")
    p.add_argument("--sessions", type=positive_ints, default=None,
                   help="concurrent session counts (default 1,2,4 on CUDA, 1,2 on CPU; --quick: 2)")
    p.add_argument("--session-size", type=_session_size, default=None,
                   help="region side of the sessions' avatar, or 'shipped' (default 384 on CUDA, shipped on CPU; "
                        "--quick: the first --sizes entry)")
    p.add_argument("--session-seconds", type=float, default=None,
                   help="audio per concurrent session (default 10 on CUDA, 6 on CPU; --quick: 1)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="CPU intra-op threads per stage (default 1 on CPU, as the server runs; untouched on CUDA)")
    add_runtime_argument(p, "comma-separated runtimes of the model stages to measure: torch, onnx (ONNX Runtime, "
                            "CPU), onnx-int8 (the same, the models `framegraph export --int8` keeps in int8 by default "
                            "running int8) — e.g. torch,onnx (default torch)",
                         type=runtime_list(AVATAR_RUNTIMES), default=["torch"])
    p.add_argument("--onnx", default=None, help="an export of the shipped bundle for its onnx row (default: the "
                                                "bench exports it into a temporary folder)")
    p.add_argument("--quick", action="store_true", help="small runs (a smoke test, not a measurement)")
