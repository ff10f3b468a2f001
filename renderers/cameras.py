"""Cameras: OpenCV convention, world-to-camera matrices, paths through time.

One convention holds everywhere in framegraph. Camera axes are x right, y down, z forward. A visible point has
camera z > 0. A pose is a **world-to-camera** ``[4, 4]`` matrix ``viewmat``, with ``x_cam = R @ x_world + t``.
Intrinsics are ``K = [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` in pixels. Pixel centres are at ``+0.5``. This is
what :func:`framegraph.renderers.gaussians.rasterize` takes.

- :func:`look_at`, :func:`intrinsics` build single cameras.
- :func:`orbit_path` circles a point.
- :class:`KeyframePath` interpolates keyframes smoothly at any time ``t``. Rotations are slerped. Positions
  follow a cubic Hermite, Catmull-Rom spline.
- :func:`load_nerfstudio_camera_path` reads nerfstudio's ``camera_path.json`` into the same form. That file is
  OpenGL camera-to-world.
- :func:`project_points` maps world to pixels and depth. :func:`pixel_rays` maps pixels to world rays. A
  compositor uses this camera math to put something into a rendered picture; see :mod:`.billboard`.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

ArrayLike = Tensor | Sequence[float]

# OpenGL / nerfstudio / three.js camera axes (x right, y up, z back) -> OpenCV (x right, y down, z forward)
OPENGL_TO_OPENCV = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64))


class CameraPathError(ValueError):
    """A camera path file that doesn't parse. The message names the file and the problem."""


def _vec(x: ArrayLike, dtype=torch.float64) -> Tensor:
    return torch.as_tensor(x, dtype=dtype)


def look_at(eye: ArrayLike, target: ArrayLike, up: ArrayLike = (0.0, 0.0, 1.0)) -> Tensor:
    """World-to-camera ``[..., 4, 4]`` float32 for a camera at ``eye`` looking at ``target``.

    ``up`` is the world direction that appears upward in the image. So image y, which points down, is along
    ``-up`` projected on the image plane. Inputs broadcast: ``eye [..., 3]`` gives ``[..., 4, 4]``.
    """
    eye, target, up = _vec(eye), _vec(target), _vec(up)
    forward = target - eye
    dist = forward.norm(dim=-1, keepdim=True)
    if (dist == 0).any():
        raise ValueError(f"look_at: eye and target coincide ({eye.tolist()})")
    forward = forward / dist
    right = torch.linalg.cross(forward, up.expand_as(forward), dim=-1)
    rnorm = right.norm(dim=-1, keepdim=True)
    if (rnorm < 1e-9).any():
        raise ValueError(f"look_at: viewing direction {forward.tolist()} is parallel to up {up.tolist()}")
    right = right / rnorm
    down = torch.linalg.cross(forward, right, dim=-1)
    R = torch.stack([right, down, forward], dim=-2)  # rows: camera axes in world coordinates
    viewmat = torch.zeros(R.shape[:-2] + (4, 4), dtype=torch.float64)
    viewmat[..., :3, :3] = R
    viewmat[..., :3, 3] = -(R @ eye[..., None])[..., 0]
    viewmat[..., 3, 3] = 1.0
    return viewmat.float()


def intrinsics(
    width: int,
    height: int,
    *,
    fov_deg: float | None = None,
    focal: float | None = None,
    fov_axis: str = "y",
    principal_point: Sequence[float] | None = None,
) -> Tensor:
    """Pinhole ``K [3, 3]`` float32 from a field of view in degrees or a focal length in pixels.

    ``fov_axis`` says which image axis ``fov_deg`` spans. "y" is vertical, as in nerfstudio and three.js. "x" is
    horizontal. Pixels are square. The principal point defaults to the image centre ``(width / 2, height / 2)``.
    """
    if (fov_deg is None) == (focal is None):
        raise ValueError("intrinsics: give exactly one of fov_deg or focal")
    if focal is None:
        if not 0 < fov_deg < 180:
            raise ValueError(f"intrinsics: fov_deg must be in (0, 180), got {fov_deg}")
        span = {"y": height, "x": width}.get(fov_axis)
        if span is None:
            raise ValueError(f"intrinsics: fov_axis must be 'x' or 'y', got {fov_axis!r}")
        focal = 0.5 * span / math.tan(math.radians(fov_deg) / 2)
    cx, cy = principal_point if principal_point is not None else (width / 2, height / 2)
    return torch.tensor([[focal, 0.0, cx], [0.0, focal, cy], [0.0, 0.0, 1.0]], dtype=torch.float32)


