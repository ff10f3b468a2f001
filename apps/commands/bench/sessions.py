"""``framegraph bench sessions``: many live sessions of one avatar at once. It runs with and without the model service's
batching. It records per-session fps, p95 glass-to-glass, aggregate fps and CPU time per frame."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import name_list, positive_float, positive_int, positive_ints

from . import add_out_argument

PIPELINES = ("avatar", "video_avatar")
BATCHING = ("on", "off")

IMPLEMENTATION = "framegraph.apps.bench.sessions"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--pipeline", type=name_list(PIPELINES, "--pipeline"), default=list(PIPELINES),
                   help="comma-separated, of avatar (the shipped portrait), video_avatar (default both)")
    p.add_argument("--sessions", type=positive_ints, default=[1, 2, 3, 4, 8],
                   help="session counts, comma-separated (default 1,2,3,4,8)")
    p.add_argument("--batching", type=name_list(BATCHING, "--batching"), default=list(BATCHING),
                   help="on, off or on,off (default both): the sessions' model calls in one batch, or each alone")
    p.add_argument("--runtime", choices=["torch", "onnx"], default="onnx", help="where the models run (default onnx)")
    p.add_argument("--device", default=None,
                   help="cpu or cuda, where torch runs the models (default: cuda when available; ONNX Runtime "
                        "runs on the CPU)")
    p.add_argument("--video-region", type=positive_int, default=160,
                   help="the video avatar's region side, px (default 160; its generator has the trained bundles' "
                        "widths and fresh weights: the cost does not depend on them)")
    p.add_argument("--avatar", default=None, help="the portrait bundle (default the shipped astronaut)")
    p.add_argument("--seconds", type=positive_float, default=6.0, help="seconds of speech per session (default 6)")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="runs per count and batching (default 1): with more, the row is the median run's by its "
                        "slowest session, every run's slowest fps kept beside it. Near capacity single runs vary")
    p.add_argument("--torch-threads", type=positive_int, default=None,
                   help="intra-op threads of each heavy stage (default: torch's, every core); the model service's "
                        "lane keeps torch's default, as in a server")
