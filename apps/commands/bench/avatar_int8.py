"""``framegraph bench avatar_int8``: each of the avatar's ONNX models in int8 against float32. It records held-out
quality, stage p50, and the decision."""
from __future__ import annotations

import argparse

from . import add_out_argument
from .avatar import DEFAULT_AVATAR

IMPLEMENTATION = "framegraph.apps.bench.avatar_int8"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--avatar", default=DEFAULT_AVATAR, help="the bundle (default assets/avatars/astronaut)")
    p.add_argument(
        "--clips",
        default=None,
        help="a folder of held-out synthetic clips (clip_NNNNN.mp4 + .json, from `framegraph avatar synth`); "
        "default: synthesize --clip-count clips of 6 s with seed 1000 (the shipped figures' clips)",
    )
    p.add_argument("--clip-count", type=int, default=3, help="held-out clips to use (default 3)")
    p.add_argument("--modes", default="static,dynamic", help="int8 modes to measure (default static,dynamic)")
    p.add_argument("--seconds", type=float, default=6.0, help="speech for each steady speed run (default 6)")
    p.add_argument("--rounds", type=int, default=1, help="steady graph runs per variant, in turns (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="side-by-side passes over the recorded calls (default 5)")
    p.add_argument("--torch-threads", type=int, default=1, help="intra-op threads per stage / session (default 1)")
