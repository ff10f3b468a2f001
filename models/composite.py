"""Paste a generated region back into the full-resolution portrait, with a feathered mask.

    VAEDecode ──face uint8 [h, w, 3]──▶ Composite ──video uint8 [H, W, 3]──▶ Encode / Sink

The model works on a square face region, say 128².
The output is the full portrait frame: a fixed background, the portrait at its own size.
The region is resized to its box if needed and blended in through a soft alpha mask.
The mask is 1 in the middle of the box.
It falls smoothly to exactly 0 on the box's outer ring of pixels, so there is no seam at the border.
The fall is a smoothstep, so the slope is continuous.

Conventions:

- Images are ``[H, W, 3]`` RGB, ``uint8`` in 0..255 or float.
- Boxes are ``(x, y, w, h)`` in integer pixels of the background.
  That is the column and row of the top-left corner, then width and height.
- Masks are ``float32 [h, w]`` in [0, 1], at the box's size.

    mask = feather_mask(h, w, feather_px=12, shape="ellipse")
    frame = composite(background, region, box, mask)      # also what the Composite stage runs
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.stream import PortSpec, Stage

SHAPES = ("ellipse", "rounded")


def _smoothstep(e0: float, e1: float, x: Tensor) -> Tensor:
    t = ((x - e0) / (e1 - e0)).clamp(0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def feather_mask(height: int, width: int, feather_px: float, shape: str = "ellipse", *, device="cpu") -> Tensor:
    """Soft alpha ``float32 [height, width]`` for a box of that size.

    With ``shape="ellipse"`` the shape is the ellipse inscribed in the box.
    With ``"rounded"`` it is the box as a rectangle, with corners rounded by ``feather_px``.
    ``d`` is the distance in px of a pixel centre inside the shape's edge.
    For the ellipse it is taken along the radius.
    Alpha is ``smoothstep(0.5, 0.5 + feather_px, d)``.
    It is 0 on and outside the edge, so the box's outer ring is 0.
    It rises monotonically over ``feather_px`` px to 1.
    """
    if shape not in SHAPES:
        raise ValueError(f"feather_mask: shape={shape!r}; expected one of {SHAPES}")
    if height < 1 or width < 1:
        raise ValueError(f"feather_mask: size {width}x{height} must be positive")
    if not feather_px > 0:
        raise ValueError(f"feather_mask: feather_px={feather_px} must be > 0")
    if 2 * (feather_px + 0.5) > min(height, width):
        raise ValueError(f"feather_mask: feather_px={feather_px} is too wide for a {width}x{height} box "
                         f"(at most {min(height, width) / 2 - 0.5:g})")
    ys = torch.arange(height, dtype=torch.float32, device=device) + 0.5 - height / 2  # px from the centre
    xs = torch.arange(width, dtype=torch.float32, device=device) + 0.5 - width / 2
    py, px = torch.meshgrid(ys, xs, indexing="ij")
    a, b = width / 2, height / 2
    if shape == "ellipse":
        r = torch.sqrt(px * px + py * py)  # distance from the centre
        rho = torch.sqrt((px / a) ** 2 + (py / b) ** 2)  # 1 on the ellipse
        edge = torch.where(rho > 0, r / rho.clamp_min(1e-12), torch.full_like(r, min(a, b)))  # radius to the edge
        d = edge - r
    else:
        rad = float(feather_px)
        qx, qy = px.abs() - (a - rad), py.abs() - (b - rad)
        outside = torch.sqrt(qx.clamp_min(0) ** 2 + qy.clamp_min(0) ** 2)
        inside = torch.maximum(qx, qy).clamp_max(0)
        d = -(outside + inside - rad)
    return _smoothstep(0.5, 0.5 + float(feather_px), d)


def check_box(box: Sequence[int], height: int, width: int) -> tuple[int, int, int, int]:
    """Validate ``box = (x, y, w, h)`` against an ``height × width`` frame. Returns it as ints."""
    if len(box) != 4:
        raise ValueError(f"box {tuple(box)} must be (x, y, w, h)")
    x, y, w, h = (int(round(float(v))) for v in box)
    if w < 1 or h < 1:
        raise ValueError(f"box {tuple(box)}: width and height must be positive")
    if x < 0 or y < 0 or x + w > width or y + h > height:
        raise ValueError(f"box {tuple(box)} (x, y, w, h) is outside the {width}x{height} frame; it must lie within "
                         f"0 <= x, x + w <= {width}, 0 <= y, y + h <= {height}")
    return x, y, w, h


def resize_region(region: Tensor, height: int, width: int) -> Tensor:
    """``[h, w, 3]`` of any dtype → ``float32 [height, width, 3]``.

    It is bilinear, antialiased when shrinking.
    The values are unchanged when the size already matches.
    """
    if tuple(region.shape[:2]) == (height, width):
        return region.float()
    shrink = height < region.shape[0] or width < region.shape[1]
    r = F.interpolate(region.permute(2, 0, 1)[None].float(), size=(height, width), mode="bilinear",
                      align_corners=False, antialias=shrink)
    return r[0].permute(1, 2, 0)


def composite(background: Tensor, region: Tensor, box: Sequence[int], mask: Tensor, *,
              out: Tensor | None = None) -> Tensor:
    """``background [H, W, 3]`` with ``region [h, w, 3]`` blended in at ``box`` through ``mask``.

    Args:
        background: the full frame, ``uint8`` or float.
        region: the generated region, of the same dtype family. It is resized to the box when its size differs.
        box: ``(x, y, w, h)`` in px, inside the frame.
        mask: ``float [h_box, w_box]`` alpha in [0, 1]. See :func:`feather_mask`.
        out: optional ``[H, W, 3]`` tensor of ``background``'s dtype to write into.
            It may be ``background`` itself. Otherwise a new tensor is made.

    Returns the frame. Inside the box it is ``background + mask · (region − background)``, rounded for ``uint8``.
    Elsewhere it is ``background``.
    """
    if background.dim() != 3 or background.shape[2] != 3:
        raise ValueError(f"composite: background must be [H, W, 3], got {list(background.shape)}")
    if region.dim() != 3 or region.shape[2] != 3:
        raise ValueError(f"composite: region must be [h, w, 3], got {list(region.shape)}")
    if (background.dtype == torch.uint8) != (region.dtype == torch.uint8):
        raise ValueError(f"composite: background ({background.dtype}) and region ({region.dtype}) must both be "
                         f"uint8 or both float")
    H, W = background.shape[:2]
    x, y, w, h = check_box(box, H, W)
    if tuple(mask.shape) != (h, w):
        raise ValueError(f"composite: mask is {list(mask.shape)}; expected [{h}, {w}] (the box's height, width)")
    if out is None:
        out = background.clone()
    elif out is not background:
        if out.shape != background.shape or out.dtype != background.dtype:
            raise ValueError(f"composite: out is {out.dtype} {list(out.shape)}; expected {background.dtype} "
                             f"{list(background.shape)}")
        out.copy_(background)
    bg = background[y:y + h, x:x + w].float()
    blended = torch.lerp(bg, resize_region(region, h, w), mask[:, :, None].to(bg.dtype))
    if out.dtype == torch.uint8:
        blended = blended.round_().clamp_(0, 255)
    out[y:y + h, x:x + w].copy_(blended)
    return out


def load_background(image, device="cpu") -> Tensor:
    """A background frame as ``uint8 [H, W, 3]`` on ``device``.

    ``image`` is a path to an image file such as PNG or JPEG, or a ``uint8 [H, W, 3]`` numpy array or tensor.
    """
    if isinstance(image, (str, os.PathLike)):
        from PIL import Image

        path = os.fspath(image)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"background image {path!r} does not exist")
        with Image.open(path) as im:
            image = np.asarray(im.convert("RGB"))
    t = image if isinstance(image, Tensor) else torch.from_numpy(np.array(image))  # a writable copy
    if t.dtype != torch.uint8 or t.dim() != 3 or t.shape[2] != 3:
        raise ValueError(f"background must be a uint8 [H, W, 3] RGB image, got {t.dtype} {list(t.shape)}")
    return t.to(device).contiguous()


class Composite(Stage):
    """Paste each generated face region into the full-resolution background frame.

    Args:
        background: the full frame, ``uint8 [H, W, 3]``, as a path, numpy array or tensor.
            For example the portrait at its original size.
        box: ``(x, y, w, h)`` in px of the background, where the region goes.
            For the avatar it is the crop box the model's training regions were cut from.
            See ``models.vae.data.face_crop_box``.
        region_size: ``(h, w)`` or one int, the size of the incoming ``"face"`` frames.
            The default is the box size. Frames are resized to the box when different.
        feather_px: width of the soft edge in box px. The default is 12% of the box's shorter side.
        shape: ``"ellipse"`` or ``"rounded"``. See :func:`feather_mask`.
        device: where inputs arrive, the blend runs and outputs are written.
        alpha: ``uint8 [H, W]``, the background's person matte, or None.
            When given, each frame also leaves on an ``"alpha"`` port.
            The region is pasted inside the person, so the matte does not change.

    Ports:

    - in ``"face"``: ``uint8 [h, w, 3]`` on ``device``.
    - out ``"video"``: ``uint8 [H, W, 3]``, and ``"alpha"`` ``uint8 [H, W]``, on ``out_device``.
      ``out_device`` defaults to ``device``.
      With ``"cpu"`` after a GPU composite, the frame is copied to the host without waiting, for an encoder.

    The background and the mask are prepared once, here. Nothing but the blend runs per frame.
    Output frames keep the input's pts and flags.
    """

    def __init__(self, background, box: Sequence[int], *, region_size: int | tuple[int, int] | None = None,
                 feather_px: float | None = None, shape: str = "ellipse", device: str = "cpu",
                 alpha: Tensor | None = None, out_device: str | None = None, name: str = "composite"):
        super().__init__(name)
        self.background = load_background(background, device)
        H, W = self.background.shape[:2]
        self.box = check_box(box, H, W)
        x, y, w, h = self.box
        if region_size is None:
            region_size = (h, w)
        rh, rw = (region_size, region_size) if isinstance(region_size, int) else (int(region_size[0]),
                                                                                  int(region_size[1]))
        if rh < 1 or rw < 1:
            raise ValueError(f"Composite: region_size {region_size} must be positive")
        if feather_px is None:
            feather_px = max(1.0, round(0.12 * min(w, h)))
        self.feather_px, self.shape = float(feather_px), shape
        self.mask = feather_mask(h, w, self.feather_px, shape, device=device)
        self.inputs = {"face": PortSpec((rh, rw, 3), torch.uint8, device)}
        out_device = str(torch.device(out_device or device))
        self.outputs = {"video": PortSpec((H, W, 3), torch.uint8, out_device)}
        # the frame is blended where the face arrives; written straight into the output unless that is elsewhere
        self._scratch = None if out_device == str(torch.device(device)) else torch.empty_like(self.background)
        self.alpha = None
        if alpha is not None:
            if alpha.dtype != torch.uint8 or tuple(alpha.shape) != (H, W):
                raise ValueError(f"Composite: alpha is {alpha.dtype} {list(alpha.shape)}; expected uint8 [{H}, {W}] "
                                 f"(the background's matte)")
            self.alpha = alpha.to(out_device)
            self.outputs["alpha"] = PortSpec((H, W), torch.uint8, out_device)

    def frame_alpha(self) -> Tensor:
        """``float32 [H, W]``: how much of each output pixel is the generated region.

        It is the mask at its box and 0 elsewhere.
        That is where the frames move. The rest is the background.
        """
        H, W = self.background.shape[:2]
        x, y, w, h = self.box
        alpha = torch.zeros(H, W, dtype=torch.float32, device=self.mask.device)
        alpha[y:y + h, x:x + w] = self.mask
        return alpha

    def process(self, inputs, out):
        frame = out.write("video")
        if self._scratch is None:
            composite(self.background, inputs["face"].data, self.box, self.mask, out=frame.data)
        else:
            composite(self.background, inputs["face"].data, self.box, self.mask, out=self._scratch)
            frame.data.copy_(self._scratch, non_blocking=True)  # a download slot on CUDA (see stream.Frame)
        if self.alpha is not None:
            out.write("alpha").data.copy_(self.alpha)


def cover_picture(image: Tensor, height: int, width: int) -> Tensor:
    """``uint8 [h, w, 3]`` scaled to cover a ``height × width`` frame, aspect kept, and cropped to it, centred."""
    h, w = image.shape[:2]
    s = max(height / h, width / w)
    sh, sw = max(height, round(h * s)), max(width, round(w * s))
    scaled = resize_region(image, sh, sw).round_().clamp_(0, 255).to(torch.uint8)
    y, x = (sh - height) // 2, (sw - width) // 2
    return scaled[y:y + height, x:x + width].contiguous()


def background_frame(background, height: int, width: int, device="cpu") -> Tensor:
    """``uint8 [height, width, 3]``: a colour filling the frame, or a picture scaled to cover it.

    The colour is ``(r, g, b)`` in 0..255.
    The picture is a path, array or tensor, as for :func:`load_background`.
    """
    if isinstance(background, (tuple, list)) and len(background) == 3 and all(isinstance(v, int) for v in background):
        if not all(0 <= v <= 255 for v in background):
            raise ValueError(f"background colour {tuple(background)}: each of r, g, b must be 0..255")
        return torch.tensor(background, dtype=torch.uint8, device=device).expand(height, width, 3).contiguous()
    return cover_picture(load_background(background), height, width).to(device)


def over(video: Tensor, alpha: Tensor, background: Tensor, *, out: Tensor | None = None) -> Tensor:
    """``video uint8 [H, W, 3]`` over ``background uint8 [H, W, 3]`` through ``alpha uint8 [H, W]``.

    Alpha 255 is the video.
    The result is ``background + alpha / 255 · (video − background)``, rounded.
    """
    a = alpha.float()[..., None] / 255.0
    blended = torch.lerp(background.float(), video.float(), a).round_().clamp_(0, 255).to(torch.uint8)
    if out is None:
        return blended
    return out.copy_(blended)


class OverBackground(Stage):
    """A matted picture over a background: a colour, or a picture scaled to cover the frame.

    Ports:

    - in ``"video"``: ``uint8 [H, W, 3]``, and ``"alpha"``: ``uint8 [H, W]``.
      They come in lock-step, the same frame's.
    - out ``"video"``: ``uint8 [H, W, 3]``, from :func:`over`.

    The background is prepared once, here.
    """

    def __init__(self, background, *, width: int, height: int, device: str = "cpu", name: str = "background"):
        super().__init__(name)
        self.background = background_frame(background, height, width, device)
        self.inputs = {"video": PortSpec((height, width, 3), torch.uint8, device),
                       "alpha": PortSpec((height, width), torch.uint8, device)}
        self.outputs = {"video": PortSpec((height, width, 3), torch.uint8, device)}

    def process(self, inputs, out):
        over(inputs["video"].data, inputs["alpha"].data, self.background, out=out.write("video").data)
