"""Renderers as stream stages: a camera source and a Gaussian-splatting render stage.

Cameras travel on a ``"camera"`` port, ``float32 [2, 4, 4]`` on the CPU: ``camera[0]`` is the
world-to-camera matrix (OpenCV: x right, y down, z forward) and ``camera[1, :3, :3]`` the intrinsics K
in pixels. Rendered frames leave as ``uint8 [H, W, 3]`` RGB on the CPU, ready for an encoder.
"""
from __future__ import annotations

import threading

import torch

from framegraph.stream import EndOfStream, PortSpec, Stage

from .cameras import CameraPath, camera_centers, intrinsics, orbit_path
from .gaussians import GaussianScene, check_fits, rasterize

CAMERA_PORT = PortSpec((2, 4, 4), torch.float32, "cpu")


def pack_camera(viewmat: torch.Tensor, K: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``viewmat [4, 4]`` and ``K [3, 3]`` → the ``camera`` port layout ``[2, 4, 4]``."""
    out = torch.zeros(2, 4, 4) if out is None else out
    out[0] = viewmat
    out[1].zero_()
    out[1, :3, :3] = K
    return out


class CameraSource(Stage):
    """Source of cameras at ``fps``: frames of a :class:`CameraPath` (``n_frames`` of them, looping if
    the path is shorter), or — when ``path`` is None — live poses pushed with :meth:`push_pose` (the
    newest pose is used for each frame: ``latest`` semantics, a fast client never queues).

    Args:
        path: the cameras to play, or None for pushed poses.
        fps: frame rate; pts come from the frame index.
        n_frames: frames to emit (default ``len(path)``; required for pushed poses unless live forever).
        K / width / height: intrinsics for pushed poses (default 50° horizontal fov).
    """

    def __init__(self, path: CameraPath | None = None, *, fps: float = 30.0, n_frames: int | None = None,
                 width: int | None = None, height: int | None = None, K: torch.Tensor | None = None,
                 initial_pose: torch.Tensor | None = None, name: str = "camera"):
        super().__init__(name)
        if path is None and initial_pose is None:
            raise ValueError("CameraSource: give a camera path, or an initial_pose for pushed poses")
        self.path, self.fps = path, fps
        self.n_frames = n_frames if n_frames is not None else (len(path) if path is not None else None)
        self.width = width or (path.width if path is not None else 640)
        self.height = height or (path.height if path is not None else 480)
        self.K = K if K is not None else intrinsics(self.width, self.height, fov_deg=50.0)
        self._pose = initial_pose.to(torch.float32).clone() if initial_pose is not None else None
        self._lock = threading.Lock()
        self.outputs = {"camera": CAMERA_PORT}
        self.index = 0
        self.poses_pushed = 0

    def push_pose(self, viewmat) -> None:
        """Set the live pose (``[4, 4]`` world-to-camera, OpenCV). Safe from any thread."""
        v = torch.as_tensor(viewmat, dtype=torch.float32)
        if v.shape != (4, 4) or not torch.isfinite(v).all():
            raise ValueError(f"pose must be a finite 4x4 world-to-camera matrix, got shape {list(v.shape)}")
        with self._lock:
            self._pose = v.clone()
            self.poses_pushed += 1

    def setup(self, ctx):
        super().setup(ctx)
        self.index = 0

    def process(self, inputs, out):
        if self.n_frames is not None and self.index >= self.n_frames:
            raise EndOfStream
        frame = out.write("camera")
        if self.path is not None:
            view, K = self.path[self.index % len(self.path)]
        else:
            with self._lock:
                view = self._pose.clone()
            K = self.K
        pack_camera(view, K, frame.data)
        frame.pts = self.ctx.clock.ticks_from_frame(self.index, self.fps)
        self.index += 1


class GaussianRenderStage(Stage):
    """Renders a :class:`GaussianScene` for each incoming camera into an RGB frame.

    Args:
        scene: the Gaussians (moved to ``device`` at setup; refused first if it does not fit).
        width / height: output size in pixels.
        device: where to render (``"cuda"`` uses the Triton kernels, ``"cpu"`` the torch reference).
        background: RGB in [0, 1] behind the Gaussians.
        budget_ms: per-frame budget (deadline misses are counted).
    """

    def __init__(self, scene: GaussianScene, *, width: int, height: int, device: str = "cpu",
                 background=(0.0, 0.0, 0.0), budget_ms: float | None = None, name: str = "gaussians"):
        super().__init__(name)
        self.scene, self.width, self.height = scene, width, height
        self.device = str(torch.device(device))
        self.budget_ms = budget_ms
        self.background = torch.tensor(background, dtype=torch.float32)
        self.inputs = {"camera": CAMERA_PORT}
        self.outputs = {"video": PortSpec((height, width, 3), torch.uint8, "cpu")}
        check_fits(scene.n, self.device, sh_degree=scene.sh_degree)

    def setup(self, ctx):
        super().setup(ctx)
        self._scene = self.scene.to(self.device)
        self._bg = self.background.to(self.device)[None]

    @torch.no_grad()
    def process(self, inputs, out):
        cam = inputs["camera"].data.to(self.device, non_blocking=True)
        s = self._scene
        colors, _, _ = rasterize(s.means, s.quats, s.scales, s.opacities, s.sh, cam[0][None], cam[1, :3, :3][None],
                                 self.width, self.height, sh_degree=s.sh_degree, backgrounds=self._bg,
                                 validate=False)  # the scene was checked once, at load
        frame = out.write("video")
        frame.data.copy_((colors[0].clamp(0, 1) * 255 + 0.5).to(torch.uint8))


def orbit_for_scene(scene: GaussianScene, n_frames: int, width: int, height: int, fps: float,
                    elevation_deg: float = 20.0, fov_deg: float = 50.0) -> CameraPath:
    """An orbit that frames the scene: around the median centre, at 2.2× the radius holding 90 % of the
    Gaussians (z up, as INRIA/COLMAP scenes are usually stored)."""
    means = scene.means.detach().to("cpu", torch.float64)
    center = means.median(dim=0).values
    radius = float(torch.quantile((means - center).norm(dim=1), 0.9)) if scene.n > 1 else 1.0
    return orbit_path(center, 2.2 * max(radius, 1e-3), n_frames, elevation_deg, fov_deg=fov_deg,
                      width=width, height=height, fps=fps)


__all__ = ["CAMERA_PORT", "pack_camera", "CameraSource", "GaussianRenderStage", "orbit_for_scene",
           "camera_centers"]
