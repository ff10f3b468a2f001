"""A picture with alpha placed in a rendered scene. It is a textured quad standing at a 3D position. It is
perspective-correct and depth-tested against the scene's depth. A soft contact shadow lies on the ground under it.

    render (layers=True) ─video, depth, opacity, camera─┐
                                                        ├─▶ QuadInScene ──video uint8 [H, W, 3]──▶ encode / sink
    any picture stage ──image uint8 [h, w, 3], alpha [h, w]─┘

Why here: placing a quad is camera math, with :func:`~.cameras.pixel_rays` and :func:`~.cameras.project_points`.
Depth-testing it needs the renderers' depth and opacity layers: a :class:`~.stages.RenderStage` with ``layers``.
The picture is any RGBA stream. This module knows nothing of avatars. ``models`` and ``renderers`` do not import
each other. ``apps/scene_avatar`` joins an avatar's picture and matte to a scene with it.

Geometry is in world units, with ``up`` = +z as the scenes are stored. The quad's bottom edge is centred on the
:class:`Placement`'s ``anchor``, where the person stands. It is ``height`` tall and ``height · w / h`` wide, the
picture's aspect. It stands upright. With ``yaw_deg`` None it faces the camera: it turns about ``up`` to face each
camera's centre. With ``yaw_deg`` set it faces a fixed direction: 0 faces −y, 90 faces +x. Texture coordinates
``u, v`` run left → right and top → bottom of the picture. For each pixel, the ray through its centre meets the
quad's plane at camera-z depth ``s``; see :func:`quad_hits`. The picture is sampled there, bilinear. That is exact
per pixel, so perspective-correct by construction.

Compositing is per pixel, colours in [0, 1]; see :func:`composite_quad`. The scene's picture ``C`` holds its own
background colour ``bg`` where its opacity ``A`` is below 1. The quad has colour ``q`` and alpha ``a``.

- Where the quad is nearer than the scene's depth, it goes over: ``C + a · (q − C)``. It also goes over where
  the scene is empty.
- Where the scene is nearer, the quad shows only through what the scene leaves uncovered:
  ``C + (1 − A) · a · (q − bg)``. So a Gaussian in front hides the person exactly where it is opaque. Its soft
  edge lets the person through.
- Before that, the contact shadow darkens ``C`` by ``shadow · exp(−2 (r / R)²)``. ``r < R`` is the distance from
  the anchor on the ground plane. ``R`` is half the quad's width. It applies where no scene content stands in
  front of that ground point.
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
    """Where a picture stands in a scene. See the module docstring.

    Attributes:
        anchor: ``(x, y, z)`` world position of the bottom centre of the picture.
        height: its height in world units, > 0.
        yaw_deg: the fixed direction it faces. 0 is −y, 90 is +x. None: it faces the camera.
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
        """The quad's ``right``, ``up`` and ``normal`` world unit vectors ``[3]``. ``normal`` points towards its
        viewer, a camera at ``camera_center [3]``."""
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
        """The world point ``[3]`` of texture coordinates ``u, v`` of a picture seen from ``camera_center``.

        ``u, v`` run 0..1, left → right and top → bottom. ``aspect`` is width / height."""
        right, up, _ = self.axes(camera_center)
        anchor = torch.tensor(self.anchor, dtype=torch.float32, device=camera_center.device)
        return anchor + (u - 0.5) * self.height * aspect * right + (1.0 - v) * self.height * up

    def moved(self, **changes) -> Placement:
        return replace(self, **changes)


def quad_hits(placement: Placement, aspect: float, origin: Tensor, dirs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Where rays ``origin [3] + s · dirs [..., 3]`` meet the quad.

    ``dirs`` are camera-z-scaled, as :func:`~.cameras.pixel_rays` makes them. Returns texture coordinates
    ``uv [..., 2]``, depth ``s [...]`` and ``inside [...]``. ``inside`` is bool: in front of the camera and within
    the picture."""
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
    """The soft contact shadow for rays ``origin + s · dirs [..., 3]``.

    Each ray meets the ground plane through the anchor. Returns the darkening there ``[...]``, 0..``strength``,
    and that point's depth ``s [...]``."""
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
    """``(x0, y0, x1, y1)``: the pixels the quad and its shadow can touch. Only these are computed.

    It is the box of their projected corners, clipped to the frame. It is the whole frame when a corner lies behind
    the camera."""
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
    """The scene's picture with ``image`` placed in it. See the module docstring.

    Args:
        scene: ``uint8 [H, W, 3]`` the rendered scene, over its ``background``, RGB in [0, 1].
        depth / opacity: ``float32 [H, W]`` the scene's layers. See :class:`~.stages.RenderStage`, ``layers``.
        image / alpha: ``uint8 [h, w, 3]`` and ``uint8 [h, w]`` the picture and its matte. 255 is opaque.
        placement: where it stands. viewmat / K: the camera the scene was rendered from.
        shadow: the contact shadow's darkest share. 0: none.
        window: compute only the pixels the quad and its shadow can touch, by :func:`quad_window`. False computes
            every pixel. The result is the same: it is the readable twin.
        out: ``uint8 [H, W, 3]`` to write into. It may be ``scene``. A new tensor otherwise.
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
    """Places each incoming picture, with its matte, in the scene frame rendered for the same instant.

    Args:
        placement: where the picture stands. :meth:`set_placement` changes it from any thread, from the next frame.
        image_size: ``(h, w)`` of the pictures. frame_size: ``(H, W)`` of the scene frames.
        background: the scene render's background colour, RGB in [0, 1]. Its picture shows it where it is empty.
        shadow: the contact shadow's strength. 0: none.
        matte: the pictures come with their matte on ``"alpha"``. False: they are opaque, like a screen in the
            scene.
        device: where the picture arrives and the blend runs. The scene's layers and the output stay on the
            host. On CUDA the layers go up from pinned slots and the frame comes down without a wait.

    Ports:
        in: ``"image"`` ``uint8 [h, w, 3]``. ``"alpha"`` ``uint8 [h, w]``, the picture's, with ``matte``.
            ``"video"`` ``uint8 [H, W, 3]``, ``"depth"`` / ``"opacity"`` ``float32 [H, W]`` and ``"camera"``
            ``float32 [2, 4, 4]``. These are the scene's, from a :class:`~.stages.RenderStage` with ``layers``.
        out: ``"video"`` ``uint8 [H, W, 3]``, with the picture's pts. Its ports come first. On a shared clock
            both branches stamp the same pts for the same instant.
    """

    def __init__(self, placement: Placement, *, image_size: tuple[int, int], frame_size: tuple[int, int],
                 background=(0.0, 0.0, 0.0), shadow: float = 0.5, matte: bool = True, device: str = "cpu",
                 name: str = "quad_in_scene"):
        super().__init__(name)
        (h, w), (H, W) = image_size, frame_size
        self.inputs = {"image": PortSpec((h, w, 3), torch.uint8, device),
                       "alpha": PortSpec((h, w), torch.uint8, device),
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
        out.write("video").data.copy_(frame, non_blocking=True)


__all__ = ["Placement", "quad_hits", "contact_shadow", "quad_window", "composite_quad", "QuadInScene", "UP", "NEAR"]
