"""Renderers as stream stages: a camera source, the render stage every renderer builds on, the 3DGS one.

Cameras travel on a ``"camera"`` port, ``float32 [2, 4, 4]`` on the CPU. ``camera[0]`` is the world-to-camera
matrix. It is OpenCV's: x right, y down, z forward. ``camera[1, :3, :3]`` is the intrinsics K in pixels. Rendered
frames leave as ``uint8 [H, W, 3]`` RGB on the CPU, ready for an encoder.

A render stage made with ``layers=True`` sends more. A compositor needs it to put something else into the
picture; see :mod:`.billboard`. All of it is in the same frame as the picture.

- ``"depth"`` ``float32 [H, W]``: the expected camera-z depth of what each pixel shows. It is ``Σ wᵢ zᵢ / Σ wᵢ``,
  the 3DGS ``RGB+ED`` mode. It is 0 where nothing is.
- ``"opacity"`` ``float32 [H, W]``: how much of the pixel the scene covers, ``1 − T``. The rest is the background
  colour.
- ``"camera"``: the camera it rendered from.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from framegraph.stream import IndexedSource, PortSpec, Stage

from .cameras import CameraPath, camera_centers, intrinsics, orbit_path
from .gaussians import GaussianScene, TileCapacity, check_fits, rasterize

CAMERA_PORT = PortSpec((2, 4, 4), torch.float32, "cpu")


def pack_camera(viewmat: torch.Tensor, K: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``viewmat [4, 4]`` and ``K [3, 3]`` → the ``camera`` port layout ``[2, 4, 4]``."""
    out = torch.zeros(2, 4, 4) if out is None else out
    out[0] = viewmat
    out[1].zero_()
    out[1, :3, :3] = K
    return out


class CameraSource(IndexedSource):
    """Source of cameras at ``fps``.

    With a :class:`CameraPath`, it plays ``n_frames`` of its frames, looping if the path is shorter. With
    ``path`` None, it plays live poses pushed with :meth:`push_pose`. Each frame uses the newest pose. These
    are ``latest`` semantics: a fast client never queues.

    Args:
        path: the cameras to play, or None for pushed poses.
        fps: frame rate. pts come from the frame index.
        n_frames: frames to emit. Default ``len(path)``. Pushed poses need it, unless live forever.
        K / width / height: intrinsics for pushed poses. Default: 50° horizontal fov.
    """

    def __init__(self, path: CameraPath | None = None, *, fps: float = 30.0, n_frames: int | None = None,
                 width: int | None = None, height: int | None = None, K: torch.Tensor | None = None,
                 initial_pose: torch.Tensor | None = None, name: str = "camera"):
        super().__init__(name, fps=fps,
                         n_frames=n_frames if n_frames is not None else (len(path) if path is not None else None))
        if path is None and initial_pose is None:
            raise ValueError("CameraSource: give a camera path, or an initial_pose for pushed poses")
        self.path = path
        self.width = width or (path.width if path is not None else 640)
        self.height = height or (path.height if path is not None else 480)
        self.K = K if K is not None else intrinsics(self.width, self.height, fov_deg=50.0)
        self._pose = initial_pose.to(torch.float32).clone() if initial_pose is not None else None
        self._lock = threading.Lock()
        self.outputs = {"camera": CAMERA_PORT}
        self.poses_pushed = 0

    def push_pose(self, viewmat) -> None:
        """Set the live pose, ``[4, 4]`` world-to-camera in OpenCV axes. Safe from any thread."""
        v = torch.as_tensor(viewmat, dtype=torch.float32)
        if v.shape != (4, 4) or not torch.isfinite(v).all():
            raise ValueError(f"pose must be a finite 4x4 world-to-camera matrix, got shape {list(v.shape)}")
        with self._lock:
            self._pose = v.clone()
            self.poses_pushed += 1

    def emit(self, out):
        frame = out.write("camera")
        if self.path is not None:
            view, K = self.path[self.index % len(self.path)]
        else:
            with self._lock:
                view = self._pose.clone()
            K = self.K
        pack_camera(view, K, frame.data)
        return frame


