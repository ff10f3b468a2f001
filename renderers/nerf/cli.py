"""The NeRF model's command-line options: :func:`add_model_arguments` and :func:`config_from_args`.

The options are declared, torch-free, in ``renderers/nerf_options.py``. ``framegraph fit-nerf``, in
``apps/fit_nerf.py``, builds its model from them. So does the demo trainer, ``demo.py``.
"""
from __future__ import annotations

import argparse

import torch

from ..nerf_options import DEVICE_DEFAULTS, add_model_arguments, device_defaults, per_device_help, resolve_defaults
from .hash_encoding import HashGridConfig
from .model import NerfConfig

__all__ = ["DEVICE_DEFAULTS", "add_model_arguments", "config_from_args", "device_defaults", "per_device_help",
           "resolve_defaults"]

def config_from_args(args: argparse.Namespace, aabb, background, **options) -> NerfConfig:
    """The :class:`NerfConfig` of :func:`add_model_arguments`' options.

    ``aabb`` is the scene box, 6 numbers. ``background`` is RGB. ``options`` are other NerfConfig fields."""
    diag = float((torch.tensor(aabb[3:]) - torch.tensor(aabb[:3])).norm())
    grid = HashGridConfig(n_levels=args.levels, log2_table_size=args.log2_table, finest_resolution=args.finest)
    return NerfConfig(aabb=aabb, grid=grid, step_size=diag / args.steps_per_diagonal, background=background,
                      occupancy_resolution=args.occupancy, **options)
