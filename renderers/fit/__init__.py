"""Fit 3D Gaussians to posed images: the 3DGS training recipe on framegraph's rasterizer.

- :class:`Fitter`, :class:`FitConfig`: the optimisation loop, checkpoints and resume. In ``trainer.py``.
- :class:`TrainingRun`: the loop every fit shares, the NeRF fit too. Progress bar, checkpoint files, Ctrl-C.
  In ``loop.py``.
- :class:`DensifyConfig`: the clone, split, prune and opacity-reset schedule. In ``densify.py``.
- :func:`ssim`, :func:`fit_loss`: image losses, in ``losses.py``. PSNR is :func:`framegraph.stream.quality.psnr`.
- :class:`PosedImages`, :func:`load_transforms`, :func:`synthetic_dataset`: data, in ``data.py``. The
  ``transforms.json`` loader is the shared one in ``renderers/posed_images.py``.
- ``params.py``: parameter layout, initialisation and conversion to :class:`GaussianScene`.
"""
from .data import DatasetError, PosedImages, load_transforms, synthetic_dataset
from .densify import DensifyConfig
from .loop import TrainingRun
from .losses import fit_loss, ssim
from .params import init_params, params_to_scene, scene_to_params
from .trainer import CheckpointError, FitConfig, Fitter, focus_bounds, scene_scale_of

__all__ = ["Fitter", "FitConfig", "TrainingRun", "DensifyConfig", "CheckpointError", "PosedImages", "DatasetError",
           "load_transforms", "synthetic_dataset", "ssim", "fit_loss", "init_params",
           "params_to_scene", "scene_to_params", "focus_bounds", "scene_scale_of"]
