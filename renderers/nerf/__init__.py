"""NeRF in the instant-ngp style, after Müller et al. 2022: a hash grid, tiny MLPs, an occupancy-skipping marcher.

Public API:

- :class:`NerfModel`, :class:`NerfConfig`, :func:`load_nerf`, :class:`NerfLoadError`: the model, its settings,
  and the on-disk directory. That holds ``config.json`` and ``model.safetensors``.
- :func:`fit`: train on posed images. It is measured with :func:`framegraph.stream.quality.psnr`.
- :class:`NerfFitter`, :class:`NerfFitConfig`: the same fit step by step on the shared loop. It has
  checkpoints and exact resume.
- :func:`load_transforms`: posed images from an instant-ngp, nerfstudio or Blender ``transforms.json``. It is
  the shared loader of ``renderers/posed_images.py``, with a white background by default.
- ``cli.py``: the model's command-line options. ``framegraph fit-nerf`` is ``apps/fit_nerf.py``.
- :class:`NerfRenderStage`, in ``stage.py``: a render stage for stream graphs.
- Building blocks: :func:`hash_encode` and :class:`HashGridConfig` in ``hash_encoding/``. :func:`mlp` in
  ``mlp/``. :class:`OccupancyGrid`, :func:`render_rays` and :func:`camera_rays` in ``marcher.py``.
  :class:`NerfField`. :class:`SphereScene` renders analytic training images.

Each kernel folder has ``reference.py``, pure torch, beside ``triton.py``. ``backend="auto"`` picks Triton on
CUDA and the reference elsewhere.
"""
from .dataset import DatasetError, PosedImages, load_transforms
from .field import NerfField, sh_encode, trunc_exp
from .fit import FitReport, NerfFitConfig, NerfFitter, dataset_rays, fit
from .hash_encoding import HashGridConfig, hash_encode
from .marcher import EARLY_STOP, MarchCapacity, RenderResult, camera_rays, ray_aabb, render_rays
from .mlp import mlp
from .model import NerfConfig, NerfLoadError, NerfModel, is_nerf_dir, load_nerf
from .occupancy import OccupancyGrid
from .spheres import Sphere, SphereScene, demo_scene, sphere_views

__all__ = [
    "NerfModel", "NerfConfig", "NerfLoadError", "load_nerf", "is_nerf_dir", "load_transforms", "PosedImages",
    "DatasetError", "fit", "FitReport", "NerfFitter", "NerfFitConfig", "dataset_rays",
    "NerfField", "sh_encode", "trunc_exp", "HashGridConfig", "hash_encode", "mlp", "OccupancyGrid",
    "render_rays", "camera_rays", "ray_aabb", "RenderResult", "EARLY_STOP", "MarchCapacity",
    "Sphere", "SphereScene", "demo_scene", "sphere_views",
]
