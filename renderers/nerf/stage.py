"""``NerfRenderStage``: a NeRF as a stream stage (camera in, RGB frame out).

Input ``"camera"``: ``float32 [2, 4, 4]`` on the CPU, as produced by
:class:`framegraph.renderers.stages.CameraSource` (``camera[0]`` world-to-camera, OpenCV;
``camera[1, :3, :3]`` the intrinsics K in pixels). Output ``"video"``: ``uint8 [H, W, 3]`` RGB on the
CPU. Rendering happens on the stage's ``device`` (Triton kernels on CUDA, the torch reference on CPU).
"""
from __future__ import annotations

import os
from typing import Union

import torch

from framegraph.kernels.backend import Backend
from framegraph.stream import PortSpec, Stage

from ..stages import CAMERA_PORT
from .marcher import EARLY_STOP
from .model import NerfModel, load_nerf


class NerfRenderStage(Stage):
    """Renders a :class:`NerfModel` for each incoming camera.

    Args:
        model: the NeRF, or a NeRF directory (loaded with :func:`load_nerf`).
        width / height: output size in pixels (the camera's K must be for this size).
        device: where to render.
        backend: ``"auto"`` (Triton on CUDA), ``"triton"`` or ``"torch"``.
        chunk_rays: rays marched together (bounds memory).
        early_stop: transmittance at which rays terminate (see ``marcher.py``).
        budget_ms: per-frame budget (deadline misses are counted).
    """

    def __init__(self, model: Union[NerfModel, str, os.PathLike], *, width: int, height: int, device: str = "cpu",
                 backend: Backend = "auto", chunk_rays: int = 1 << 14, early_stop: float = EARLY_STOP,
                 budget_ms: float | None = None, name: str = "nerf"):
        super().__init__(name)
        self.model = model if isinstance(model, NerfModel) else load_nerf(model)
        self.width, self.height = width, height
        self.device = str(torch.device(device))
        self.backend, self.chunk_rays, self.early_stop = backend, chunk_rays, early_stop
        self.budget_ms = budget_ms
        self.inputs = {"camera": CAMERA_PORT}
        self.outputs = {"video": PortSpec((height, width, 3), torch.uint8, "cpu")}

    def setup(self, ctx):
        super().setup(ctx)
        self._model = self.model.to(self.device).eval()

    @torch.no_grad()
    def process(self, inputs, out):
        cam = inputs["camera"].data
        rgb = self._model.render(cam[0], cam[1, :3, :3], self.width, self.height, backend=self.backend,
                                 chunk_rays=self.chunk_rays, early_stop=self.early_stop)
        frame = out.write("video")
        frame.data.copy_((rgb.clamp(0, 1) * 255 + 0.5).to(torch.uint8))


def orbit_for_nerf(model: NerfModel, n_frames: int, width: int, height: int, fps: float,
                   elevation_deg: float = 25.0, fov_deg: float = 45.0):
    """An orbit around the centre of the model's AABB at 1.75× its half-diagonal (z up)."""
    from ..cameras import orbit_path

    aabb = torch.tensor(model.config.aabb, dtype=torch.float64)
    center = (aabb[:3] + aabb[3:]) / 2
    radius = 1.75 * float((aabb[3:] - aabb[:3]).norm() / 2)
    return orbit_path(center, radius, n_frames, elevation_deg, fov_deg=fov_deg, width=width, height=height, fps=fps)