@dataclass
class CameraPath:
    """Cameras for a sequence of frames.

    Attributes:
        viewmats: ``[T, 4, 4]`` world-to-camera, OpenCV axes.
        Ks: ``[T, 3, 3]`` intrinsics.
        width, height: image size in pixels.
        fps: frames per second. Frame ``i`` is at ``i / fps`` seconds.
    """

    viewmats: Tensor
    Ks: Tensor
    width: int
    height: int
    fps: float = 30.0

    def __len__(self) -> int:
        return self.viewmats.shape[0]

    def __getitem__(self, i: int):
        return self.viewmats[i], self.Ks[i]

    @property
    def duration_s(self) -> float:
        return len(self) / self.fps


def camera_centers(viewmats: Tensor) -> Tensor:
    """World positions ``[..., 3]`` of cameras given world-to-camera ``[..., 4, 4]``."""
    R, t = viewmats[..., :3, :3], viewmats[..., :3, 3]
    return -(R.transpose(-1, -2) @ t[..., None])[..., 0]


def project_points(points: Tensor, viewmat: Tensor, K: Tensor) -> tuple[Tensor, Tensor]:
    """World points ``[..., 3]`` seen by one camera, in pixels and depth.

    The camera is ``viewmat [4, 4]`` world-to-camera and ``K [3, 3]``. Returns pixel positions ``[..., 2]``, x
    right and y down. Pixel row i, col j has its centre at ``(j + 0.5, i + 0.5)``. Also returns camera-z depths
    ``[...]``, > 0 in front of the camera."""
    R, t = viewmat[:3, :3].to(points.dtype), viewmat[:3, 3].to(points.dtype)
    cam = points @ R.T + t
    z = cam[..., 2]
    uv = (cam[..., :2] / z[..., None]) * torch.stack([K[0, 0], K[1, 1]]).to(points.dtype) \
        + torch.stack([K[0, 2], K[1, 2]]).to(points.dtype)
    return uv, z


def pixel_rays(viewmat: Tensor, K: Tensor, x0: int, y0: int, x1: int, y1: int) -> tuple[Tensor, Tensor]:
    """The rays through the pixel centres of the window ``[y0, y1) × [x0, x1)`` of a camera.

    Returns the camera centre ``[3]`` and world directions ``[y1 - y0, x1 - x0, 3]``. Each direction is scaled to
    camera-z 1. So a point ``o + s · d`` lies at camera-z depth ``s``."""
    K, R = K.float(), viewmat[:3, :3].float()
    ys = torch.arange(y0, y1, dtype=torch.float32, device=K.device) + 0.5
    xs = torch.arange(x0, x1, dtype=torch.float32, device=K.device) + 0.5
    py, px = torch.meshgrid(ys, xs, indexing="ij")
    cam = torch.stack([(px - K[0, 2]) / K[0, 0], (py - K[1, 2]) / K[1, 1], torch.ones_like(px)], dim=-1)
    return camera_centers(viewmat.float()), cam @ R  # R^T d for row vectors


def orbit_path(
    center: ArrayLike,
    radius: float,
    n_frames: int,
    elevation_deg: float = 20.0,
    *,
    up: ArrayLike = (0.0, 0.0, 1.0),
    start_deg: float = 0.0,
    turns: float = 1.0,
    fov_deg: float = 50.0,
    width: int = 640,
    height: int = 480,
    fps: float = 30.0,
) -> CameraPath:
    """``n_frames`` cameras circling ``center`` at ``radius``, ``elevation_deg`` above the plane ⟂ ``up``.

    The loop is open: frame ``n_frames`` would equal frame 0. So it repeats seamlessly.
    """
    if n_frames < 1:
        raise ValueError(f"orbit_path: n_frames must be >= 1, got {n_frames}")
    center, up_v = _vec(center), _vec(up)
    up_v = up_v / up_v.norm()
    # An orthonormal basis (a, b) of the orbit plane.
    helper = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    if abs(float(helper @ up_v)) > 0.9:
        helper = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    a = torch.linalg.cross(up_v, helper)
    a = a / a.norm()
    b = torch.linalg.cross(up_v, a)
    az = torch.deg2rad(start_deg + 360.0 * turns * torch.arange(n_frames, dtype=torch.float64) / n_frames)
    el = math.radians(elevation_deg)
    offsets = radius * (math.cos(el) * (torch.cos(az)[:, None] * a + torch.sin(az)[:, None] * b) + math.sin(el) * up_v)
    eyes = center + offsets
    viewmats = look_at(eyes, center.expand_as(eyes), up_v)
    K = intrinsics(width, height, fov_deg=fov_deg)
    return CameraPath(viewmats, K.expand(n_frames, 3, 3).clone(), width, height, fps)


