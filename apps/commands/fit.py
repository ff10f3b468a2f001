"""``framegraph fit``: fit 3D Gaussians to posed images, or a procedural scene, and save an INRIA PLY."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import SIZE_LIMIT, positive_int, video_size

IMPLEMENTATION = "framegraph.apps.fit"  # its run(args) runs the command


def _rgb(text: str) -> tuple:
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != 3 or not all(0.0 <= v <= 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"background {text!r}: expected R,G,B in [0, 1], e.g. 0,0,0")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="folder of training images (paths in --cameras are relative to it)")
    src.add_argument("--synthetic", metavar="NAME",
                     help="render a procedural scene's views and fit those (available: toy)")
    p.add_argument("--cameras", help="(with --images) nerfstudio-style transforms.json "
                                     "(default: transforms.json in the images folder)")
    p.add_argument("--out", required=True, help="output scene, INRIA .ply")
    p.add_argument("--steps", type=positive_int, default=3000, help="optimisation steps (default 3000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--sh-degree", type=int, choices=[0, 1, 2, 3], default=3, help="final SH degree (default 3)")
    p.add_argument("--init", choices=["random", "points"], default="random",
                   help="start from random points in the scene bounds, or (with --synthetic) from the "
                        "procedural scene's SfM-like surface point cloud (default random)")
    p.add_argument("--init-points", type=positive_int, default=2000, help="initial Gaussians (default 2000)")
    p.add_argument("--max-gaussians", type=positive_int, default=None, help="stop growing at this many")
    p.add_argument("--background", type=_rgb, default=(0.0, 0.0, 0.0),
                   help="R,G,B in [0, 1] behind the Gaussians and under transparent pixels (default 0,0,0)")
    p.add_argument("--held-out-every", type=int, default=8,
                   help="(with --images) hold out every N-th image for the final score; 0: none (default 8)")
    p.add_argument("--downscale", type=positive_int, default=1, help="(with --images) shrink images by N")
    p.add_argument("--views", type=positive_int, default=32, help="(with --synthetic) training views (default 32)")
    p.add_argument("--size", type=video_size, default=(128, 96),
                   help=f"(with --synthetic) WIDTHxHEIGHT of the rendered views (default 128x96; {SIZE_LIMIT})")
    p.add_argument("--report", help="where to write the JSON report (default OUT.report.json)")
    add_run_arguments(p, "OUT.fit.json / OUT.fit.safetensors")


def add_run_arguments(p: argparse.ArgumentParser, checkpoint: str) -> None:
    """The options of a fit's run that ``fit`` and ``fit-nerf`` share. ``checkpoint`` names its files."""
    p.add_argument("--resume", action="store_true",
                   help=f"continue from {checkpoint} (same data and options; a larger --steps continues the run)")
    p.add_argument("--checkpoint-every", type=positive_int, default=None,
                   help="also save the checkpoint every N steps (it is always saved at the end, and on Ctrl-C)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for torch (default: torch's choice; 1 is fastest on a busy machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")

