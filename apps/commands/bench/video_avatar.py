"""``framegraph bench video_avatar``: a video avatar on a real clip — held-out lip sync, PSNR outside the mouth,
FPS, first frame."""
from __future__ import annotations

import argparse

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.video_avatar"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--avatar", required=True, help="a video avatar bundle (framegraph avatar train --video)")
    p.add_argument("--clip", required=True, help="a real clip of the same person at the bundle's size and fps")
    p.add_argument("--start-s", type=float, help="held-out segment start (default: the bundle's training holdout)")
    p.add_argument("--end-s", type=float, help="held-out segment end (default: the clip's end)")
    p.add_argument("--audio", help="speech driving the speed runs (default: the clip's own sound)")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds of audio per speed run (8)")
    p.add_argument("--region", type=int, default=256, help="also time a generator of this region size (256)")
    p.add_argument("--warm-runs", type=int, default=3, help="later sessions timed to their first frame (3)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (2)")
    p.add_argument("--runtime", default="torch",
                   help="comma-separated runtimes to time the graph on: torch, onnx (the audio encoder and the "
                        "generator on ONNX Runtime, exported for the run; default torch)")
    add_out_argument(p)
