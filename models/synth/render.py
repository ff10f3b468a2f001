"""Animate a still portrait: jaw, lips, teeth, blinks and head motion as smooth image warps, in pure torch.

Rendering one frame from :class:`FaceParams`:

1. **Mouth warp**: a backward map through ``grid_sample``. Below the lip line the lower lip, chin and jaw move down by
   ``jaw_open · max_jaw_drop · mouth width``. The profile is lens-shaped at the lips, where the corners stay. Lower
   down it widens to the whole jaw, and it fades out below the chin. Above the line the upper lip lifts a little.
   ``lip_width`` / ``lip_round`` scale the mouth region horizontally: stretch / pucker.
2. **Inner mouth**: the opening between the lips is painted dark red. It is darker at the back, with a tongue tint at
   the bottom. An upper teeth band, and a fainter lower one, have a height that follows ``teeth``. All edges are soft,
   so nothing aliases as the mouth moves.
3. **Blinks**: lid-coloured skin covers each eye's opening from the top, down to ``blink`` of its height. The skin is
   sampled just above the eye. A dark lash line marks the lid's edge.
4. **Head motion**: the whole picture is rotated (roll), shifted and scaled about the neck.

Everything outside the mouth, the eyes and the head motion is the original portrait's pixels.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .portrait import Portrait


@dataclass
class FaceParams:
    """One frame's face state.

    - ``jaw_open`` 0..1, ``lip_width`` -1..1, ``lip_round`` 0..1, ``teeth`` 0..1; see :mod:`.visemes`.
    - ``blink``: 0 is open, 1 is closed.
    - ``head_dx`` / ``head_dy``: shift in px.
    - ``head_roll_deg``: degrees. Positive is clockwise on screen.
    - ``head_scale``: 1 is the portrait's size.
    """

    jaw_open: float = 0.0
    lip_width: float = 0.0
    lip_round: float = 0.0
    teeth: float = 0.0
    blink: float = 0.0
    head_dx: float = 0.0
    head_dy: float = 0.0
    head_roll_deg: float = 0.0
    head_scale: float = 1.0

    def to_json(self) -> dict:
        return {k: round(float(v), 4) for k, v in asdict(self).items()}


def _smoothstep(e0, e1, x):
    t = torch.clamp((x - e0) / (e1 - e0), 0.0, 1.0)
    return t * t * (3 - 2 * t)


def _sat(x):
    return torch.clamp(x, 0.0, 1.0)


_INNER_EDGE = torch.tensor([0.40, 0.15, 0.15])
_INNER_DEEP = torch.tensor([0.10, 0.03, 0.035])
_TONGUE = torch.tensor([0.55, 0.24, 0.25])
_TEETH = torch.tensor([0.93, 0.91, 0.85])


class PortraitRenderer:
    """Renders :class:`FaceParams` on a :class:`Portrait`.

    Args:
        portrait: the image and its mouth / eye boxes.
        max_jaw_drop: lower-lip drop at ``jaw_open = 1``, as a fraction of the mouth width.

    ``render(params)`` → ``uint8 [H, W, 3]``, a torch tensor on the CPU.
    The mouth is computed only in a region around it: everything the warp can move.
    """

    def __init__(self, portrait: Portrait, max_jaw_drop: float = 0.32):
        self.portrait = portrait
        self.max_jaw_drop = max_jaw_drop
        img = torch.from_numpy(np.array(portrait.image, dtype=np.uint8)).permute(2, 0, 1).float() / 255.0
        self.src = img[None]  # [1, 3, H, W]
        h, w = portrait.height, portrait.width
        self.h, self.w = h, w
        mx, my, mw, mh = portrait.mouth_box
        a = mw / 2
        self.a, self.mouth_h = a, mh
        self.cx, self.cy, self.curve = mx + a, float(portrait.lip_line_y), float(portrait.lip_curve)
        self.chin_y = self.cy + 0.75 * mw
        self.pivot = (self.cx, min(h - 1.0, self.chin_y + 0.3 * mw))
        # the region the mouth warp can change (its fields are zero outside)
        x0, x1 = max(0, int(self.cx - 2.5 * a)), min(w, int(math.ceil(self.cx + 2.5 * a)) + 1)
        y0 = max(0, int(self.cy - 1.5 * self.curve - 2.2 * a))
        y1 = min(h, int(math.ceil(self.chin_y + 1.4 * a)) + 2)
        self.roi = (y0, y1, x0, x1)
        self.ys, self.xs = torch.meshgrid(torch.arange(y0, y1, dtype=torch.float32),
                                          torch.arange(x0, x1, dtype=torch.float32), indexing="ij")
        u = (self.xs - self.cx) / a
        self.lip_line = self.cy - self.curve * torch.clamp(u * u, max=1.5)  # [h, w] of the ROI
        self.yy = self.ys - self.lip_line  # px below the lip line
        self._eyes = [self._eye_setup(b) for b in portrait.eye_boxes]
        full_y, full_x = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                                        indexing="ij")
        self._full = (full_x, full_y)

    def _eye_setup(self, box):
        x, y, w, h = box
        ex, ey, rx, ry = x + w / 2, y + h / 2, w / 2 + 0.8, h / 2 + 1.2
        x0, x1 = max(0, int(ex - rx - 2)), min(self.w, int(ex + rx + 3))
        y0, y1 = max(0, int(ey - ry - 2)), min(self.h, int(ey + ry + 3))
        # lid skin: per column, the median of the skin just above and just below the eye (above alone is the
        # crease's shadow on many faces)
        above = self.src[0, :, max(0, int(ey - ry) - 6):max(1, int(ey - ry) - 2), x0:x1]
        below = self.src[0, :, min(self.h - 1, int(ey + ry) + 2):min(self.h, int(ey + ry) + 6), x0:x1]
        skin = torch.cat([above, below], dim=1)
        ys, xs = torch.meshgrid(torch.arange(y0, y1, dtype=torch.float32), torch.arange(x0, x1, dtype=torch.float32),
                                indexing="ij")
        u = (xs - ex) / rx
        r = u * u + ((ys - ey) / ry) ** 2
        return {"box": (y0, y1, x0, x1), "ys": ys, "top": ey - ry, "ry": ry, "ellipse": _sat((1.0 - r) * 3.0),
                "across": _sat((1.0 - u * u) * 3.0), "bulge": 0.3 * ry * _sat(1.0 - u * u),
                "skin": skin.median(dim=1).values.reshape(3, 1, -1)}

    # ---- warps --------------------------------------------------------------------------------
    def _grid(self, sx: torch.Tensor, sy: torch.Tensor) -> torch.Tensor:
        return torch.stack([2.0 * sx / (self.w - 1) - 1.0, 2.0 * sy / (self.h - 1) - 1.0], dim=-1)[None]

    def _mouth_geometry(self, p: FaceParams):
        a = self.a
        k = 0.16 * p.lip_width - 0.22 * p.lip_round  # horizontal scale - 1 of the mouth region
        drop = max(0.0, p.jaw_open) * self.max_jaw_drop * 2 * a
        up = 0.15 * drop + 0.06 * a * p.lip_round * min(1.0, 4 * p.jaw_open)
        u = (self.xs - self.cx) / (a * (1 + k) * 0.95)
        lens = _sat(1 - u * u) ** (0.6 - 0.3 * p.lip_round)  # 1 at the centre, 0 at the corners; rounder
        return k, drop, up, lens

    def _mouth_warp(self, k, drop, up, lens) -> torch.Tensor:
        a, xs, ys, yy = self.a, self.xs, self.ys, self.yy
        jaw = 1.0 - _smoothstep(1.1 * a, 2.3 * a, (xs - self.cx).abs())  # the whole jaw, lower down
        t = _smoothstep(0.0, 0.5 * self.mouth_h + 1.5 * drop + 2.0, yy)
        fade = 1.0 - _smoothstep(self.chin_y, self.chin_y + 1.4 * a, ys)
        dy_down = drop * ((1 - t) * lens + t * jaw) * fade
        dy_up = -up * lens * torch.exp(-(yy / (0.8 * self.mouth_h)) ** 2)
        dy = torch.where(yy >= 0, dy_down, dy_up)
        r2 = ((xs - self.cx) / (2.4 * a)) ** 2 + (yy / (2.0 * a)) ** 2
        dx = (xs - self.cx) * (k / (1 + k)) * _sat(1 - r2) ** 2
        return self._grid(xs - dx, ys - dy)

    def _head_grid(self, p: FaceParams) -> torch.Tensor:
        px, py = self.pivot
        th = math.radians(p.head_roll_deg)
        c, s = math.cos(th), math.sin(th)
        x = (self._full[0] - px - p.head_dx) / p.head_scale
        y = (self._full[1] - py - p.head_dy) / p.head_scale
        return self._grid(px + c * x + s * y, py - s * x + c * y)

    # ---- overlays -----------------------------------------------------------------------------
    def _opening(self, drop, up, lens):
        """(top, bottom, gap, inside) over the ROI.

        These are the opening's upper and lower edges as px rows, their distance, and its soft coverage 0..1.
        """
        top = self.lip_line - up * lens
        bottom = self.lip_line + drop * lens
        gap = bottom - top
        return top, bottom, gap, _sat(self.ys - top - 0.3) * _sat(bottom - self.ys - 0.3) * _sat(gap / 1.5)

    def _paint_mouth(self, roi: torch.Tensor, p: FaceParams, drop, up, lens) -> None:
        ys = self.ys
        top, bottom, gap, inside = self._opening(drop, up, lens)
        if float(inside.max()) <= 0.0:
            return
        depth = _sat((ys - top) / gap.clamp(min=1e-3))  # 0 at the upper lip, 1 at the lower
        to_edge = _sat(torch.minimum(ys - top, bottom - ys) / (0.5 * gap.clamp(min=1.0)) * 1.4)
        color = _INNER_EDGE.view(3, 1, 1) * (1 - to_edge) + _INNER_DEEP.view(3, 1, 1) * to_edge
        tongue = _sat((depth - 0.62) / 0.38) * _sat(gap / (0.35 * self.a)) * 0.7
        color = color * (1 - tongue) + _TONGUE.view(3, 1, 1) * tongue
        th = p.teeth * torch.clamp(0.4 * gap, max=0.24 * self.a) * lens ** 0.3
        upper = _sat(top + th - ys + 0.5) * (th > 0.2)
        lower = _sat(ys - (bottom - 0.5 * th) + 0.5) * (th > 0.4) * 0.6
        teeth_a = torch.clamp(upper + lower, 0, 1) * min(1.0, p.teeth * 1.5)
        teeth_c = _TEETH.view(3, 1, 1) * (0.8 + 0.2 * lens)
        color = color * (1 - teeth_a) + teeth_c * teeth_a
        roi.mul_(1 - inside).add_(color * inside)

    def _paint_blinks(self, img: torch.Tensor, blink: float) -> None:
        if blink <= 0.02:
            return
        b = min(blink, 1.0)
        for eye in self._eyes:
            y0, y1, x0, x1 = eye["box"]
            ys, top, ry = eye["ys"], eye["top"], eye["ry"]
            edge = top + b * (2 * ry + 0.5)  # the upper lid's edge comes down...
            cover = eye["ellipse"] * _sat(edge - ys + 0.5)
            shade = 1.0 - 0.15 * _sat((ys - top) / max(edge - top, 1e-3))  # darker toward the lashes
            lash_y = top + min(b * (2 * ry + 0.5), 1.45 * ry) + eye["bulge"] * b * b  # ...to a curved line
            lash = eye["across"] * _sat(1.0 - (ys - lash_y).abs() / 1.1) * 0.75 * min(1.0, b * 1.5)
            region = img[:, y0:y1, x0:x1]
            region.mul_(1 - cover).add_(eye["skin"] * shade * cover)
            region.mul_(1 - lash).add_(0.12 * lash)

    # ---- public -------------------------------------------------------------------------------
    @torch.no_grad()
    def opening_mask(self, p: FaceParams) -> torch.Tensor:
        """float32 [H, W] 0..1: where :meth:`render` paints the inside of the mouth for ``p``.

        It is the mask before the head motion moves the picture.
        """
        mask = torch.zeros(self.h, self.w)
        k, drop, up, lens = self._mouth_geometry(p)
        if drop > 0:
            y0, y1, x0, x1 = self.roi
            mask[y0:y1, x0:x1] = self._opening(drop, up, lens)[3]
        return mask

    @torch.no_grad()
    def render(self, p: FaceParams) -> torch.Tensor:
        img = self.src[0].clone()
        k, drop, up, lens = self._mouth_geometry(p)
        if drop > 0 or abs(k) > 1e-6:
            y0, y1, x0, x1 = self.roi
            roi = F.grid_sample(self.src, self._mouth_warp(k, drop, up, lens), mode="bilinear",
                                padding_mode="border", align_corners=True)[0]
            if drop > 0:
                self._paint_mouth(roi, p, drop, up, lens)
            img[:, y0:y1, x0:x1] = roi
        self._paint_blinks(img, p.blink)
        if p.head_dx or p.head_dy or p.head_roll_deg or p.head_scale != 1.0:
            img = F.grid_sample(img[None], self._head_grid(p), mode="bilinear", padding_mode="border",
                                align_corners=True)[0]
        return (img.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).permute(1, 2, 0).contiguous()
