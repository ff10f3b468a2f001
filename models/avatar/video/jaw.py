"""The jaw line kept from the base frame: below it the video avatar never redraws.

The generator hides and redraws the lower face of every frame. That is the union of where it lies in the training
frames. It reaches past the chin, because an opening jaw goes there. Redrawn there, the chin must be placed from a mouth
shape alone. Some people move their head while talking. On them it lands a few px off, or soft. The chin melts into the
collar. The mask :func:`kept_share` is the part of the region at and below the base frame's own jaw line. That line is
the face mesh's, stored per loop frame in the bundle. There the picture stays the base frame's.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

JAW_MARGIN = 0.02  # the frame's own picture is kept from this share of the region's side above its jaw line down
JAW_FEATHER = 0.03  # ... blending into the generated picture over this share of the side


def kept_share(jaw_line: np.ndarray, box, margin: float = JAW_MARGIN, feather: float = JAW_FEATHER) -> torch.Tensor:
    """``float32 [L, L]`` for the region at ``box``: 1 where the base frame's own picture is kept.

    ``box`` is x, y, L, L px of the frame. ``jaw_line [M, 2]`` is in px of the frame. It runs from one jaw angle over
    the chin to the other. It is as :meth:`~framegraph.models.face.FaceLandmarks.jaw_line` gives it. The kept part is
    everything below that line, raised by ``margin · L`` px. It reaches out to the region's sides past the jaw angles.
    Above it the mask rises from 0 to 1 over ``feather · L`` px. So the chin, the jaw line and the collar under it are
    the frame's own. They are never redrawn. A generated lower face cannot smear into the collar."""
    import cv2

    x, y, L = float(box[0]), float(box[1]), int(round(float(box[2])))
    p = np.asarray(jaw_line, np.float64) - (x, y)
    p[:, 1] -= margin * L
    r = max(1, int(round(feather * L / 4)))  # two box blurs of 2r + 1 px: a ramp 4r ≈ feather · L px wide
    pad = 4 * r  # drawn on a canvas larger than the region, so the ramp is whole at its sides
    if p[0, 0] > p[-1, 0]:
        p = p[::-1]
    far = 4 * L
    poly = np.concatenate([[[-far, p[0, 1]]], p, [[L + far, p[-1, 1]], [L + far, L + far], [-far, L + far]]])
    canvas = np.zeros((L + 2 * pad, L + 2 * pad), np.uint8)
    cv2.fillPoly(canvas, [np.round((poly + pad) * 4).astype(np.int32)], 255, lineType=cv2.LINE_AA, shift=2)
    m = torch.from_numpy(canvas).float()[None, None] / 255.0
    m = F.max_pool2d(m, 4 * r + 1, stride=1, padding=2 * r)  # grown by 2r, then blurred: 1 up to the cut, a ramp
    # above it
    for _ in range(2):
        m = F.avg_pool2d(m, 2 * r + 1, stride=1, padding=r, count_include_pad=False)
    return m[0, 0, pad:pad + L, pad:pad + L].clamp_(0.0, 1.0).contiguous()


__all__ = ["JAW_MARGIN", "JAW_FEATHER", "kept_share"]
