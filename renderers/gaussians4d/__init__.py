"""4D Gaussian splatting: dynamic scenes with the semantics of fudan-zvg's 4DGS (ICLR 2024).

Each Gaussian lives in (x, y, z, t): a 4D mean, 4 scales and a 4D rotation made of a left and a
right quaternion. To render time ``t`` every Gaussian is *sliced*: conditioned on ``t`` it is a 3D
Gaussian (moved along its space-time tilt, shrunk to the Schur complement, faded by its temporal
marginal), which the 3DGS pipeline then projects and blends.

Public API:

- :func:`rasterize_4d` — slice at ``t``, colour (SH x temporal cosines), project, blend
  (Triton slice + Triton blending on CUDA, the readable torch reference elsewhere).
- :class:`Gaussian4DScene`, :func:`random_scene_4d` — activated parameters in memory.
- :func:`load_checkpoint`, :func:`save_checkpoint` — fudan-zvg ``chkpnt*.pth`` files.
- :class:`Gaussian4DRenderStage` (in ``stage.py``) — camera in, frame at ``t = pts`` out.
- :class:`Fitter4D` (in ``fit.py``) — fits 4D Gaussians to multi-view video.
- ``python -m framegraph.renderers.gaussians4d.demo`` — fits the shipped demo scene to its procedural
  ground truth.

``reference.py`` is the pure-torch twin of every step; ``triton.py`` holds the slice kernel.
"""
from .io import CheckpointError, load_checkpoint, save_checkpoint
from .rasterization import RENDER_MODES, rasterize_4d
from .reference import CULL_THRESHOLD
from .scene import Gaussian4DScene, check_fits_4d, random_scene_4d
from .stage import Gaussian4DRenderStage, scene_time

__all__ = [
    "rasterize_4d",
    "RENDER_MODES",
    "CULL_THRESHOLD",
    "Gaussian4DScene",
    "random_scene_4d",
    "check_fits_4d",
    "load_checkpoint",
    "save_checkpoint",
    "CheckpointError",
    "Gaussian4DRenderStage",
    "scene_time",
]
