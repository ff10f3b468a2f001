"""``open_scene(path)``: any scene file a user has, ready to render. One door for the CLI, the benches and the
server.

    scene = open_scene("assets/scenes4d/bouncing_ball.pth")        # or a .ply / .splat, or a NeRF folder
    stage = scene.render_stage(width=640, height=360, device="cpu")  # a RenderStage
    path = scene.framing.orbit(n_frames=125, width=640, height=360, fps=25)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch

from .gaussians import GaussianScene, load_scene
from .gaussians4d import Gaussian4DRenderStage, Gaussian4DScene, load_checkpoint
from .nerf import NerfModel, load_nerf
from .nerf.stage import NerfRenderStage, framing_for_nerf
from .stages import Framing, GaussianRenderStage, RenderStage, framing_for_points

SceneKind = Literal["3dgs", "4dgs", "nerf"]
SCENE_SUFFIXES = (".ply", ".splat", ".pth")


class SceneFile(Protocol):
    """A loaded scene of any kind. It says what it is, how an orbit frames it, and makes render stages.

    It makes as many stages as there are graphs, one per session. One class per kind implements it."""

    path: str
    kind: SceneKind
    framing: Framing

    @property
    def size(self) -> int:
        """Gaussians in the scene. 0 for a NeRF."""

    def render_stage(self, *, width: int, height: int, device: str = "cpu", background=(0.0, 0.0, 0.0),
                     budget_ms: float | None = None, time_scale: float = 1.0, layers: bool = False,
                     sync_free: bool | None = None) -> RenderStage:
        """A render stage for this scene, a :class:`~.stages.RenderStage`.

        ``layers``: it also sends depth, opacity and its camera. ``sync_free``: see :func:`~.stages.sync_free_on`.
        ``time_scale``: a 4DGS scene plays at ``t`` = the frame's stream time × it, looping."""

    def background(self, asked=(0.0, 0.0, 0.0)) -> tuple[float, float, float]:
        """The colour behind the scene in its pictures, RGB in [0, 1]. ``asked``, or a NeRF's own."""

    def bounds(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """The scene's box ``(lo, hi)`` in world units."""


@dataclass
class GaussianSceneFile:
    """A 3DGS scene, ``.ply`` or ``.splat``: a :class:`SceneFile`."""

    path: str
    data: GaussianScene
    framing: Framing
    kind: SceneKind = "3dgs"

    @property
    def size(self) -> int:
        return self.data.n

    def render_stage(self, *, width: int, height: int, device: str = "cpu", background=(0.0, 0.0, 0.0),
                     budget_ms: float | None = None, time_scale: float = 1.0, layers: bool = False,
                     sync_free: bool | None = None) -> RenderStage:
        return GaussianRenderStage(self.data, width=width, height=height, device=device, background=background,
                                   budget_ms=budget_ms, layers=layers, sync_free=sync_free)

    def background(self, asked=(0.0, 0.0, 0.0)) -> tuple[float, float, float]:
        return tuple(float(v) for v in asked)

    def bounds(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """The box holding 99 % of the centres along each axis, grown by 10 % of its size on each side.

        It spans the 0.5 to 99.5 % quantiles, so a few stray splats do not stretch it."""
        means = self.data.means.detach().to("cpu", torch.float64)
        lo, hi = torch.quantile(means, 0.005, dim=0), torch.quantile(means, 0.995, dim=0)
        margin = 0.1 * (hi - lo).clamp_min(1e-3)
        return tuple((lo - margin).tolist()), tuple((hi + margin).tolist())


@dataclass
class Gaussian4DSceneFile(GaussianSceneFile):
    """A 4DGS checkpoint, ``.pth``, played at the frame's stream time: a :class:`SceneFile`."""

    data: Gaussian4DScene
    kind: SceneKind = "4dgs"

    def render_stage(self, *, width: int, height: int, device: str = "cpu", background=(0.0, 0.0, 0.0),
                     budget_ms: float | None = None, time_scale: float = 1.0, layers: bool = False,
                     sync_free: bool | None = None) -> RenderStage:
        return Gaussian4DRenderStage(self.data, width=width, height=height, device=device, layers=layers,
                                     background=background, time_scale=time_scale, budget_ms=budget_ms,
                                     sync_free=sync_free)


@dataclass
class NerfSceneFile:
    """A NeRF folder, drawing its own background: :class:`SceneFile`."""

    path: str
    data: NerfModel
    framing: Framing
    kind: SceneKind = "nerf"

    @property
    def size(self) -> int:
        return 0

    def render_stage(self, *, width: int, height: int, device: str = "cpu", background=(0.0, 0.0, 0.0),
                     budget_ms: float | None = None, time_scale: float = 1.0, layers: bool = False,
                     sync_free: bool | None = None) -> RenderStage:
        return NerfRenderStage(self.data, width=width, height=height, device=device, budget_ms=budget_ms,
                               layers=layers, sync_free=sync_free)

    def background(self, asked=(0.0, 0.0, 0.0)) -> tuple[float, float, float]:
        return tuple(float(v) for v in self.data.config.background)

    def bounds(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """The NeRF's AABB."""
        aabb = [float(v) for v in self.data.config.aabb]
        return tuple(aabb[:3]), tuple(aabb[3:])


def scene_kind(path: str | os.PathLike) -> SceneKind:
    """What a path holds, by its form. A folder is a NeRF, ``.pth`` a 4DGS checkpoint, ``.ply`` or
    ``.splat`` 3D Gaussians. Raises ``ValueError`` for anything else, ``FileNotFoundError`` when missing."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"scene {str(path)!r} does not exist")
    if p.is_dir():
        return "nerf"
    suffix = p.suffix.lower()
    if suffix == ".pth":
        return "4dgs"
    if suffix in (".ply", ".splat"):
        return "3dgs"
    raise ValueError(f"scene {str(path)!r}: expected a 3DGS .ply / .splat file, a 4DGS .pth checkpoint or a "
                     f"NeRF folder, got a {suffix or 'suffix-less'} file")


def open_scene(path: str | os.PathLike, *, time_duration: tuple[float, float] | None = None) -> SceneFile:
    """Load the scene at ``path``; :func:`scene_kind` says how. ``time_duration``: a 4DGS scene's time span
    when its checkpoint has no sidecar. The fudan-zvg code keeps it in the training config."""
    kind = scene_kind(path)
    if time_duration is not None and kind != "4dgs":
        raise ValueError(f"scene {str(path)!r}: a time duration (--time-duration) goes with a 4DGS checkpoint "
                         f"(.pth), not a {kind} scene")
    if kind == "nerf":
        model = load_nerf(path)
        return NerfSceneFile(str(path), model, framing_for_nerf(model))
    if kind == "4dgs":
        data = load_checkpoint(path, time_duration=time_duration)
        return Gaussian4DSceneFile(str(path), data, framing_for_points(data.means))
    data = load_scene(path)
    return GaussianSceneFile(str(path), data, framing_for_points(data.means))


__all__ = ["SCENE_SUFFIXES", "SceneFile", "SceneKind", "GaussianSceneFile", "Gaussian4DSceneFile", "NerfSceneFile",
           "open_scene", "scene_kind"]
