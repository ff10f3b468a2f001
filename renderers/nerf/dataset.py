"""Posed images from instant-ngp / nerfstudio ``transforms.json`` files, as OpenCV cameras.

The format: ``{"camera_angle_x": rad | "fl_x", "fl_y", "cx", "cy", "w", "h", "frames": [{"file_path",
"transform_matrix"}, ...]}`` where ``transform_matrix`` is a 4×4 **camera-to-world** matrix with OpenGL
camera axes (x right, y up, z back) and intrinsics may also sit on each frame. ``file_path`` is relative
to the JSON file; a missing extension tries ``.png`` (as in the Blender synthetic scenes). RGBA images
are composited over ``background``.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from ..cameras import OPENGL_TO_OPENCV, camera_centers


class DatasetError(ValueError):
    """A dataset that cannot be read; the message names the file and the problem."""


@dataclass
class PosedImages:
    """``images [N, H, W, 3]`` float32 in [0, 1], ``viewmats [N, 4, 4]`` world-to-camera (OpenCV),
    ``Ks [N, 3, 3]`` in pixels of these images, and the files they came from."""

    images: Tensor
    viewmats: Tensor
    Ks: Tensor
    files: list

    def suggested_aabb(self, scale: float = 0.4) -> list[float]:
        """A cube around the cameras' centroid, ``scale`` × their mean distance from it in half-size
        (cameras looking inwards at an object; 0.4 puts the Blender scenes' [-1.5, 1.5] box inside)."""
        centers = camera_centers(self.viewmats.double())
        c = centers.mean(0)
        h = scale * float((centers - c).norm(dim=-1).mean())
        return [*(c - h).tolist(), *(c + h).tolist()]


def load_transforms(path: Union[str, os.PathLike], *, downscale: int = 1,
                    background: Sequence[float] = (1.0, 1.0, 1.0), limit: Optional[int] = None) -> PosedImages:
    """Read ``transforms.json`` and its images (every ``downscale``-th pixel box-averaged)."""
    from PIL import Image

    path = Path(path)

    def fail(problem: str) -> DatasetError:
        return DatasetError(f"{path}: {problem}")

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise fail("no such file") from None
    except json.JSONDecodeError as e:
        raise fail(f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    frames = doc.get("frames") if isinstance(doc, dict) else None
    if not isinstance(frames, list) or not frames:
        raise fail("needs a non-empty 'frames' list")
    frames = frames[:limit] if limit else frames
    bg = torch.tensor(background, dtype=torch.float32)
    images, viewmats, Ks, files = [], [], [], []
    for i, fr in enumerate(frames):
        if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
            raise fail(f"frames[{i}] needs 'file_path' and 'transform_matrix'")
        f = (path.parent / fr["file_path"]).resolve()
        if not f.suffix and not f.exists():
            f = f.with_suffix(".png")
        try:
            img = Image.open(f)
            img.load()
        except (OSError, ValueError) as e:
            raise fail(f"frames[{i}]: cannot read image {f} ({e})") from None
        arr = torch.from_numpy(np.array(img.convert("RGBA" if "A" in img.mode else "RGB"))).float() / 255
        if arr.shape[-1] == 4:
            arr = arr[..., :3] * arr[..., 3:] + bg * (1 - arr[..., 3:])
        H0, W0 = arr.shape[:2]
        if downscale > 1:
            H, W = H0 // downscale, W0 // downscale
            arr = arr[:H * downscale, :W * downscale].reshape(H, downscale, W, downscale, 3).mean((1, 3))
        try:
            c2w = torch.tensor(fr["transform_matrix"], dtype=torch.float64).reshape(4, 4)
        except (TypeError, ValueError, RuntimeError):
            raise fail(f"frames[{i}].transform_matrix must be a 4x4 matrix") from None
        get = lambda k: fr.get(k, doc.get(k))  # noqa: E731 — per-frame intrinsics override the shared ones
        W0, H0 = get("w") or W0, get("h") or H0
        fx = get("fl_x")
        if fx is None:
            angle = get("camera_angle_x")
            if angle is None:
                raise fail(f"frames[{i}]: no intrinsics (need 'fl_x' or 'camera_angle_x')")
            fx = 0.5 * W0 / math.tan(0.5 * angle)
        fy = get("fl_y") or fx
        cx, cy = get("cx") or W0 / 2, get("cy") or H0 / 2
        s = 1.0 / downscale
        Ks.append(torch.tensor([[fx * s, 0, cx * s], [0, fy * s, cy * s], [0, 0, 1]], dtype=torch.float32))
        viewmats.append(torch.linalg.inv(c2w @ OPENGL_TO_OPENCV).float())
        images.append(arr)
        files.append(str(f))
    shapes = {tuple(im.shape) for im in images}
    if len(shapes) != 1:
        raise fail(f"images have different sizes {sorted(shapes)}; all frames must share one size")
    return PosedImages(torch.stack(images), torch.stack(viewmats), torch.stack(Ks), files)
