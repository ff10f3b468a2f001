"""``framegraph fit-nerf``: train a NeRF directory from a ``transforms.json``.

The file may come from instant-ngp, nerfstudio or Blender. The NeRF's model options are the renderer's own, in
``renderers/nerf_options.py``. They are torch-free, with sizes that default per device. Its demo trainer and
``bench nerf_fit`` share them.
"""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import positive_int
from framegraph.renderers.nerf_options import add_model_arguments, per_device_help

from .fit import add_run_arguments

IMPLEMENTATION = "framegraph.apps.fit_nerf"  # its run(args) runs the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("transforms", help="transforms.json (camera-to-world OpenGL poses; images relative to it)")
    p.add_argument("--out", required=True, help="output NeRF directory (config.json + model.safetensors)")
    p.add_argument("--steps", type=positive_int, help=f"optimisation steps ({per_device_help('steps')})")
    p.add_argument("--batch-rays", type=positive_int, help=f"rays per step ({per_device_help('batch_rays')})")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    p.add_argument("--loss", choices=["huber", "mse"], default="huber")
    p.add_argument("--downscale", type=positive_int, default=1, help="shrink images by this integer factor first")
    p.add_argument("--hold-out", type=int, default=8,
                   help="keep every N-th frame out of training to measure PSNR (0: train on all; default 8)")
    p.add_argument("--aabb", type=float, nargs=6, metavar=("XMIN", "YMIN", "ZMIN", "XMAX", "YMAX", "ZMAX"),
                   help="scene box in world units (default: instant-ngp's box when the file sets aabb_scale / "
                        "scale / offset / aabb, else a cube around the point the cameras look at)")
    p.add_argument("--background", type=float, nargs=3, default=(1.0, 1.0, 1.0), metavar=("R", "G", "B"),
                   help="colour behind the scene and under transparent pixels (default white)")
    add_model_arguments(p)  # sizes default per device (renderers/nerf_options.py DEVICE_DEFAULTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda or cpu (default cuda when available)")
    p.add_argument("--report", help="where to write the JSON report (default OUT/report.json)")
    add_run_arguments(p, "OUT/fit.fit.json / OUT/fit.fit.safetensors")

