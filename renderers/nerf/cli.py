"""``framegraph fit-nerf``: train a NeRF directory from a ``transforms.json`` (instant-ngp / nerfstudio).

``add_arguments`` and ``run`` are the command (``apps/cli.py`` lists it); ``framegraph fit`` fits Gaussians
instead (``apps/fit.py``). The result renders with ``framegraph render --scene OUT_DIR``.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from .dataset import load_transforms
from .fit import fit, psnr
from .hash_encoding import HashGridConfig
from .model import NerfConfig, NerfModel

# Default sizes per device. CUDA keeps instant-ngp's; the CPU ones were chosen by measurement on a real capture
# at --downscale 8 (``framegraph bench nerf_fit``, benchmarks/results/cpu/nerf_fit_fox.json): fewer levels, a
# smaller table and finest grid (images of ~240 px do not resolve more), a 64^3 occupancy grid (a full warm-up
# update is 262k density queries instead of 2M) and 128 steps across the box diagonal; the occupancy EMA
# decays faster (0.8 per update instead of 0.95) so that, in a fit of ~1000 steps rather than instant-ngp's
# 30k, cells the density has left empty are skipped after a few updates rather than after ~30.
DEVICE_DEFAULTS = {
    "cuda": {"steps": 2000, "batch_rays": 4096, "levels": 16, "log2_table": 19, "finest": 2048, "occupancy": 128,
             "steps_per_diagonal": 512, "occupancy_decay": 0.95},
    "cpu": {"steps": 400, "batch_rays": 2048, "levels": 8, "log2_table": 17, "finest": 256, "occupancy": 64,
            "steps_per_diagonal": 192, "occupancy_decay": 0.8},
}


def device_defaults(device) -> dict:
    """The default sizes of :data:`DEVICE_DEFAULTS` for ``device`` (``"cuda"`` for any CUDA device, else CPU)."""
    return dict(DEVICE_DEFAULTS["cuda" if torch.device(device).type == "cuda" else "cpu"])


def resolve_defaults(args: argparse.Namespace, device) -> argparse.Namespace:
    """Fill the options left unset (None) with ``device``'s defaults, in place; returns ``args``."""
    for key, value in device_defaults(device).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def _per_device(key: str) -> str:
    cpu, cuda = DEVICE_DEFAULTS["cpu"][key], DEVICE_DEFAULTS["cuda"][key]
    return f"default {cpu} on CPU, {cuda} on CUDA"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("transforms", help="transforms.json (camera-to-world OpenGL poses; images relative to it)")
    p.add_argument("--out", required=True, help="output NeRF directory (config.json + model.safetensors)")
    p.add_argument("--steps", type=int, help=f"optimisation steps ({_per_device('steps')})")
    p.add_argument("--batch-rays", type=int, help=f"rays per step ({_per_device('batch_rays')})")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    p.add_argument("--loss", choices=["huber", "mse"], default="huber")
    p.add_argument("--downscale", type=int, default=1, help="shrink images by this integer factor first")
    p.add_argument("--hold-out", type=int, default=8,
                   help="keep every N-th frame out of training to measure PSNR (0: train on all; default 8)")
    p.add_argument("--aabb", type=float, nargs=6, metavar=("XMIN", "YMIN", "ZMIN", "XMAX", "YMAX", "ZMAX"),
                   help="scene box in world units (default: a cube around the cameras' centroid)")
    p.add_argument("--background", type=float, nargs=3, default=(1.0, 1.0, 1.0), metavar=("R", "G", "B"),
                   help="colour behind the scene and under transparent pixels (default white)")
    add_model_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda or cpu (default cuda when available)")


def add_model_arguments(p: argparse.ArgumentParser, *, levels: int | None = None, log2_table: int | None = None,
                        finest: int | None = None, occupancy: int | None = None,
                        steps_per_diagonal: int | None = None) -> None:
    """The model's size options (hash grid, occupancy grid, marching step), read back by :func:`config_from_args`.

    A default given here is fixed; one left None is the device's (:func:`resolve_defaults`, run by the command)."""

    def helptext(what: str, key: str, value) -> str:
        return f"{what} (default {value})" if value is not None else f"{what} ({_per_device(key)})"

    p.add_argument("--levels", type=int, default=levels, help=helptext("hash grid levels", "levels", levels))
    p.add_argument("--log2-table", type=int, default=log2_table,
                   help=helptext("log2 entries per hashed level", "log2_table", log2_table))
    p.add_argument("--finest", type=int, default=finest,
                   help=helptext("finest grid resolution", "finest", finest))
    p.add_argument("--occupancy", type=int, default=occupancy,
                   help=helptext("occupancy grid resolution", "occupancy", occupancy))
    p.add_argument("--steps-per-diagonal", type=int, default=steps_per_diagonal,
                   help=helptext("marching steps across the box diagonal", "steps_per_diagonal", steps_per_diagonal))


def config_from_args(args: argparse.Namespace, aabb, background, **options) -> NerfConfig:
    """The :class:`NerfConfig` of :func:`add_model_arguments`' options for the scene box ``aabb`` (6 numbers)
    and ``background`` (RGB); ``options``: other NerfConfig fields."""
    diag = float((torch.tensor(aabb[3:]) - torch.tensor(aabb[:3])).norm())
    grid = HashGridConfig(n_levels=args.levels, log2_table_size=args.log2_table, finest_resolution=args.finest)
    return NerfConfig(aabb=aabb, grid=grid, step_size=diag / args.steps_per_diagonal, background=background,
                      occupancy_resolution=args.occupancy, **options)


def run(args: argparse.Namespace) -> int:

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    resolve_defaults(args, device)
    data = load_transforms(args.transforms, downscale=args.downscale, background=args.background)
    n = data.images.shape[0]
    test = [i for i in range(n) if args.hold_out and i % args.hold_out == 0 and n > 1]
    train = [i for i in range(n) if i not in test]
    config = config_from_args(args, args.aabb or data.suggested_aabb(), args.background,
                              occupancy_decay=args.occupancy_decay)
    model = NerfModel(config, seed=args.seed, device=device)
    report = fit(model, data.images[train], data.viewmats[train], data.Ks[train], steps=args.steps,
                 batch_rays=args.batch_rays, lr=args.lr, loss=args.loss, seed=args.seed,
                 log_every=max(1, args.steps // 20))
    H, W = data.images.shape[1:3]
    scores = []
    with torch.no_grad():
        for i in test:
            scores.append(psnr(model.render(data.viewmats[i], data.Ks[i], W, H).cpu(), data.images[i]))
    model.save(args.out)
    summary = {"out": args.out, "train_frames": len(train), "held_out_frames": len(test),
               "steps": args.steps, "train_wall_s": round(report.wall_s, 1),
               "held_out_psnr_mean_db": round(sum(scores) / len(scores), 2) if scores else None,
               "device": device}
    print(json.dumps(summary, indent=2), file=sys.stderr)
    return 0