# ----------------------------------------------------------------------------
# Rotations
# ----------------------------------------------------------------------------
def rotmat_to_quat(R: Tensor) -> Tensor:
    """Unit quaternions ``[..., 4]`` from rotation matrices ``[..., 3, 3]``. Order w, x, y, z, with ``w >= 0``."""
    R = R.to(torch.float64)
    m = R.reshape(-1, 3, 3)
    tr = m[:, 0, 0] + m[:, 1, 1] + m[:, 2, 2]
    # Four candidate formulas; use the numerically largest denominator per matrix.
    cands = torch.stack([
        torch.stack([1 + tr, m[:, 2, 1] - m[:, 1, 2], m[:, 0, 2] - m[:, 2, 0], m[:, 1, 0] - m[:, 0, 1]], -1),
        torch.stack([m[:, 2, 1] - m[:, 1, 2], 1 + m[:, 0, 0] - m[:, 1, 1] - m[:, 2, 2],
                     m[:, 0, 1] + m[:, 1, 0], m[:, 0, 2] + m[:, 2, 0]], -1),
        torch.stack([m[:, 0, 2] - m[:, 2, 0], m[:, 0, 1] + m[:, 1, 0],
                     1 - m[:, 0, 0] + m[:, 1, 1] - m[:, 2, 2], m[:, 1, 2] + m[:, 2, 1]], -1),
        torch.stack([m[:, 1, 0] - m[:, 0, 1], m[:, 0, 2] + m[:, 2, 0],
                     m[:, 1, 2] + m[:, 2, 1], 1 - m[:, 0, 0] - m[:, 1, 1] + m[:, 2, 2]], -1),
    ], dim=1)  # [B, 4 candidates, 4]
    diag = torch.stack([1 + tr, 1 + m[:, 0, 0] - m[:, 1, 1] - m[:, 2, 2],
                        1 - m[:, 0, 0] + m[:, 1, 1] - m[:, 2, 2], 1 - m[:, 0, 0] - m[:, 1, 1] + m[:, 2, 2]], -1)
    best = diag.argmax(dim=-1)
    q = cands[torch.arange(m.shape[0]), best]
    q = q / q.norm(dim=-1, keepdim=True)
    q = torch.where(q[:, :1] < 0, -q, q)
    return q.reshape(R.shape[:-2] + (4,))


def quat_to_rotmat(q: Tensor) -> Tensor:
    """Rotation matrices ``[..., 3, 3]`` from quaternions ``[..., 4]``, order w, x, y, z."""
    q = q / q.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], -1).reshape(q.shape[:-1] + (3, 3))


def slerp(q0: Tensor, q1: Tensor, u: Tensor) -> Tensor:
    """Spherical linear interpolation of unit quaternions ``[..., 4]`` along the shorter arc, ``u`` in [0, 1]."""
    dot = (q0 * q1).sum(-1, keepdim=True)
    q1 = torch.where(dot < 0, -q1, q1)
    dot = dot.abs().clamp(max=1.0)
    u = u[..., None]
    theta = torch.acos(dot)
    sin_theta = torch.sin(theta)
    near = sin_theta < 1e-6  # nearly identical: linear interpolation is exact enough
    w0 = torch.where(near, 1 - u, torch.sin((1 - u) * theta) / torch.where(near, 1.0, sin_theta))
    w1 = torch.where(near, u, torch.sin(u * theta) / torch.where(near, 1.0, sin_theta))
    q = w0 * q0 + w1 * q1
    return q / q.norm(dim=-1, keepdim=True)


