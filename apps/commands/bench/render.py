"""``framegraph bench render``: 3DGS / 4DGS / NeRF render speed and peak memory per backend, and gsplat's."""
from __future__ import annotations

import argparse
import os
from typing import Literal, get_args

from framegraph import assets
from framegraph.apps.argtypes import SIZE_LIMIT, name_list, size

from . import add_out_argument

Section = Literal["3dgs", "4dgs", "nerf"]
Backend = Literal["torch", "triton"]
SECTIONS: tuple[Section, ...] = get_args(Section)
BACKENDS: tuple[Backend, ...] = get_args(Backend)
DEFAULT_SCENE4D = os.path.join(str(assets.ROOT), "scenes4d", "bouncing_ball.pth")
DEFAULT_NERF = os.path.join(str(assets.ROOT), "nerf", "spheres")

IMPLEMENTATION = "framegraph.apps.bench.render"  # its run(args) and figure(data, plt)


def _counts(text: str) -> list:
    """``"100000,1e6,3e6"`` -> ``[100000, 1000000, 3000000]``. ``""`` or ``"none"`` -> ``[]``."""
    if text.strip().lower() in ("", "none"):
        return []
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated counts, e.g. 100000,1e6, got {text!r}") from None
        if v < 1 or v != int(v):
            raise argparse.ArgumentTypeError(f"counts must be positive integers, got {part!r}")
        out.append(int(v))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--sections", type=name_list(SECTIONS, "--sections"), default=list(SECTIONS),
                   help="comma-separated: 3dgs, 4dgs, nerf (default all)")
    g = p.add_argument_group("3dgs")
    g.add_argument("--scene", help="INRIA .ply or .splat scene (default: random scenes of --gaussians sizes)")
    g.add_argument("--gaussians", type=_counts, default=None,
                   help="random scene sizes, comma-separated (default 100000,1000000,3000000 on CUDA, "
                        "1000,10000,30000 on CPU)")
    g.add_argument("--sh-degree", type=int, default=3, choices=(0, 1, 2, 3), help="random scene SH degree")
    g.add_argument("--size", type=size, default=None,
                   help=f"WIDTHxHEIGHT (default 1920x1080 on CUDA, 192x108 on CPU; {SIZE_LIMIT})")
    g.add_argument("--cameras", type=int, default=1, help="cameras rendered per call (batched)")
    g.add_argument("--tile-size", type=int, default=16)
    g.add_argument("--no-gsplat", action="store_true", help="don't run gsplat even when it is installed")
    g = p.add_argument_group("4dgs")
    g.add_argument("--scene4d", default=None,
                   help="fudan-zvg 4DGS checkpoint (default assets/scenes4d/bouncing_ball.pth; 'none' for "
                        "random scenes only)")
    g.add_argument("--gaussians4d", type=_counts, default=None,
                   help="random 4D scene sizes as well (SH 3, temporal degree 1), comma-separated "
                        "(default 100000 on CUDA, none on CPU)")
    g.add_argument("--size-4d", type=size, default=None,
                   help=f"WIDTHxHEIGHT (default 1352x1014 on CUDA, 135x101 on CPU; {SIZE_LIMIT})")
    g = p.add_argument_group("nerf")
    g.add_argument("--nerf", default=DEFAULT_NERF, help="NeRF directory (default assets/nerf/spheres)")
    g.add_argument("--size-nerf", type=size, default=None,
                   help=f"WIDTHxHEIGHT (default 800x800 on CUDA, 80x80 on CPU; {SIZE_LIMIT})")
    g.add_argument("--chunk-rays", type=int, default=1 << 14, help="rays marched together (default 16384)")
    g.add_argument("--interpreted-nerf", action="store_true",
                   help="on CPU, run the Triton NeRF through the interpreter too (minutes per frame)")
    g = p.add_argument_group("timing")
    g.add_argument("--backends", type=name_list(BACKENDS, "--backends"), default=list(BACKENDS),
                   help="comma-separated: torch, triton")
    g.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    g.add_argument("--warmup", type=int, default=None, help="untimed frames first (default 3 on CUDA, 1 on CPU)")
    g.add_argument("--iters", type=int, default=None, help="timed frames (default 20 on CUDA, 10 on CPU)")
    g.add_argument("--interpreted-iters", type=int, default=1,
                   help="frames rendered by interpreted Triton on CPU (default 1: the PSNR frame, timed once)")
    g.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default 1 when rendering on CPU: on a shared 2-core machine two "
                        "OpenMP threads measured up to 10x slower; torch's choice on CUDA)")
    g.add_argument("--available-mib", type=float, default=None,
                   help="memory to treat as free when checking that a scene fits (default: ask the device)")
    g.add_argument("--warmup-ms", type=float, default=25.0, help="CUDA: untimed frames for at least this long")
    g.add_argument("--rep-ms", type=float, default=100.0, help="CUDA: timed frames for at least this long")
    g.add_argument("--case-cap", type=float, default=None,
                   help="seconds one case may take, every backend included (default 120 on CUDA, 600 on a "
                        "CPU); a case over it is recorded as skipped and the run goes on")
    g.add_argument("--no-peaks", action="store_true", help="skip measuring the device's copy / matmul peaks")
    g.add_argument("--profile", action="store_true",
                   help="also profile 3 frames of each backend not interpreted (torch.profiler): the device's busy "
                        "share and the ops that take the time, in the JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny run (a smoke test, not a measurement)")
