"""A small analytic scene to train NeRFs on: coloured, procedurally textured spheres, ray-cast in torch.

Everything here is exact geometry, by ray-sphere intersection. So training images can be rendered for any OpenCV
camera with no assets. Each sphere has two colours. A smooth band pattern in its own spherical coordinates
blends them. One directional light plus ambient lights them. Shading is diffuse and view-independent. Rays that
miss every sphere see ``background``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..cameras import CameraPath, intrinsics, look_at
from ..scenes import ray_sphere
from .marcher import camera_rays


@dataclass
class Sphere:
    center: Sequence[float]
    radius: float
    color_a: Sequence[float]
    color_b: Sequence[float]
    bands: float = 4.0  # pattern frequency (bands around the sphere)


@dataclass
class SphereScene:
    """Spheres over a flat background colour, all inside ``aabb``. Z is up."""

    spheres: list[Sphere]
    background: Sequence[float] = (1.0, 1.0, 1.0)
    light_dir: Sequence[float] = (0.4, -0.3, 0.85)  # towards the light
    ambient: float = 0.3
    aabb: Sequence[float] = (-1.0, -1.0, -1.0, 1.0, 1.0, 1.0)

    def render_rays(self, origins: Tensor, dirs: Tensor) -> Tensor:
        """RGB ``[R, 3]`` in [0, 1] seen along rays ``origins, dirs [R, 3]``. Dirs are unit."""
        R = origins.shape[0]
        best_t = torch.full((R,), math.inf, dtype=origins.dtype)
        rgb = torch.as_tensor(self.background, dtype=origins.dtype).expand(R, 3).clone()
        light = torch.as_tensor(self.light_dir, dtype=origins.dtype)
        light = light / light.norm()
        for s in self.spheres:
            c = torch.as_tensor(s.center, dtype=origins.dtype)
            t, meets = ray_sphere(origins, dirs, c, s.radius)
            hit = meets & (t > 0) & (t < best_t)
            if not bool(hit.any()):
                continue
            p = origins[hit] + t[hit, None] * dirs[hit]
            n = (p - c) / s.radius
            theta = torch.acos(n[:, 2].clamp(-1, 1))
            phi = torch.atan2(n[:, 1], n[:, 0])
            pattern = 0.5 + 0.5 * torch.sin(s.bands * phi) * torch.sin(s.bands * theta)
            albedo = (torch.as_tensor(s.color_a, dtype=origins.dtype) * pattern[:, None]
                      + torch.as_tensor(s.color_b, dtype=origins.dtype) * (1 - pattern[:, None]))
            shade = self.ambient + (1 - self.ambient) * (n @ light).clamp(min=0)
            rgb[hit] = (albedo * shade[:, None]).clamp(0, 1)
            best_t = torch.where(hit, t, best_t)
        return rgb

    def render(self, viewmat: Tensor, K: Tensor, width: int, height: int) -> Tensor:
        """Image ``[H, W, 3]`` float32 in [0, 1] for an OpenCV camera, ``viewmat [4, 4]`` and ``K [3, 3]``."""
        o, d = camera_rays(viewmat.cpu(), K.cpu(), width, height)
        return self.render_rays(o, d).reshape(height, width, 3).float()


def demo_scene() -> SphereScene:
    """Four spheres in the unit box: a big one in the middle and three smaller around it."""
    return SphereScene(spheres=[
        Sphere((0.0, 0.0, -0.1), 0.45, (0.9, 0.35, 0.2), (0.95, 0.85, 0.3), bands=4.0),
        Sphere((0.55, 0.35, 0.25), 0.25, (0.2, 0.5, 0.9), (0.85, 0.9, 1.0), bands=3.0),
        Sphere((-0.5, 0.45, -0.3), 0.3, (0.2, 0.75, 0.35), (0.1, 0.3, 0.15), bands=5.0),
        Sphere((-0.25, -0.6, 0.35), 0.22, (0.7, 0.25, 0.8), (0.95, 0.95, 0.95), bands=2.0),
    ], background=(1.0, 1.0, 1.0))


def sphere_views(n: int, *, width: int, height: int, radius: float = 3.0, fov_deg: float = 45.0,
                 elevations_deg: Sequence[float] = (-15.0, 15.0, 40.0), start_deg: float = 0.0) -> CameraPath:
    """``n`` cameras looking at the origin from a sphere of ``radius``.

    Azimuths spread evenly, with golden-angle offsets between rings. Elevations cycle through ``elevations_deg``."""
    eyes = []
    for i in range(n):
        el = math.radians(elevations_deg[i % len(elevations_deg)])
        az = math.radians(start_deg + 360.0 * i / n + 137.5 * (i % len(elevations_deg)))
        eyes.append((radius * math.cos(el) * math.cos(az), radius * math.cos(el) * math.sin(az), radius * math.sin(el)))
    viewmats = torch.stack([look_at(e, (0.0, 0.0, 0.0)) for e in eyes])
    K = intrinsics(width, height, fov_deg=fov_deg)
    return CameraPath(viewmats, K.expand(n, 3, 3).clone(), width, height)
