"""``framegraph bench launches``: the launch audit. It counts host syncs, kernels and allocations per steady-state frame
of every pipeline."""
from __future__ import annotations

import argparse
from typing import Literal, get_args

from . import add_out_argument

Pipeline = Literal["avatar", "video_avatar", "generate", "3dgs", "4dgs", "nerf"]
PIPELINES: tuple[Pipeline, ...] = get_args(Pipeline)

IMPLEMENTATION = "framegraph.apps.bench.launches"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    names = ",".join(PIPELINES)
    p.add_argument("--pipelines", default=names, help=f"comma-separated, of {names} (default all)")
    p.add_argument("--frames", type=int, default=16, help="frames (generate: chunks) each pipeline runs (default 16)")
    p.add_argument("--warmup", type=int, default=4, help="first calls of each stage left out (default 4)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--video-region", type=int, default=96, help="video avatar's generated region, px (default 96)")
    p.add_argument("--gaussians", type=int, default=2000, help="3DGS random scene size (default 2000)")
    p.add_argument("--render-size", type=lambda s: tuple(int(v) for v in s.split("x")), default=(96, 64),
                   help="WIDTHxHEIGHT of the renderers (default 96x64)")
