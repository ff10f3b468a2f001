"""A picture of one size in, the same picture at another size out, aspect kept.

The function :func:`scale_picture` scales one picture. The class :class:`ScaleVideo` is the stage that
applies it to every frame.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..stage import Stage
from .video import video_port


def fit_box(src_wh: tuple[int, int], dst_wh: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(x, y, w, h)`` of the largest ``src``-shaped box centred in ``dst``.

    In pixels. The sizes are even.
    """
    (sw, sh), (dw, dh) = src_wh, dst_wh
    s = min(dw / sw, dh / sh)
    w, h = min(dw, 2 * round(sw * s / 2)), min(dh, 2 * round(sh * s / 2))
    return (dw - w) // 2, (dh - h) // 2, w, h


def scale_picture(picture: torch.Tensor, size: tuple[int, int], out: torch.Tensor | None = None) -> torch.Tensor:
    """``uint8 [H, W, 3]`` → ``uint8 [height, width, 3]``, with ``size = (width, height)``.

    The picture is scaled to fit with its aspect ratio kept, antialiased bilinear. It is centred. The bars are
    black when the aspects differ. It is written into ``out`` when given, such as a ring slot. Else it goes into a
    new tensor.
    """
    sh, sw = picture.shape[:2]
    x, y, w, h = fit_box((sw, sh), size)
    if out is None:
        out = torch.empty((size[1], size[0], 3), dtype=torch.uint8)
    src = picture.permute(2, 0, 1)[None].float()  # [1, 3, H, W]
    scaled = F.interpolate(src, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    out.zero_()
    out[y:y + h, x:x + w] = scaled[0].permute(1, 2, 0).round_().clamp_(0, 255).to(torch.uint8)
    return out


class ScaleVideo(Stage):
    """``uint8 [H, W, 3]`` in → ``uint8 [height, width, 3]`` out: each picture through :func:`scale_picture`."""

    def __init__(self, *, src_size: tuple[int, int], size: tuple[int, int], name: str = "scale"):
        super().__init__(name)
        (sw, sh), (w, h) = src_size, size
        if min(sw, sh, w, h) < 2:
            raise ValueError(f"ScaleVideo: sizes {sw}x{sh} -> {w}x{h} must be at least 2x2 pixels")
        self.inputs = {"video": video_port(sw, sh)}
        self.outputs = {"video": video_port(w, h)}
        self.size = (w, h)

    def process(self, inputs, out):
        scale_picture(inputs["video"].data, self.size, out=out.write("video").data)
