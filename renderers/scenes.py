"""Procedural ground-truth scenes: posed training images without downloading data.

A :class:`ProceduralScene` is a handful of analytic primitives with procedural textures. They are spheres,
axis-aligned boxes and a checkered ground square. One directional light lights them, with hard shadows. The
spheres have a little specular. A plain ray caster in torch renders it; no Gaussians are involved. So fitting
Gaussians to its images is a real reconstruction problem with exactly known cameras. It is the same shape of data
a user brings from COLMAP or nerfstudio.

Conventions are framegraph's; see ``renderers/cameras.py``. World z is up. Cameras are OpenCV world-to-camera
``viewmats [C, 4, 4]`` with intrinsics ``Ks [C, 3, 3]`` in pixels. Pixel row i, col j has its centre at
``(j + 0.5, i + 0.5)``.

    scene = procedural_scene("toy")
    views = scene.views(40, 128, 96, seed=0)           # training cameras
    images, depth = scene.render(views.viewmats, views.Ks, 128, 96)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .cameras import CameraPath, intrinsics, look_at

Color = tuple[float, float, float]
_FAR = 1e9


@dataclass(frozen=True)
class Sphere:
    """A sphere with ``n_sectors`` alternating coloured sectors around the z axis, like a beach ball.

    It is turned by ``phase`` radians about that axis."""

    center: tuple[float, float, float]
    radius: float
    color_a: Color
    color_b: Color
    n_sectors: int = 6
    specular: float = 0.35
    phase: float = 0.0


@dataclass(frozen=True)
class Box:
    """An axis-aligned box: ``center``, ``half_size`` per axis. Faces are ``color`` with a ``frame_color`` border."""

    center: tuple[float, float, float]
    half_size: tuple[float, float, float]
    color: Color
    frame_color: Color
    frame_width: float = 0.06


@dataclass(frozen=True)
class Ground:
    """The square ``|x|, |y| <= half_size`` at ``z = 0``, a checkerboard of ``cell`` metres."""

    half_size: float
    cell: float
    color_a: Color
    color_b: Color


@dataclass
class ProceduralScene:
    """Analytic primitives and a directional light, rendered by :meth:`render`.

    Attributes:
        name: the scene's name, as in ``framegraph fit --synthetic NAME``.
        ground, spheres, boxes: the geometry, in metres with z up.
        light_dir: unit direction *towards* the light.
        ambient: fraction of the albedo seen in shadow.
        background: RGB where rays hit nothing. The fit uses the same colour.
        target: the point training cameras look at.
        camera_radius: distance of training cameras from ``target``.
        elevation_deg: min and max camera elevations above the ground plane.
        fov_deg: vertical field of view of the cameras.
        shadows: cast hard shadows from the spheres and boxes. Off: every surface facing the light is lit.
    """

    name: str
    ground: Ground
    spheres: list[Sphere] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    light_dir: tuple[float, float, float] = (0.45, -0.35, 0.82)
    ambient: float = 0.35
    background: Color = (0.0, 0.0, 0.0)
    target: tuple[float, float, float] = (0.0, 0.0, 0.3)
    camera_radius: float = 3.3
    elevation_deg: tuple[float, float] = (12.0, 50.0)
    fov_deg: float = 50.0
    shadows: bool = True

    # ------------------------------------------------------------------
    # Cameras
    # ------------------------------------------------------------------
    @property
    def bounds(self) -> tuple[Tensor, Tensor]:
        """Axis-aligned bounds ``(lo [3], hi [3])`` of all geometry."""
        g = self.ground.half_size
        lo, hi = [-g, -g, 0.0], [g, g, 0.0]
        for s in self.spheres:
            for k in range(3):
                lo[k], hi[k] = min(lo[k], s.center[k] - s.radius), max(hi[k], s.center[k] + s.radius)
        for b in self.boxes:
            for k in range(3):
                lo[k], hi[k] = min(lo[k], b.center[k] - b.half_size[k]), max(hi[k], b.center[k] + b.half_size[k])
        return torch.tensor(lo), torch.tensor(hi)

    def views(self, n: int, width: int, height: int, *, seed: int = 0, offset: float = 0.0) -> CameraPath:
        """``n`` cameras around :attr:`target` at :attr:`camera_radius`, looking at it.

        Azimuths are evenly spaced, plus a seeded jitter. ``offset`` shifts them by that share of one spacing.
        So ``offset=0.5`` gives held-out views between the ``offset=0`` ones. Elevations sweep
        :attr:`elevation_deg` in a low-discrepancy order. Deterministic in ``seed``.
        """
        if n < 1:
            raise ValueError(f"views: n must be >= 1, got {n}")
        g = torch.Generator().manual_seed(seed)
        step = 360.0 / n
        az = (torch.arange(n, dtype=torch.float64) + offset) * step
        az = az + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 0.3 * step
        golden = (math.sqrt(5.0) - 1.0) / 2.0
        u = torch.remainder(torch.arange(n, dtype=torch.float64) * golden + 0.5 * offset + 0.1, 1.0)
        lo, hi = self.elevation_deg
        el = torch.deg2rad(lo + (hi - lo) * u)
        az = torch.deg2rad(az)
        target = torch.tensor(self.target, dtype=torch.float64)
        dirs = torch.stack([torch.cos(el) * torch.cos(az), torch.cos(el) * torch.sin(az), torch.sin(el)], -1)
        eyes = target + self.camera_radius * dirs
        viewmats = look_at(eyes, target.expand_as(eyes), (0.0, 0.0, 1.0))
        K = intrinsics(width, height, fov_deg=self.fov_deg)
        return CameraPath(viewmats, K.expand(n, 3, 3).clone(), width, height)

    # ------------------------------------------------------------------
    # Rendering
    # ------------------------------------------------------------------
    @torch.no_grad()
    def render(self, viewmats: Tensor, Ks: Tensor, width: int, height: int, *,
               supersample: int = 2) -> tuple[Tensor, Tensor]:
        """Ray-cast ``C`` views.

        Args:
            viewmats: ``[C, 4, 4]`` world-to-camera, OpenCV axes.
            Ks: ``[C, 3, 3]`` intrinsics in pixels.
            width, height: image size in pixels.
            supersample: ``s`` gives ``s x s`` rays per pixel, box-filtered for anti-aliasing.

        Returns:
            ``images [C, H, W, 3]`` float32 RGB in [0, 1] and ``depth [C, H, W]`` float32. Depth is the camera z
            of the surface seen through the pixel centre. It is ``inf`` on background.
        """
        if viewmats.dim() != 3 or viewmats.shape[1:] != (4, 4) or Ks.shape != (viewmats.shape[0], 3, 3):
            raise ValueError(f"render: viewmats must be [C, 4, 4] and Ks [C, 3, 3], got {list(viewmats.shape)} "
                             f"and {list(Ks.shape)}")
        s = int(supersample)
        if s < 1:
            raise ValueError(f"render: supersample must be >= 1, got {supersample}")
        images, depths = [], []
        sub = (torch.arange(s, dtype=torch.float64) + 0.5) / s  # s sample offsets inside a pixel
        xs = (torch.arange(width, dtype=torch.float64)[:, None] + sub).reshape(-1)
        ys = (torch.arange(height, dtype=torch.float64)[:, None] + sub).reshape(-1)
        for view, K in zip(viewmats.double(), Ks.double()):
            rgb, _ = self._cast(view, K, xs, ys)  # [H*s, W*s, 3]
            images.append(rgb.reshape(height, s, width, s, 3).mean(dim=(1, 3)).float())
            _, depth = self._cast(view, K, torch.arange(width, dtype=torch.float64) + 0.5,
                                  torch.arange(height, dtype=torch.float64) + 0.5)
            depths.append(depth.float())
        return torch.stack(images), torch.stack(depths)

    @staticmethod
    def _rays(view: Tensor, K: Tensor, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rays through pixel positions ``u, v`` in pixels, x right and y down. They have any shape ``S``.

        Returns unit world-space directions ``[*S, 3]`` and the camera centre ``[3]``. Also the camera z per unit
        of ray length ``[*S]``, which turns ray distance into depth.
        """
        fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
        d_cam = torch.stack([(u - cx) / fx, (v - cy) / fy, torch.ones_like(u)], dim=-1)
        norm = d_cam.norm(dim=-1, keepdim=True)
        R, t = view[:3, :3], view[:3, 3]
        d_world = (d_cam / norm) @ R  # R^T d for each ray
        return d_world, -(R.T @ t), 1.0 / norm[..., 0]

    def _cast(self, view: Tensor, K: Tensor, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """Colours ``[len(ys), len(xs), 3]`` and camera-z depth on the grid ``xs x ys``. A miss is inf."""
        v, u = torch.meshgrid(ys, xs, indexing="ij")
        d, o, z_per_t = self._rays(view, K, u, v)
        hit = self._intersect(o.expand_as(d), d)
        depth = torch.where(hit["t"] < _FAR, hit["t"] * z_per_t, torch.full_like(hit["t"], math.inf))
        return self._shade(o, d, hit), depth

    def _shade(self, o: Tensor, d: Tensor, hit: dict[str, Tensor]) -> Tensor:
        """Colour ``[..., 3]`` of rays ``o + t d`` given their nearest hits. A miss gets the background."""
        t, n, albedo, spec = hit["t"], hit["normal"], hit["albedo"], hit["specular"]
        p = o + t[..., None] * d
        light = torch.tensor(self.light_dir, dtype=torch.float64)
        light = light / light.norm()
        lambert = (n @ light).clamp(min=0.0)
        lit = lambert
        if self.shadows:  # hard shadows: can the light be seen from just above the surface?
            blocked = self._intersect(p + 1e-4 * n, light.expand_as(p), objects_only=True)["t"] < _FAR
            lit = lambert * (~blocked).to(lambert.dtype)
        color = albedo * (self.ambient + (1.0 - self.ambient) * lit[..., None])
        reflect = light - 2.0 * (light * n).sum(-1, keepdim=True) * n  # light mirrored, pointing into the surface
        highlight = (-(reflect * d).sum(-1)).clamp(min=0.0) ** 24  # reflect . (-d) points to the viewer
        color = color + (spec * highlight * lit)[..., None]
        miss = t >= _FAR
        bg = torch.tensor(self.background, dtype=torch.float64)
        return torch.where(miss[..., None], bg, color.clamp(0.0, 1.0))

    def _intersect(self, o: Tensor, d: Tensor, *, objects_only: bool = False) -> dict[str, Tensor]:
        """Nearest intersection along rays ``o + t d``. Each is ``[..., 3]``; ``d`` is unit.

        Returns ``t [...]``, ``normal [..., 3]``, ``albedo [..., 3]`` and ``specular [...]``. A miss has
        ``t >= _FAR``.
        """
        shape = d.shape[:-1]
        best_t = torch.full(shape, _FAR, dtype=d.dtype)
        normal = torch.zeros(shape + (3,), dtype=d.dtype)
        albedo = torch.zeros(shape + (3,), dtype=d.dtype)
        specular = torch.zeros(shape, dtype=d.dtype)
        eps = 1e-6

        def keep(t: Tensor, n: Tensor, a: Tensor, s: float) -> None:
            closer = t < best_t
            best_t.copy_(torch.where(closer, t, best_t))
            normal.copy_(torch.where(closer[..., None], n, normal))
            albedo.copy_(torch.where(closer[..., None], a, albedo))
            specular.copy_(torch.where(closer, torch.full_like(t, s), specular))

        if not objects_only:
            g = self.ground
            t = torch.where(d[..., 2] < -eps, -o[..., 2] / d[..., 2].clamp(max=-eps),
                            torch.full(shape, _FAR, dtype=d.dtype))
            p = o + t[..., None] * d
            inside = (p[..., 0].abs() <= g.half_size) & (p[..., 1].abs() <= g.half_size) & (t > eps)
            t = torch.where(inside, t, torch.full_like(t, _FAR))
            cell = (torch.floor(p[..., 0] / g.cell) + torch.floor(p[..., 1] / g.cell)).remainder(2) == 0
            a = torch.where(cell[..., None], _c(g.color_a), _c(g.color_b))
            keep(t, _c((0.0, 0.0, 1.0)).expand_as(p), a, 0.0)

        for s in self.spheres:
            c = torch.tensor(s.center, dtype=d.dtype)
            t, meets = ray_sphere(o, d, c, s.radius)
            t = torch.where(meets & (t > eps), t, torch.full_like(t, _FAR))
            p = o + t[..., None] * d
            n = (p - c) / s.radius
            angle = torch.atan2(n[..., 1], n[..., 0]) - s.phase  # sectors around the sphere's z axis
            sector = torch.floor((angle + math.pi) / (2 * math.pi) * s.n_sectors).remainder(2) == 0
            a = torch.where(sector[..., None], _c(s.color_a), _c(s.color_b))
            keep(t, n, a, s.specular)

        for bx in self.boxes:
            c, h = torch.tensor(bx.center, dtype=d.dtype), torch.tensor(bx.half_size, dtype=d.dtype)
            inv = 1.0 / torch.where(d.abs() < 1e-12, torch.full_like(d, 1e-12), d)
            t0, t1 = (c - h - o) * inv, (c + h - o) * inv
            t_near = torch.minimum(t0, t1).max(dim=-1)
            t_far = torch.maximum(t0, t1).min(dim=-1).values
            t = t_near.values
            ok = (t <= t_far) & (t > eps)
            t = torch.where(ok, t, torch.full_like(t, _FAR))
            axis = t_near.indices  # the slab entered last is the face hit
            n = torch.zeros_like(d).scatter_(-1, axis[..., None], 1.0) * -torch.sign(d)
            p = o + t[..., None] * d
            # Border: within frame_width of an edge on the face (the two in-face coordinates).
            local = ((p - c) / h).abs()
            in_face = torch.where(n.abs() > 0.5, torch.zeros_like(local), local)
            edge = (in_face > 1.0 - bx.frame_width / h.min()).any(dim=-1)
            a = torch.where(edge[..., None], _c(bx.frame_color), _c(bx.color))
            shade = 1.0 - 0.12 * axis.to(d.dtype)  # a slightly different tint per face axis
            keep(t, n, a * shade[..., None], 0.05)

        return {"t": best_t, "normal": normal, "albedo": albedo, "specular": specular}

    # ------------------------------------------------------------------
    # Point cloud (what structure-from-motion would give)
    # ------------------------------------------------------------------
    @torch.no_grad()
    def sample_points(self, n: int, *, seed: int = 0, n_views: int = 16, width: int = 64,
                      height: int = 48) -> tuple[Tensor, Tensor]:
        """About ``n`` surface points with colours, as an SfM-like point cloud ``([M, 3], [M, 3])``.

        Points are the surfaces seen through randomly chosen pixels of ``n_views`` cameras. So only visible
        surfaces get points. Colours are the rendered pixel colours. Deterministic in ``seed``.
        """
        views = self.views(n_views, width, height, seed=seed + 7919, offset=0.25)
        g = torch.Generator().manual_seed(seed)
        pts, cols, have = [], [], 0
        for _ in range(8):  # rays that miss (background) give no point: draw until there are n
            per_view = max(1, math.ceil(2 * (n - have) / n_views))
            for view, K in zip(views.viewmats.double(), views.Ks.double()):
                u = torch.rand(per_view, generator=g, dtype=torch.float64) * width
                v = torch.rand(per_view, generator=g, dtype=torch.float64) * height
                d, o, _ = self._rays(view, K, u, v)
                hit = self._intersect(o.expand_as(d), d)
                ok = hit["t"] < _FAR
                pts.append((o + hit["t"][..., None] * d)[ok])
                cols.append(self._shade(o, d, hit)[ok])
                have += int(ok.sum())
            if have >= n:
                break
        pts, cols = torch.cat(pts), torch.cat(cols)
        pick = torch.randperm(pts.shape[0], generator=g)[:n]  # an unbiased n of them
        return pts[pick].float(), cols[pick].float()


def ray_sphere(o: Tensor, d: Tensor, center: Tensor, radius: float) -> tuple[Tensor, Tensor]:
    """Distance ``t [...]`` along rays ``o, d [..., 3]`` to where they enter a sphere. ``d`` is unit.

    Also whether they meet it at all, ``[...]`` bool. A ray that does may still enter behind its origin."""
    oc = o - center
    b = (oc * d).sum(-1)
    disc = b * b - ((oc * oc).sum(-1) - radius ** 2)
    return -b - torch.sqrt(disc.clamp(min=0.0)), disc > 0


def _c(rgb: Sequence[float]) -> Tensor:
    return torch.tensor(rgb, dtype=torch.float64)


def toy_scene() -> ProceduralScene:
    """A checkered ground square with a beach ball, a framed box and a small sphere. About 3 m across."""
    return ProceduralScene(
        name="toy",
        ground=Ground(half_size=1.5, cell=0.375, color_a=(0.85, 0.82, 0.75), color_b=(0.30, 0.33, 0.40)),
        spheres=[
            Sphere(center=(-0.45, 0.35, 0.5), radius=0.5, color_a=(0.90, 0.20, 0.15), color_b=(0.95, 0.92, 0.85)),
            Sphere(center=(0.75, 0.70, 0.25), radius=0.25, color_a=(0.95, 0.80, 0.15),
                   color_b=(0.95, 0.80, 0.15), n_sectors=2),
        ],
        boxes=[
            Box(center=(0.5, -0.55, 0.35), half_size=(0.35, 0.35, 0.35), color=(0.20, 0.45, 0.85),
                frame_color=(0.95, 0.95, 0.95)),
        ],
    )


SCENES = {"toy": toy_scene}

BOUNCING_BALL_DURATION_S = 2.0  # the dynamic scene below loops every 2 s


def bouncing_ball_scene(t: float) -> ProceduralScene:
    """The 4DGS demo's ground truth at time ``t`` seconds.

    It has the toy scene's checkered floor and a red-and-white beach ball. The ball bounces twice per loop along
    a figure-eight. It spins one turn per loop. Three coloured blobs drift in loops, swell and shrink away, and
    shift hue.

    Everything is periodic in :data:`BOUNCING_BALL_DURATION_S`, so the scene loops seamlessly. There are no
    shadows and no specular highlights. Each surface point's colour depends on time only. A 4D Gaussian's
    constant colour can follow that.
    """
    w = 2 * math.pi / BOUNCING_BALL_DURATION_S
    u = (t / (BOUNCING_BALL_DURATION_S / 2)) % 1.0  # bounce phase: on the floor at u = 0
    r = 0.3
    ball = Sphere(center=(0.7 * math.sin(w * t), 0.45 * math.sin(2 * w * t), r + 0.8 * 4 * u * (1 - u)),
                  radius=r, color_a=(0.92, 0.15, 0.1), color_b=(0.95, 0.93, 0.88), specular=0.0, phase=w * t)
    blobs = []
    for k, (centre, rgb_a, rgb_b) in enumerate([((-0.85, 0.8, 0.9), (0.1, 0.85, 0.3), (0.1, 0.6, 0.95)),
                                                 ((0.9, 0.75, 0.7), (0.95, 0.2, 0.8), (0.95, 0.75, 0.1)),
                                                 ((0.2, -0.95, 1.1), (0.1, 0.8, 0.95), (0.6, 0.2, 0.95))]):
        phase = w * t + 2 * math.pi * k / 3
        size = math.sin(phase)  # swells for half the loop, gone for the other half
        if size <= 0:
            continue
        mix = 0.5 - 0.5 * math.cos(phase)
        rgb = tuple(a + (b - a) * mix for a, b in zip(rgb_a, rgb_b))
        c = (centre[0] + 0.25 * math.cos(phase), centre[1] + 0.25 * math.sin(phase), centre[2])
        blobs.append(Sphere(center=c, radius=0.2 * size, color_a=rgb, color_b=rgb, n_sectors=2, specular=0.0))
    toy = toy_scene()
    return ProceduralScene(name="bouncing_ball", ground=toy.ground, spheres=[ball] + blobs, shadows=False)


def procedural_scene(name: str) -> ProceduralScene:
    """The procedural scene called ``name``; see :data:`SCENES`."""
    try:
        return SCENES[name]()
    except KeyError:
        raise ValueError(f"unknown procedural scene {name!r}; available: {', '.join(sorted(SCENES))}") from None


__all__ = ["ProceduralScene", "Sphere", "Box", "Ground", "toy_scene", "procedural_scene", "SCENES",
           "bouncing_ball_scene", "BOUNCING_BALL_DURATION_S"]
