"""``framegraph bench server``: the streaming server. It records RSS over 100 sessions and latency over a 10-minute
soak. ``--cluster`` measures the Ray Serve cluster path. ``--transport websocket,webrtc`` puts the two transports side
by side."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import positive_int

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.server"  # its run(args) and figure(data, plt)
PIPELINES = ("scope", "testcard", "avatar")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--pipeline", default="scope", help="server pipeline with audio input (default scope)")
    p.add_argument("--sessions", type=int, default=100, help="sessions for the RSS phase (default 100)")
    p.add_argument("--session-seconds", type=float, default=1.0, help="audio per session (default 1)")
    p.add_argument("--soak-seconds", type=float, default=600.0, help="soak length (default 600 = 10 min)")
    p.add_argument("--quick", action="store_true", help="10 sessions and a 6 s soak (a smoke test)")
    add_cluster_arguments(p)
    add_transport_arguments(p)


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``bench server`` that only ``--cluster`` reads."""
    p.add_argument("--cluster", action="store_true",
                   help="benchmark the Ray Serve cluster path instead (needs `pip install 'framegraph[cluster]'`): "
                        "replica start, sessions at target FPS per replica, glass-to-glass via plain serve / the "
                        "cluster / Serve's HTTP proxy, bundle load time")
    p.add_argument("--replicas", default="1,2", help="with --cluster: replica counts to measure (default 1,2)")
    p.add_argument("--capacity", type=int, default=6, help="with --cluster: sessions per replica (default 6)")
    p.add_argument("--ramp-seconds", type=float, default=8.0,
                   help="with --cluster: seconds each concurrency step streams (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="with --cluster: sessions per path (default 3)")
    p.add_argument("--path-seconds", type=float, default=12.0,
                   help="with --cluster: seconds each path session streams (default 12)")


def add_transport_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``bench server`` that only ``--transport`` reads."""
    p.add_argument("--transport", default=None, metavar="LIST",
                   help="compare transports instead (websocket,webrtc): glass-to-glass, first frame, server CPU "
                        "and bytes per second per pipeline, on a clean link and an impaired one (needs root: "
                        "network namespaces)")
    p.add_argument("--pipelines", default=",".join(PIPELINES),
                   help=f"with --transport: pipelines to stream (default {','.join(PIPELINES)})")
    p.add_argument("--transport-seconds", type=float, default=10.0,
                   help="with --transport: seconds each session streams (default 10)")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="with --transport: sessions per pipeline, transport and link, taking turns; each figure is "
                        "their median, each session kept in the JSON (default 1)")
    p.add_argument("--impairment", default="2,30,30", metavar="LOSS,DELAY,JITTER",
                   help="with --transport: loss %%, delay ms, jitter ms each way (default 2,30,30; 'none': the clean "
                        "link only)")
