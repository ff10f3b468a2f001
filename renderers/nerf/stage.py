"""``NerfRenderStage``: a NeRF as a stream stage. A camera comes in, an RGB frame goes out.

Input ``"camera"`` is ``float32 [2, 4, 4]`` on the CPU, as :class:`framegraph.renderers.stages.CameraSource`
produces it. ``camera[0]`` is world-to-camera, OpenCV. ``camera[1, :3, :3]`` is the intrinsics K in pixels.
Output ``"video"`` is ``uint8 [H, W, 3]`` RGB on the CPU. Rendering happens on the stage's ``device``. That is
the Triton kernels on CUDA and the torch reference on CPU.
"""
from __future__ import annotations

import os

import torch

from framegraph.kernels.backend import Backend

from ..stages import Framing, RenderStage
from .marcher import EARLY_STOP
from .model import NerfModel, load_nerf


class NerfRenderStage(RenderStage):
    """Renders a :class:`NerfModel` for each incoming camera.

    Args:
        model: the NeRF, or a NeRF directory loaded with :func:`load_nerf`.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. Auto is Triton on CUDA.
        chunk_rays: rays marched together. It bounds memory.
        early_stop: transmittance at which rays terminate; see ``marcher.py``.
        sync_free: see :func:`~framegraph.renderers.stages.sync_free_on`. The sync-free march keeps a
            :class:`~.marcher.MarchCapacity` across frames.
        width / height / device / budget_ms: see :class:`~framegraph.renderers.stages.RenderStage`.
    """

    def __init__(self, model: NerfModel | str | os.PathLike, *, width: int, height: int, device: str = "cpu",
                 backend: Backend = "auto", chunk_rays: int = 1 << 14, early_stop: float = EARLY_STOP,
                 budget_ms: float | None = None, layers: bool = False, sync_free: bool | None = None,
                 name: str = "nerf"):
        super().__init__(width=width, height=height, device=device, budget_ms=budget_ms, layers=layers,
                         sync_free=sync_free, name=name)
        self.model = model if isinstance(model, NerfModel) else load_nerf(model)
        self.backend, self.chunk_rays, self.early_stop = backend, chunk_rays, early_stop

    def prepare(self) -> None:
        self._model = self.model.to(self.device).eval()
        self.march = self._model.march_capacity() if self.sync_free else None

    def render(self, view, K, t):
        return self._model.render(view, K, self.width, self.height, backend=self.backend,
                                  chunk_rays=self.chunk_rays, early_stop=self.early_stop, capacity=self.march)

    def render_layers(self, view, K, t):
        return self._model.render_layers(view, K, self.width, self.height, backend=self.backend,
                                         chunk_rays=self.chunk_rays, early_stop=self.early_stop,
                                         capacity=self.march)


def framing_for_nerf(model: NerfModel, elevation_deg: float = 25.0, fov_deg: float = 45.0) -> Framing:
    """Frames a NeRF around the centre of its AABB, at 1.75× its half-diagonal. Z is up."""
    aabb = torch.tensor(model.config.aabb, dtype=torch.float64)
    center = (aabb[:3] + aabb[3:]) / 2
    radius = 1.75 * float((aabb[3:] - aabb[:3]).norm() / 2)
    return Framing(tuple(float(c) for c in center), radius, elevation_deg, fov_deg)


def orbit_for_nerf(model: NerfModel, n_frames: int, width: int, height: int, fps: float,
                   elevation_deg: float = 25.0, fov_deg: float = 45.0):
    """An orbit that frames the NeRF; see :func:`framing_for_nerf`."""
    return framing_for_nerf(model, elevation_deg, fov_deg).orbit(n_frames, width, height, fps)
