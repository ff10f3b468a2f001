"""A picture with alpha placed in a rendered scene: a textured quad standing at a 3D position, perspective-correct,
depth-tested against the scene's depth, with a soft contact shadow on the ground under it.

    render (layers=True) ─video, depth, opacity, camera─┐
                                                        ├─▶ QuadInScene ──video uint8 [H, W, 3]──▶ encode / sink
    any picture stage ──image uint8 [h, w, 3], alpha [h, w]─┘

Why here: placing a quad is camera math (:func:`~.cameras.pixel_rays`, :func:`~.cameras.project_points`) and
depth-testing it needs the renderers' depth and opacity layers (:class:`~.stages.RenderStage` with ``layers``); the
picture is any RGBA stream — this module knows nothing of avatars (``models`` and ``renderers`` do not import each
other: ``apps/scene_avatar`` joins an avatar's picture and matte to a scene with it).

Geometry (world units, ``up`` = +z as the scenes are stored): the quad's bottom edge is centred on the
:class:`Placement`'s ``anchor`` (where the person stands), it is ``height`` tall and ``height · w / h`` wide (the
picture's aspect), upright, and faces either the camera (``yaw_deg`` None: it turns about ``up`` to face each
camera's centre) or a fixed direction (``yaw_deg``: 0 faces −y, 90 faces +x). Texture coordinates ``(u, v)`` run
left → right and top → bottom of the picture. For each pixel the ray through its centre meets the quad's plane at
camera-z depth ``s`` (:func:`quad_hits`); the picture is sampled there (bilinear, so exact per pixel: perspective-
correct by construction).

Compositing per pixel, colours in [0, 1] (:func:`composite_quad`): the scene's picture ``C`` holds its own
background colour ``bg`` where its opacity ``A`` is below 1; the quad's colour ``q`` and alpha ``a``. Where the quad
is nearer than the scene's depth (or the scene is empty there) it goes over: ``C + a · (q − C)``; where the scene is
nearer, the quad shows only through what the scene leaves uncovered: ``C + (1 − A) · a · (q − bg)`` — so a Gaussian
in front hides the person exactly where it is opaque and lets it through its soft edge. Before that the contact
shadow darkens ``C`` by ``shadow · exp(−2 (r / R)²)`` at distance ``r < R`` (``R``: half the quad's width) from the
anchor on the ground plane, where no scene content stands in front of that ground point.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.stream import PortSpec, Stage

from .cameras import camera_centers, pixel_rays, project_points
from .stages import CAMERA_PORT

UP = (0.0, 0.0, 1.0)
NEAR = 1e-3  # nearest camera-z depth (world units) at which the quad or the shadow is drawn
OPAQUE_EPS = 1e-4  # a scene opacity below this is empty: its depth says nothing


@dataclass(frozen=True)
class Placement:
    """Where a picture stands in a scene (see the module docstring).

    Attributes:
        anchor: ``(x, y, z)`` world position of the bottom centre of the picture.
        height: its height in world units (> 0).
        yaw_deg: the direction it faces, fixed (0: −y, 90: +x); None: it faces the camera.
    """

    anchor: tuple[float, float, float]
    height: float
    yaw_deg: float | None = None

    def __post_init__(self):
        if len(self.anchor) != 3 or not all(math.isfinite(float(v)) for v in self.anchor):
            raise ValueError(f"placement anchor {self.anchor}: expected three finite numbers x, y, z")
        if not self.height > 0:
            raise ValueError(f"placement height {self.height}: expected a height > 0 (world units)")

    def axes(self, camera_center: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The quad's ``right``, ``up`` and ``normal`` (towards its viewer) world unit vectors ``[3]`` for a camera
        at ``camera_center [3]``."""
        up = torch.tensor(UP, dtype=torch.float32, device=camera_center.device)
        if self.yaw_deg is None:
            n = camera_center.float() - torch.tensor(self.anchor, dtype=torch.float32, device=camera_center.device)
            n = n - (n @ up) * up  # turn about up only: the picture stays upright
            if float(n.norm()) < 1e-6:  # a camera straight above: keep the default facing
                n = torch.tensor((0.0, -1.0, 0.0), device=camera_center.device)
        else:
            yaw = math.radians(self.yaw_deg)
            n = torch.tensor((math.sin(yaw), -math.cos(yaw), 0.0), device=camera_center.device)
        n = n / n.norm()
        return torch.linalg.cross(up, n), up, n

    def world_point(self, u: float, v: float, aspect: float, camera_center: Tensor) -> Tensor:
        """The world point ``[3]`` of texture coordinates ``(u, v)`` (0..1, left → right, top → bottom) of a picture
        of ``aspect`` = width / height, seen from ``camera_center``."""
        right, up, _ = self.axes(camera_center)
        anchor = torch.tensor(self.anchor, dtype=torch.float32, device=camera_center.device)
        return anchor + (u - 0.5) * self.height * aspect * right + (1.0 - v) * self.height * up

    def moved(self, **changes) -> Placement:
        return replace(self, **changes)


