"""Captures as users bring them, written from an analytic scene: ``transforms.json`` + images in a folder.

:func:`write_capture` renders :class:`~framegraph.renderers.nerf.SphereScene` views from cameras on an
arc around a subject that need not sit at the origin, optionally through a distorting lens (each pixel's
ray found with OpenCV's inverse of the lens model, so the image is what such a lens records), and can
leave some listed images out, as instant-ngp's fox does.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from framegraph.renderers.cameras import OPENGL_TO_OPENCV, intrinsics, look_at
from framegraph.renderers.nerf import Sphere, SphereScene

SUBJECT = (3.0, -2.0, 1.0)  # off the origin: where the cameras of :func:`arc_cameras` look


def subject_scene(center=SUBJECT, background=(1.0, 1.0, 1.0)) -> SphereScene:
    """One banded sphere (radius 0.6) at ``center`` and a small one beside it, on a flat background."""
    c = torch.tensor(center, dtype=torch.float64)
    return SphereScene([Sphere(c.tolist(), 0.6, (0.9, 0.3, 0.2), (0.2, 0.4, 0.9), bands=3.0),
                        Sphere((c + torch.tensor([0.55, 0.4, 0.35])).tolist(), 0.25, (0.2, 0.7, 0.3),
                               (0.95, 0.95, 0.9), bands=2.0)],
                       background=background, aabb=[*(c - 1.2).tolist(), *(c + 1.2).tolist()])


def arc_cameras(n: int, *, center=SUBJECT, radius: float = 3.0, arc_deg: float = 120.0,
                elevations_deg=(10.0, 35.0)) -> torch.Tensor:
    """``[n, 4, 4]`` world-to-camera (OpenCV) on an arc of ``arc_deg`` around ``center``, looking at it."""
    c = torch.tensor(center, dtype=torch.float64)
    eyes = []
    for i in range(n):
        az = math.radians(-arc_deg / 2 + arc_deg * i / max(1, n - 1))
        el = math.radians(elevations_deg[i % len(elevations_deg)])
        eyes.append(c + radius * torch.tensor([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)],
                                              dtype=torch.float64))
    eyes = torch.stack(eyes)
    return look_at(eyes, c.expand_as(eyes), (0.0, 0.0, 1.0))


def lens_rays(viewmat: torch.Tensor, K: torch.Tensor, width: int, height: int, lens: dict | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """World rays ``(origins, dirs) [H * W, 3]`` through the pixel centres of a camera whose lens distorts
    with ``lens`` (``{"k1": .., "k2": .., "p1": .., "p2": ..}``, or with ``"is_fisheye": True`` k1..k4)."""
    import cv2

    v, u = np.mgrid[0:height, 0:width].astype(np.float64)
    pts = np.stack([u, v], -1).reshape(-1, 1, 2)  # OpenCV pixel centres (framegraph's - 0.5)
    K_cv = K.double().numpy().copy()
    K_cv[:2, 2] -= 0.5
    lens = lens or {}
    if lens.get("is_fisheye"):
        D = np.array([lens.get(k, 0.0) for k in ("k1", "k2", "k3", "k4")])
        xy = cv2.fisheye.undistortPoints(pts, K_cv, D).reshape(-1, 2)
    else:
        D = np.array([lens.get(k, 0.0) for k in ("k1", "k2", "p1", "p2", "k3")])
        criteria = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-12)  # converged, not 5 iterations
        if hasattr(cv2, "undistortPointsIter"):  # OpenCV 4.x: the overload that takes criteria has its own name
            xy = cv2.undistortPointsIter(pts, K_cv, D, None, None, criteria)
        else:  # OpenCV 5 dropped that name: undistortPoints itself takes criteria
            xy = cv2.undistortPoints(pts, K_cv, D, criteria=criteria)
        xy = xy.reshape(-1, 2)
    d_cam = torch.from_numpy(np.concatenate([xy, np.ones((xy.shape[0], 1))], -1))
    c2w = torch.linalg.inv(viewmat.double())
    dirs = d_cam @ c2w[:3, :3].T
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    return c2w[:3, 3].expand_as(dirs), dirs


def render_view(scene: SphereScene, viewmat, K, width: int, height: int, lens: dict | None = None) -> torch.Tensor:
    """``[H, W, 3]`` float32: what a camera with this pose, intrinsics and lens records (pixel centres)."""
    o, d = lens_rays(viewmat, K, width, height, lens)
    return scene.render_rays(o, d).reshape(height, width, 3).float()


def write_capture(root: Path, n: int = 8, *, size=(48, 36), fov_deg: float = 50.0, lens: dict | None = None,
                  missing=(), scene: SphereScene | None = None, viewmats=None, **top) -> Path:
    """Write ``root/images/NNNN.png`` + ``root/transforms.json`` (instant-ngp style: ``fl_x``, ``cx``, lens
    coefficients at the top level, OpenGL camera-to-world) for ``n`` arc cameras; the frames whose index is
    in ``missing`` are listed but their images are not written. ``top``: more top-level keys."""
    scene = scene or subject_scene()
    w, h = size
    viewmats = arc_cameras(n) if viewmats is None else viewmats
    K = intrinsics(w, h, fov_deg=fov_deg)
    (root / "images").mkdir(parents=True, exist_ok=True)
    frames = []
    for i, v in enumerate(viewmats):
        name = f"images/{i:04d}.png"
        if i not in missing:
            img = render_view(scene, v, K, w, h, lens)
            Image.fromarray((img * 255 + 0.5).to(torch.uint8).numpy()).save(root / name)
        c2w = torch.linalg.inv(v.double()) @ OPENGL_TO_OPENCV
        frames.append({"file_path": name, "transform_matrix": c2w.tolist()})
    doc = {"w": w, "h": h, "fl_x": float(K[0, 0]), "fl_y": float(K[1, 1]), "cx": float(K[0, 2]),
           "cy": float(K[1, 2]), **(lens or {}), **top, "frames": frames}
    (root / "transforms.json").write_text(json.dumps(doc))
    return root / "transforms.json"
