"""The NeRF model's command-line options: :func:`add_model_arguments` and :func:`config_from_args`.

``framegraph fit-nerf`` (``apps/fit_nerf.py``) and the demo trainer (``demo.py``) build their model from them.
"""
from __future__ import annotations

import argparse

import torch

from .hash_encoding import HashGridConfig
from .model import NerfConfig


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
