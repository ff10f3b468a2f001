"""Where MuseTalk redraws a face in a frame, and how the redrawn face goes back into it.

    box = face_box(points, (W, H))            # (x1, y1, x2, y2) px of the frame
    crop = crop_face(frame, box)              # uint8 [256, 256, 3]: what the VAE encodes
    mask = blend_mask(polygon, box)           # uint8 [y2 - y1, x2 - x1]: how much of the drawn face is kept
    frame = paste_face(frame, face, box, mask)

The box is MuseTalk 1.5's, drawn on the face mesh's landmarks. It spans cheek to cheek, the face outline's extent.
Its bottom is the jaw line's lowest point. Its top is as far above the nose ridge as the bottom is below it. The
bottom then goes ``MARGIN_PX`` lower, 1.5's extra margin under the chin. The box is clipped to the frame. The crop
is the box scaled to 256² with Lanczos.

For the mask, MuseTalk parses the face with a BiSeNet. It keeps the skin and lips below the box's middle. No
registry package ships that BiSeNet. Here the face mesh's lower-face polygon takes the parse's place. It too is kept
below the box's middle and inside the box. It is feathered with the Gaussian that MuseTalk's realtime path blurs
with. The kernel is a tenth of the blend square's side. That side is 1.5 × the box's longer side.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from framegraph.models.face.landmarks import FACE_OVAL, JAW_LINE

FACE_SIZE = 256  # the side of the crop MuseTalk's VAE encodes
NOSE_RIDGE = 197  # the face mesh's point on the nose ridge (the 68-point scheme's 29, MuseTalk's box centre)
MARGIN_PX = 10  # MuseTalk 1.5: the box reaches this much further below the chin
EXPAND = 1.5  # the blend square's side over the box's longer side
BLUR = 0.1  # the feather's kernel over the blend square's side (MuseTalk's realtime path)

Box = tuple[int, int, int, int]


def face_box(points: np.ndarray, size: tuple[int, int], margin_px: int = MARGIN_PX) -> Box:
    """``(x1, y1, x2, y2)`` px of the face MuseTalk redraws; the ends are exclusive.

    It comes from one face's landmarks ``float [478, 2]`` in a frame of ``size``, as width and height. See the
    module docstring. Raises :class:`ValueError` when the face is too small or outside the frame."""
    width, height = size
    oval = points[list(FACE_OVAL)]
    bottom = float(points[list(JAW_LINE), 1].max())
    ridge = float(points[NOSE_RIDGE, 1])
    x1, x2 = int(max(0, np.floor(oval[:, 0].min()))), int(min(width, np.ceil(oval[:, 0].max())))
    y1 = int(max(0, np.floor(ridge - (bottom - ridge))))
    y2 = int(min(height, np.ceil(bottom) + margin_px))
    if x2 - x1 < 2 or y2 - y1 < 2:
        raise ValueError(f"face box {(x1, y1, x2, y2)}: the face is too small or outside the {width}x{height} frame")
    return x1, y1, x2, y2


def crop_face(frame: np.ndarray, box: Box, size: int = FACE_SIZE) -> np.ndarray:
    """``uint8 [size, size, 3]``: the box of ``frame`` scaled to ``size``² with Lanczos.

    ``frame`` is ``uint8 [H, W, 3]``."""
    from PIL import Image

    x1, y1, x2, y2 = box
    return np.asarray(Image.fromarray(np.ascontiguousarray(frame[y1:y2, x1:x2])).resize((size, size),
                                                                                         Image.LANCZOS))


def feather_sigma(box: Box) -> float:
    """px: the Gaussian's sigma for this box. It is OpenCV's sigma for MuseTalk's odd kernel size."""
    x1, y1, x2, y2 = box
    half = int(max(x2 - x1, y2 - y1) // 2 * EXPAND)
    kernel = int(BLUR * 2 * half // 2 * 2) + 1
    return 0.3 * ((kernel - 1) * 0.5 - 1) + 0.8


def blend_mask(polygon: np.ndarray, box: Box) -> np.ndarray:
    """``uint8 [y2 - y1, x2 - x1]``: the share of the drawn face kept at each pixel of the box.

    255 keeps all of it. The mask is drawn from the frame's lower-face polygon ``float [K, 2]``, in px of the frame.
    See the module docstring."""
    from PIL import Image, ImageDraw, ImageFilter

    x1, y1, x2, y2 = box
    sigma = feather_sigma(box)
    pad = int(np.ceil(3 * sigma))
    w, h = x2 - x1 + 2 * pad, y2 - y1 + 2 * pad
    shape = Image.new("L", (w, h), 0)
    ImageDraw.Draw(shape).polygon([(float(x) - x1 + pad, float(y) - y1 + pad) for x, y in polygon], fill=255)
    kept = np.asarray(shape).copy()
    middle = pad + (y2 - y1) // 2  # MuseTalk keeps rows from the box's middle down ...
    kept[:middle] = 0
    kept[:, :pad], kept[:, w - pad:], kept[h - pad:] = 0, 0, 0  # ... and inside the box
    soft = Image.fromarray(kept).filter(ImageFilter.GaussianBlur(sigma))
    return np.asarray(soft)[pad:pad + y2 - y1, pad:pad + x2 - x1].copy()


def paste_face(frame: torch.Tensor, face: torch.Tensor, box: Box, mask: torch.Tensor) -> torch.Tensor:
    """``uint8 [H, W, 3]``: ``frame`` with the drawn ``face`` blended into its box by ``mask``.

    ``face`` is ``uint8 [S, S, 3]``, scaled to the box bilinearly. ``mask`` is ``uint8 [h, w]``; 255 keeps all of the
    face. Any device works. ``frame`` is not changed."""
    x1, y1, x2, y2 = box
    drawn = F.interpolate(face.permute(2, 0, 1)[None].float(), size=(y2 - y1, x2 - x1), mode="bilinear",
                          align_corners=False)[0].permute(1, 2, 0)
    alpha = mask.to(drawn.dtype)[..., None] / 255.0
    out = frame.clone()
    under = frame[y1:y2, x1:x2].to(drawn.dtype)
    out[y1:y2, x1:x2] = (alpha * drawn + (1 - alpha) * under).round_().clamp_(0, 255).to(torch.uint8)
    return out


__all__ = ["Box", "EXPAND", "FACE_SIZE", "MARGIN_PX", "NOSE_RIDGE", "blend_mask", "crop_face", "face_box",
           "feather_sigma", "paste_face"]