class KeyframePath:
    """A smooth camera path through keyframe poses, evaluated at any time.

    Positions, the camera centres, follow a cubic Hermite spline with Catmull-Rom tangents. The tangents are
    finite differences scaled for uneven keyframe spacing. So the path is C1 and passes through every keyframe.
    Orientations are slerped between consecutive keyframes. Times outside ``[times[0], times[-1]]`` clamp. With
    ``loop=True`` they wrap.

    Args:
        viewmats: ``[K, 4, 4]`` world-to-camera keyframes, K >= 1.
        times: ``[K]`` strictly increasing keyframe times in seconds. Default ``0, 1, ..., K - 1``.
        loop: treat the path as closed. After ``times[-1]`` it returns to the first keyframe. It gets there at
            ``times[-1] + (times[-1] - times[-2])``.
    """

    def __init__(self, viewmats: Tensor, times: ArrayLike | None = None, *, loop: bool = False):
        viewmats = torch.as_tensor(viewmats, dtype=torch.float64)
        if viewmats.dim() != 3 or viewmats.shape[1:] != (4, 4) or viewmats.shape[0] < 1:
            raise ValueError(f"KeyframePath: viewmats must be [K, 4, 4] with K >= 1, got {list(viewmats.shape)}")
        K = viewmats.shape[0]
        times = torch.arange(K, dtype=torch.float64) if times is None else _vec(times)
        if times.shape != (K,):
            raise ValueError(f"KeyframePath: times must have shape [{K}], got {list(times.shape)}")
        if K > 1 and not bool((times[1:] > times[:-1]).all()):
            raise ValueError(f"KeyframePath: times must be strictly increasing, got {times.tolist()}")
        centers = camera_centers(viewmats)
        quats = rotmat_to_quat(viewmats[:, :3, :3].transpose(-1, -2))  # camera-to-world rotations
        if loop and K > 1:
            period_end = times[-1] + (times[-1] - times[-2])
            centers = torch.cat([centers, centers[:1]])
            quats = torch.cat([quats, quats[:1]])
            times = torch.cat([times, period_end[None]])
        # make consecutive quaternions take the short way round
        for i in range(1, quats.shape[0]):
            if float(quats[i] @ quats[i - 1]) < 0:
                quats[i] = -quats[i]
        self.loop = loop and K > 1
        self.times, self.centers, self.quats = times, centers, quats
        self.tangents = self._catmull_rom_tangents(times, centers, self.loop)

    @staticmethod
    def _catmull_rom_tangents(times: Tensor, points: Tensor, loop: bool) -> Tensor:
        n = points.shape[0]
        if n == 1:
            return torch.zeros_like(points)
        tangents = torch.empty_like(points)
        tangents[1:-1] = (points[2:] - points[:-2]) / (times[2:] - times[:-2])[:, None]
        if loop:  # the closing point equals the first; use its neighbours across the seam
            period = times[-1] - times[0]
            t_prev = times[-2] - period
            seam = (points[1] - points[-2]) / (times[1] - t_prev)
            tangents[0] = tangents[-1] = seam
        else:
            tangents[0] = (points[1] - points[0]) / (times[1] - times[0])
            tangents[-1] = (points[-1] - points[-2]) / (times[-1] - times[-2])
        return tangents

    @property
    def duration(self) -> float:
        return float(self.times[-1] - self.times[0])

    def at(self, t: float | Tensor) -> Tensor:
        """World-to-camera float32 ``[4, 4]`` at time ``t``. ``t [T]`` gives ``[T, 4, 4]``."""
        t = _vec(t)
        scalar = t.dim() == 0
        t = t.reshape(-1)
        times = self.times
        if times.shape[0] == 1:
            centers = self.centers.expand(t.shape[0], 3)
            quats = self.quats.expand(t.shape[0], 4)
        else:
            if self.loop:
                t = times[0] + torch.remainder(t - times[0], times[-1] - times[0])
            t = t.clamp(times[0], times[-1])
            i = torch.searchsorted(times, t, right=True).clamp(1, times.shape[0] - 1) - 1
            dt = times[i + 1] - times[i]
            u = (t - times[i]) / dt
            u2, u3 = u * u, u * u * u
            h00, h10 = 2 * u3 - 3 * u2 + 1, u3 - 2 * u2 + u
            h01, h11 = -2 * u3 + 3 * u2, u3 - u2
            p0, p1, m0, m1 = self.centers[i], self.centers[i + 1], self.tangents[i], self.tangents[i + 1]
            centers = h00[:, None] * p0 + (h10 * dt)[:, None] * m0 + h01[:, None] * p1 + (h11 * dt)[:, None] * m1
            quats = slerp(self.quats[i], self.quats[i + 1], u)
        R_cw = quat_to_rotmat(quats)
        R = R_cw.transpose(-1, -2)
        viewmats = torch.zeros(t.shape[0], 4, 4, dtype=torch.float64)
        viewmats[:, :3, :3] = R
        viewmats[:, :3, 3] = -(R @ centers[..., None])[..., 0]
        viewmats[:, 3, 3] = 1.0
        viewmats = viewmats.float()
        return viewmats[0] if scalar else viewmats

    def sample(self, n_frames: int, K: Tensor, width: int, height: int, fps: float | None = None) -> CameraPath:
        """``n_frames`` evenly spaced cameras over the path. Both ends are included unless looping."""
        if self.loop:
            ts = self.times[0] + self.duration * torch.arange(n_frames, dtype=torch.float64) / n_frames
        else:
            ts = torch.linspace(float(self.times[0]), float(self.times[-1]), n_frames, dtype=torch.float64)
        if fps is None:
            fps = (n_frames / self.duration) if self.duration > 0 else 30.0
        K = torch.as_tensor(K, dtype=torch.float32)
        return CameraPath(self.at(ts), K.expand(n_frames, 3, 3).clone(), width, height, fps)