def quad_hits(placement: Placement, aspect: float, origin: Tensor, dirs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Where rays ``origin [3] + s · dirs [..., 3]`` (camera-z-scaled, :func:`~.cameras.pixel_rays`) meet the quad:
    texture coordinates ``uv [..., 2]``, depth ``s [...]`` and ``inside [...]`` (bool: in front of the camera and
    within the picture)."""
    right, up, n = placement.axes(origin)
    anchor = torch.tensor(placement.anchor, dtype=torch.float32, device=origin.device)
    denom = dirs @ n
    s = ((anchor - origin) @ n) / torch.where(denom.abs() > 1e-12, denom, torch.full_like(denom, 1e-12))
    rel = origin + s[..., None] * dirs - anchor
    u = (rel @ right) / (placement.height * aspect) + 0.5
    v = 1.0 - (rel @ up) / placement.height
    inside = (s > NEAR) & (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
    return torch.stack([u, v], -1), s, inside


def contact_shadow(placement: Placement, aspect: float, origin: Tensor, dirs: Tensor, strength: float
                   ) -> tuple[Tensor, Tensor]:
    """The soft contact shadow for rays ``origin + s · dirs [..., 3]``: its darkening ``[...]`` (0..``strength``)
    where each ray meets the ground plane through the anchor, and that point's depth ``s [...]``."""
    up = torch.tensor(UP, dtype=torch.float32, device=origin.device)
    anchor = torch.tensor(placement.anchor, dtype=torch.float32, device=origin.device)
    denom = dirs @ up
    s = ((anchor - origin) @ up) / torch.where(denom.abs() > 1e-12, denom, torch.full_like(denom, 1e-12))
    r = (origin + s[..., None] * dirs - anchor).norm(dim=-1)
    radius = 0.5 * placement.height * aspect
    dark = strength * torch.exp(-2.0 * (r / radius) ** 2) * (r < radius) * (s > NEAR)
    return dark, s


def quad_window(placement: Placement, aspect: float, viewmat: Tensor, K: Tensor, width: int, height: int
                ) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)``: the pixels the quad and its shadow can touch (the box of their projected corners,
    clipped to the frame; the whole frame when a corner lies behind the camera). Only these are computed."""
    center = camera_centers(viewmat.float())
    right, up, n = placement.axes(center)
    anchor = torch.tensor(placement.anchor, dtype=torch.float32)
    w, r = placement.height * aspect, 0.5 * placement.height * aspect
    corners = [anchor + a * w * right + b * placement.height * up for a in (-0.5, 0.5) for b in (0.0, 1.0)]
    corners += [anchor + a * r * right + b * r * n for a in (-1, 1) for b in (-1, 1)]  # the shadow's square
    uv, z = project_points(torch.stack(corners), viewmat.float(), K.float())
    if bool((z <= NEAR).any()):
        return 0, 0, width, height
    x0, y0 = (int(math.floor(float(c))) - 1 for c in uv.min(0).values)
    x1, y1 = (int(math.ceil(float(c))) + 1 for c in uv.max(0).values)
    return max(0, x0), max(0, y0), min(width, x1), min(height, y1)


def composite_quad(scene: Tensor, depth: Tensor, opacity: Tensor, image: Tensor, alpha: Tensor,
                   placement: Placement, viewmat: Tensor, K: Tensor, *, background=(0.0, 0.0, 0.0),
                   shadow: float = 0.5, window: bool = True, out: Tensor | None = None) -> Tensor:
    """The scene's picture with ``image`` placed in it (see the module docstring).

    Args:
        scene: ``uint8 [H, W, 3]`` the rendered scene (over its ``background``, RGB in [0, 1]).
        depth / opacity: ``float32 [H, W]`` the scene's layers (:class:`~.stages.RenderStage`, ``layers``).
        image / alpha: ``uint8 [h, w, 3]`` and ``uint8 [h, w]`` the picture and its matte (255: opaque).
        placement: where it stands. viewmat / K: the camera the scene was rendered from.
        shadow: the contact shadow's darkest share (0: none).
        window: compute only the pixels the quad and its shadow can touch (:func:`quad_window`); False computes
            every pixel (the same result: the readable twin).
        out: ``uint8 [H, W, 3]`` to write into (may be ``scene``); a new tensor otherwise.
    Returns ``out``.
    """
    H, W = scene.shape[:2]
    h, w = image.shape[:2]
    aspect = w / h
    out = scene.clone() if out is None else (out if out is scene else out.copy_(scene))
    x0, y0, x1, y1 = quad_window(placement, aspect, viewmat, K, W, H) if window else (0, 0, W, H)
    if x1 <= x0 or y1 <= y0:
        return out
    origin, dirs = pixel_rays(viewmat.to(scene.device), K.to(scene.device), x0, y0, x1, y1)
    uv, s_quad, inside = quad_hits(placement, aspect, origin, dirs)
    rgba = torch.cat([image.permute(2, 0, 1), alpha[None]]).float()[None] / 255.0  # [1, 4, h, w]
    tex = F.grid_sample(rgba, (uv * 2 - 1)[None], mode="bilinear", padding_mode="border", align_corners=False)[0]
    q, a = tex[:3].permute(1, 2, 0), tex[3] * inside  # [h', w', 3], [h', w']
    C = scene[y0:y1, x0:x1].float() / 255.0
    A = opacity[y0:y1, x0:x1]
    D = torch.where(A > OPAQUE_EPS, depth[y0:y1, x0:x1], torch.full_like(A, math.inf))
    if shadow > 0:
        dark, s_ground = contact_shadow(placement, aspect, origin, dirs, shadow)
        dark = dark * (D > s_ground - 0.02 * placement.height)  # scene content in front of the ground point hides it
        C = C * (1.0 - dark[..., None])
    bg = torch.tensor(background, dtype=torch.float32, device=scene.device)
    front = (s_quad < D)[..., None]
    blended = torch.where(front, C + a[..., None] * (q - C), C + ((1.0 - A) * a)[..., None] * (q - bg))
    out[y0:y1, x0:x1] = (blended * 255.0).round_().clamp_(0, 255).to(torch.uint8)
    return out


class QuadInScene(Stage):
    """Places each incoming picture (with its matte) in the scene frame rendered for the same instant.

    Args:
        placement: where the picture stands (:meth:`set_placement` changes it from any thread, from the next frame).
        image_size: ``(h, w)`` of the pictures. frame_size: ``(H, W)`` of the scene frames.
        background: the scene render's background colour (RGB in [0, 1]: what its picture shows where it is empty).
        shadow: the contact shadow's strength (0: none).
        matte: the pictures come with their matte on ``"alpha"``; False: they are opaque (a screen in the scene).

    Ports: in ``"image"`` ``uint8 [h, w, 3]``, ``"alpha"`` ``uint8 [h, w]`` (the picture's, with ``matte``), ``"video"``
    ``uint8 [H, W, 3]``, ``"depth"`` / ``"opacity"`` ``float32 [H, W]``, ``"camera"`` ``float32 [2, 4, 4]`` (the
    scene's, from a :class:`~.stages.RenderStage` with ``layers``); out ``"video"`` ``uint8 [H, W, 3]``, with the
    picture's pts (its ports come first: on a shared clock both branches stamp the same pts for the same instant).
    """

    def __init__(self, placement: Placement, *, image_size: tuple[int, int], frame_size: tuple[int, int],
                 background=(0.0, 0.0, 0.0), shadow: float = 0.5, matte: bool = True, device: str = "cpu",
                 name: str = "quad_in_scene"):
        super().__init__(name)
        (h, w), (H, W) = image_size, frame_size
        self.inputs = {"image": PortSpec((h, w, 3), torch.uint8, "cpu"), "alpha": PortSpec((h, w), torch.uint8, "cpu"),
                       "video": PortSpec((H, W, 3), torch.uint8, "cpu"),
                       "depth": PortSpec((H, W), torch.float32, "cpu"),
                       "opacity": PortSpec((H, W), torch.float32, "cpu"), "camera": CAMERA_PORT}
        if not matte:
            del self.inputs["alpha"]
        self.opaque = torch.full((h, w), 255, dtype=torch.uint8, device=device)
        self.outputs = {"video": PortSpec((H, W, 3), torch.uint8, "cpu")}
        self.background, self.shadow = tuple(float(v) for v in background), float(shadow)
        self.compute_device = str(torch.device(device))
        self._lock = threading.Lock()
        self.placement = placement

    def set_placement(self, placement: Placement) -> None:
        with self._lock:
            self.placement = placement

    @torch.no_grad()
    def process(self, inputs, out):
        with self._lock:
            placement = self.placement
        dev = self.compute_device
        d = {k: f.data.to(dev, non_blocking=True) for k, f in inputs.items()}
        cam = inputs["camera"].data
        frame = composite_quad(d["video"], d["depth"], d["opacity"], d["image"], d.get("alpha", self.opaque), placement,
                               cam[0],
                               cam[1, :3, :3], background=self.background, shadow=self.shadow)
        out.write("video").data.copy_(frame)


__all__ = ["Placement", "quad_hits", "contact_shadow", "quad_window", "composite_quad", "QuadInScene", "UP", "NEAR"]