def sync_free_on(device: str | torch.device, asked: bool | None) -> bool:
    """Whether a render stage on ``device`` runs its sync-free path.

    That path uses fixed-shape work lists: no host sync in a steady-state frame. ``asked`` None: on a GPU only.
    There a host read waits for the device. On a CPU a read costs nothing and the data-sized path is faster.
    ``asked`` True: everywhere. The launch audit counts the GPU path on a CPU this way."""
    return torch.device(device).type != "cpu" if asked is None else bool(asked)


class RenderStage(Stage):
    """Base of every renderer stage. A ``"camera"`` comes in (:data:`CAMERA_PORT`); an RGB ``"video"`` frame
    goes out, ``uint8 [height, width, 3]`` on the CPU.

    A subclass says how to get its scene onto the device: :meth:`prepare`, once, in the stage's thread. It says
    how to draw one view: :meth:`render`. The base does the ports, the device, the frame's time and the
    conversion to 8-bit.

    Args:
        width / height: output size in pixels. The camera's K must be for this size.
        device: where to render. ``"cuda"`` runs the Triton kernels, ``"cpu"`` the torch references.
        budget_ms: per-frame budget. Deadline misses are counted.
        layers: also send ``"depth"``, ``"opacity"`` and ``"camera"``. See the module docstring and
            :meth:`render_layers`.
        sync_free: whether :meth:`prepare` sets up the renderer's sync-free path. See :func:`sync_free_on`.
    """

    def __init__(self, *, width: int, height: int, device: str = "cpu", budget_ms: float | None = None,
                 layers: bool = False, sync_free: bool | None = None, name: str = "render"):
        super().__init__(name)
        if width < 1 or height < 1:
            raise ValueError(f"{type(self).__name__}: size {width}x{height} must be at least 1x1 pixel")
        self.width, self.height = width, height
        self.device = str(torch.device(device))
        self.sync_free = sync_free_on(self.device, sync_free)
        self.budget_ms = budget_ms
        self.inputs = {"camera": CAMERA_PORT}
        self.outputs = {"video": PortSpec((height, width, 3), torch.uint8, "cpu")}
        self.layers = layers
        if layers:
            self.outputs.update(depth=PortSpec((height, width), torch.float32, "cpu"),
                                opacity=PortSpec((height, width), torch.float32, "cpu"), camera=CAMERA_PORT)

    def prepare(self) -> None:
        """Move the scene to :attr:`device`. Called once, at setup."""

    def render(self, view: torch.Tensor, K: torch.Tensor, t: float) -> torch.Tensor:
        """Draw one view.

        ``view [4, 4]`` is world-to-camera in OpenCV axes, and ``K [3, 3]`` the intrinsics, both on the device.
        ``t`` is the frame's stream time in seconds. Returns ``float [height, width, 3]`` RGB in [0, 1] on the
        device."""
        raise NotImplementedError

    def render_layers(self, view: torch.Tensor, K: torch.Tensor, t: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As :meth:`render`, with the depth and the opacity: ``(rgb [H, W, 3], depth [H, W], opacity [H, W])``.

        Used with ``layers=True``; see the module docstring. A renderer that has them overrides this."""
        raise NotImplementedError(f"{type(self).__name__} does not render depth and opacity (layers)")

    def setup(self, ctx):
        super().setup(ctx)
        self.prepare()

    @torch.no_grad()
    def process(self, inputs, out):
        camera = inputs["camera"]
        cam = camera.data.to(self.device, non_blocking=True)
        t = self.ctx.clock.seconds(camera.pts)
        if not self.layers:
            rgb = self.render(cam[0], cam[1, :3, :3], t)
            out.write("video").data.copy_((rgb.clamp(0, 1) * 255 + 0.5).to(torch.uint8))
            return
        rgb, depth, opacity = self.render_layers(cam[0], cam[1, :3, :3], t)
        out.write("video").data.copy_((rgb.clamp(0, 1) * 255 + 0.5).to(torch.uint8))
        out.write("depth").data.copy_(torch.where(opacity > 0, depth, torch.zeros_like(depth)))
        out.write("opacity").data.copy_(opacity.clamp(0, 1))
        out.write("camera").data.copy_(camera.data)


class GaussianRenderStage(RenderStage):
    """Renders a :class:`GaussianScene` for each incoming camera into an RGB frame.

    Args:
        scene: the Gaussians. Moved to ``device`` at setup; refused first if it does not fit.
        background: RGB in [0, 1] behind the Gaussians.
        sync_free: see :func:`sync_free_on`.
        width / height / device / budget_ms: see :class:`RenderStage`.
    """

    def __init__(self, scene: GaussianScene, *, width: int, height: int, device: str = "cpu",
                 background=(0.0, 0.0, 0.0), budget_ms: float | None = None, layers: bool = False,
                 sync_free: bool | None = None, name: str = "gaussians"):
        super().__init__(width=width, height=height, device=device, budget_ms=budget_ms, layers=layers,
                         sync_free=sync_free, name=name)
        self.scene = scene
        self.background = torch.tensor(background, dtype=torch.float32)
        check_fits(scene.n, self.device, sh_degree=scene.sh_degree)

    def prepare(self) -> None:
        self._scene = self.scene.to(self.device)
        self._bg = self.background.to(self.device)[None]
        self.tiles = TileCapacity() if self.sync_free else None  # fixed-capacity tile lists, or data-sized

    def render(self, view, K, t):
        s = self._scene
        colors, _, _ = rasterize(s.means, s.quats, s.scales, s.opacities, s.sh, view[None], K[None],
                                 self.width, self.height, sh_degree=s.sh_degree, backgrounds=self._bg,
                                 validate=False, tiles=self.tiles)  # the scene was checked once, at load
        return colors[0]

    def render_layers(self, view, K, t):
        s = self._scene
        colors, alphas, _ = rasterize(s.means, s.quats, s.scales, s.opacities, s.sh, view[None], K[None],
                                      self.width, self.height, sh_degree=s.sh_degree, backgrounds=self._bg,
                                      render_mode="RGB+ED", validate=False, tiles=self.tiles)
        return colors[0, ..., :3], colors[0, ..., 3], alphas[0, ..., 0]


@dataclass(frozen=True)
class Framing:
    """How an orbit frames a scene. It circles ``center`` at ``distance``, with z up. It sits
    ``elevation_deg`` above the horizon, with a ``fov_deg`` field of view."""

    center: tuple[float, float, float]
    distance: float
    elevation_deg: float = 20.0
    fov_deg: float = 50.0

    def orbit(self, n_frames: int, width: int, height: int, fps: float) -> CameraPath:
        return orbit_path(torch.tensor(self.center, dtype=torch.float64), self.distance, n_frames,
                          self.elevation_deg, fov_deg=self.fov_deg, width=width, height=height, fps=fps)


def framing_for_points(means: torch.Tensor, elevation_deg: float = 20.0, fov_deg: float = 50.0) -> Framing:
    """Frames Gaussians ``means [N, 3]`` around their median centre.

    The distance is 2.2× the radius holding 90 % of them. Z is up, as INRIA and COLMAP scenes are usually
    stored."""
    means = means.detach().to("cpu", torch.float64)
    center = means.median(dim=0).values
    radius = float(torch.quantile((means - center).norm(dim=1), 0.9)) if len(means) > 1 else 1.0
    return Framing(tuple(float(c) for c in center), 2.2 * max(radius, 1e-3), elevation_deg, fov_deg)


def orbit_for_scene(scene: GaussianScene, n_frames: int, width: int, height: int, fps: float,
                    elevation_deg: float = 20.0, fov_deg: float = 50.0) -> CameraPath:
    """An orbit that frames the scene; see :func:`framing_for_points`."""
    return framing_for_points(scene.means, elevation_deg, fov_deg).orbit(n_frames, width, height, fps)


__all__ = ["CAMERA_PORT", "pack_camera", "CameraSource", "RenderStage", "GaussianRenderStage", "sync_free_on",
           "Framing", "framing_for_points", "orbit_for_scene", "camera_centers"]
