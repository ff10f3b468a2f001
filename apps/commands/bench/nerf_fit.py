"""``framegraph bench nerf_fit``: fit-nerf on a real capture — steps/s and held-out PSNR against training time.

Like ``framegraph fit-nerf``, it takes the NeRF's own options. They are in ``renderers/nerf_options.py``,
torch-free."""
from __future__ import annotations

import argparse

from framegraph.renderers.nerf_options import add_model_arguments, per_device_help

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.nerf_fit"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transforms", required=True, help="a real capture's transforms.json (instant-ngp / nerfstudio)")
    p.add_argument("--downscale", type=int, default=8, help="shrink images by this factor (default 8)")
    p.add_argument("--hold-out", type=int, default=8, help="every N-th frame is held out and scored (default 8)")
    p.add_argument("--aabb", type=float, nargs=6, metavar=("XMIN", "YMIN", "ZMIN", "XMAX", "YMAX", "ZMAX"),
                   help="scene box (default: fit-nerf's, a cube around the cameras' centroid)")
    p.add_argument("--background", type=float, nargs=3, default=(1.0, 1.0, 1.0), metavar=("R", "G", "B"))
    p.add_argument("--steps", type=int, help=f"optimisation steps ({per_device_help('steps')})")
    p.add_argument("--batch-rays", type=int, help=f"rays per step ({per_device_help('batch_rays')})")
    add_model_arguments(p)
    p.add_argument("--eval-every", type=int, default=100, help="score the held-out frames every N steps (100)")
    p.add_argument("--target-db", type=float, default=20.0, help="held-out PSNR to reach (20 dB)")
    p.add_argument("--budget-s", type=float, default=600.0, help="training seconds to reach it in (600)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--seed", type=int, default=0)
    add_out_argument(p)