# ----------------------------------------------------------------------------
# nerfstudio camera_path.json
# ----------------------------------------------------------------------------
def read_json_object(path: Path, fail: Callable[[str], Exception]) -> dict:
    """The JSON object in the file at ``path``.

    A missing or unreadable file, invalid JSON or another top-level value raise ``fail(problem)``. The caller
    builds that exception; it names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise fail("no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"cannot read: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise fail(f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(doc, dict):
        raise fail(f"expected a JSON object at the top level, got {type(doc).__name__}")
    return doc


def load_nerfstudio_camera_path(path: str | os.PathLike) -> CameraPath:
    """Read a nerfstudio ``camera_path.json``, as its viewer writes it, as OpenCV cameras.

    It uses ``render_width``, ``render_height`` and ``fps``, or else ``len(camera_path) / seconds``. Each
    ``camera_path`` entry gives ``camera_to_world`` and ``fov``. ``camera_to_world`` is 16 numbers, row-major
    4x4, or a nested 4x4 list, in OpenGL axes. ``fov`` is vertical, in degrees. Only ``camera_type:
    "perspective"`` is supported. Raises :class:`CameraPathError` naming the file and the problem.
    """
    path = Path(path)

    def fail(problem: str) -> CameraPathError:
        return CameraPathError(f"{path}: {problem}")

    doc = read_json_object(path, fail)
    camera_type = str(doc.get("camera_type", "perspective")).lower()
    if camera_type != "perspective":
        raise fail(f"camera_type {camera_type!r} is not supported; only 'perspective'")
    try:
        width, height = int(doc["render_width"]), int(doc["render_height"])
        entries = doc["camera_path"]
    except KeyError as e:
        raise fail(f"missing key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise fail(f"render_width/render_height must be integers ({e})") from None
    if width <= 0 or height <= 0:
        raise fail(f"render size must be positive, got {width}x{height}")
    if not isinstance(entries, list) or not entries:
        raise fail("'camera_path' must be a non-empty list of cameras")

    viewmats, Ks = [], []
    for i, cam in enumerate(entries):
        if not isinstance(cam, dict) or "camera_to_world" not in cam:
            raise fail(f"camera_path[{i}] has no 'camera_to_world'")
        try:
            c2w = torch.tensor(cam["camera_to_world"], dtype=torch.float64).reshape(4, 4)
        except (TypeError, ValueError, RuntimeError):
            raise fail(f"camera_path[{i}].camera_to_world must be 16 numbers (a 4x4 matrix)") from None
        if not torch.isfinite(c2w).all():
            raise fail(f"camera_path[{i}].camera_to_world contains NaN/Inf")
        fov = cam.get("fov", doc.get("default_fov"))
        if not isinstance(fov, (int, float)) or not 0 < fov < 180:
            raise fail(f"camera_path[{i}].fov must be a vertical field of view in (0, 180) degrees, got {fov!r}")
        c2w_cv = c2w @ OPENGL_TO_OPENCV
        viewmats.append(torch.linalg.inv(c2w_cv))
        Ks.append(intrinsics(width, height, fov_deg=float(fov)))

    fps = doc.get("fps")
    if not isinstance(fps, (int, float)) or fps <= 0:
        seconds = doc.get("seconds")
        if not isinstance(seconds, (int, float)) or seconds <= 0:
            raise fail("needs a positive 'fps' or 'seconds'")
        fps = len(entries) / seconds
    return CameraPath(torch.stack(viewmats).float(), torch.stack(Ks), width, height, float(fps))
