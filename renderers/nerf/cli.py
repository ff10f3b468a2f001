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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("transforms", help="transforms.json (camera-to-world OpenGL poses; images relative to it)")
    p.add_argument("--out", required=True, help="output NeRF directory (config.json + model.safetensors)")
    p.add_argument("--steps", type=int, default=2000, help="optimisation steps (default 2000)")
    p.add_argument("--batch-rays", type=int, default=4096, help="rays per step (default 4096)")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    p.add_argument("--loss", choices=["huber", "mse"], default="huber")
    p.add_argument("--downscale", type=int, default=1, help="shrink images by this integer factor first")
    p.add_argument("--hold-out", type=int, default=8,
                   help="keep every N-th frame out of training to measure PSNR (0: train on all; default 8)")
    p.add_argument("--aabb", type=float, nargs=6, metavar=("XMIN", "YMIN", "ZMIN", "XMAX", "YMAX", "ZMAX"),
                   help="scene box in world units (default: a cube around the cameras' centroid)")
    p.add_argument("--background", type=float, nargs=3, default=(1.0, 1.0, 1.0), metavar=("R", "G", "B"),
                   help="colour behind the scene and under transparent pixels (default white)")
    add_model_arguments(p, log2_table=19, finest=2048, occupancy=128, steps_per_diagonal=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda or cpu (default cuda when available)")


def add_model_arguments(p: argparse.ArgumentParser, *, log2_table: int, finest: int, occupancy: int,
                        steps_per_diagonal: int) -> None:
    """The model's size options (hash grid, occupancy grid, marching step), with these defaults; read back by
    :func:`config_from_args`."""
    p.add_argument("--levels", type=int, default=16, help="hash grid levels (default 16)")
    p.add_argument("--log2-table", type=int, default=log2_table,
                   help=f"log2 entries per hashed level (default {log2_table})")
    p.add_argument("--finest", type=int, default=finest, help=f"finest grid resolution (default {finest})")
    p.add_argument("--occupancy", type=int, default=occupancy,
                   help=f"occupancy grid resolution (default {occupancy})")
    p.add_argument("--steps-per-diagonal", type=int, default=steps_per_diagonal,
                   help=f"marching steps across the box diagonal (default {steps_per_diagonal})")


def config_from_args(args: argparse.Namespace, aabb, background, **options) -> NerfConfig:
    """The :class:`NerfConfig` of :func:`add_model_arguments`' options for the scene box ``aabb`` (6 numbers)
    and ``background`` (RGB); ``options``: other NerfConfig fields."""
    diag = float((torch.tensor(aabb[3:]) - torch.tensor(aabb[:3])).norm())
    grid = HashGridConfig(n_levels=args.levels, log2_table_size=args.log2_table, finest_resolution=args.finest)
    return NerfConfig(aabb=aabb, grid=grid, step_size=diag / args.steps_per_diagonal, background=background,
                      occupancy_resolution=args.occupancy, **options)


def run(args: argparse.Namespace) -> int:

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    data = load_transforms(args.transforms, downscale=args.downscale, background=args.background)
    n = data.images.shape[0]
    test = [i for i in range(n) if args.hold_out and i % args.hold_out == 0 and n > 1]
    train = [i for i in range(n) if i not in test]
    config = config_from_args(args, args.aabb or data.suggested_aabb(), args.background)
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
