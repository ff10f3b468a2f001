"""3D Gaussian splatting: render INRIA / gsplat scenes with the semantics of gsplat.

Public API:

- :func:`rasterize` — project, colour and blend Gaussians into a batch of
  cameras (Triton kernels on CUDA, the readable torch reference elsewhere).
- :class:`GaussianScene`, :func:`load_ply`, :func:`save_ply`, :func:`load_splat`,
  :func:`load_scene`, :func:`check_fits` — scenes in the formats users have.

``reference.py`` is the pure-torch twin of every step; ``triton.py`` holds the
kernels; ``io.py`` the file formats.
"""
from .io import load_ply, load_scene, load_splat, save_ply
from .rasterization import RENDER_MODES, rasterize
from .scene import GaussianScene, SceneError, SceneTooLargeError, check_fits, random_scene

__all__ = [
    "rasterize",
    "RENDER_MODES",
    "GaussianScene",
    "SceneError",
    "SceneTooLargeError",
    "check_fits",
    "random_scene",
    "load_ply",
    "save_ply",
    "load_splat",
    "load_scene",
]
