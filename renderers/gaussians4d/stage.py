"""4DGS as a stream stage: a camera in, the scene at time ``t = pts`` out.

Ports are as in ``renderers/stages.py``. Input ``"camera"`` is ``float32 [2, 4, 4]`` on the CPU: the
world-to-camera matrix, then K. Output ``"video"`` is ``uint8 [H, W, 3]`` RGB on the CPU.
"""
from __future__ import annotations

import torch

from ..gaussians import TileCapacity
from ..stages import RenderStage
from . import rasterize_4d
from .scene import Gaussian4DScene, check_fits_4d


def scene_time(seconds: float, scene: Gaussian4DScene, *, time_scale: float = 1.0, loop: bool = True) -> float:
    """Scene time shown at stream time ``seconds``: ``t0 + seconds * time_scale``.

    With ``loop`` it is wrapped into ``[t0, t1)``. Else it is clamped to ``[t0, t1]``."""
    t0, t1 = scene.time_duration
    u = seconds * time_scale
    if loop:
        return t0 + u % (t1 - t0)
    return min(max(t0 + u, t0), t1)


class Gaussian4DRenderStage(RenderStage):
    """Renders a :class:`Gaussian4DScene` for each incoming camera, at the frame's time.

    The scene time of a frame is ``t0 + pts_seconds * time_scale``. It loops over the scene's
    ``time_duration``; see :func:`scene_time`. So a 2-second scene repeats every 2 s of stream.

    Args:
        scene: the 4D Gaussians. Moved to ``device`` at setup; refused first if they do not fit.
        background: RGB in [0, 1] behind the Gaussians.
        time_scale: scene time units per stream second. 1.0: the scene's units are seconds.
        loop: wrap time over the scene's duration. Else hold the last instant.
        sync_free: see :func:`~framegraph.renderers.stages.sync_free_on`.
        width / height / device / budget_ms: see :class:`~framegraph.renderers.stages.RenderStage`.
    """

    def __init__(self, scene: Gaussian4DScene, *, width: int, height: int, device: str = "cpu",
                 background=(0.0, 0.0, 0.0), time_scale: float = 1.0, loop: bool = True,
                 budget_ms: float | None = None, layers: bool = False, sync_free: bool | None = None,
                 name: str = "gaussians4d"):
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0 (scene time units per second), got {time_scale!r}")
        super().__init__(width=width, height=height, device=device, budget_ms=budget_ms, layers=layers,
                         sync_free=sync_free, name=name)
        self.scene = scene
        self.time_scale, self.loop = float(time_scale), loop
        self.background = torch.tensor(background, dtype=torch.float32)
        self.last_time: float | None = None  # scene time of the last rendered frame
        check_fits_4d(scene.n, self.device, scene.sh.shape[1])

    def prepare(self) -> None:
        self._scene = self.scene.to(self.device)
        self._args = self._scene.rasterize_args()
        self._bg = self.background.to(self.device)[None]
        self.tiles = TileCapacity() if self.sync_free else None  # fixed-capacity tile lists, or data-sized

    def render(self, view, K, t):
        t = scene_time(t, self._scene, time_scale=self.time_scale, loop=self.loop)
        colors, _, _ = rasterize_4d(**self._args, t=t, viewmats=view[None], Ks=K[None],
                                    width=self.width, height=self.height, backgrounds=self._bg,
                                    validate=False, tiles=self.tiles)  # the scene was checked once, at load
        self.last_time = t
        return colors[0]

    def render_layers(self, view, K, t):
        t = scene_time(t, self._scene, time_scale=self.time_scale, loop=self.loop)
        colors, alphas, _ = rasterize_4d(**self._args, t=t, viewmats=view[None], Ks=K[None], width=self.width,
                                         height=self.height, backgrounds=self._bg, render_mode="RGB+ED",
                                         validate=False, tiles=self.tiles)
        self.last_time = t
        return colors[0, ..., :3], colors[0, ..., 3], alphas[0, ..., 0]


__all__ = ["Gaussian4DRenderStage", "scene_time"]
