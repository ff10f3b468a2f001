"""Posed images from a nerfstudio / instant-ngp / Blender ``transforms.json``, as OpenCV cameras.

The one loader of this format in framegraph: ``framegraph fit`` (3D Gaussians, ``renderers/fit``) and
``framegraph fit-nerf`` (``renderers/nerf``) both read their data through :func:`load_transforms`.

Format::

    {
      "w": 800, "h": 600,                       # image size in pixels (optional)
      "fl_x": 700.0, "fl_y": 700.0,             # focal lengths in pixels
      "cx": 400.0, "cy": 300.0,                 # principal point (default: image centre)
      "frames": [
        {"file_path": "images/frame_00001.png",  # relative to the images folder (default: the JSON's)
         "transform_matrix": [[...], [...], [...], [0, 0, 0, 1]]},   # camera-to-world, OpenGL axes
        ...
      ]
    }

- ``transform_matrix`` is **camera-to-world in OpenGL axes** (x right, y up, z backwards) as
  nerfstudio, instant-ngp and Blender write it (4x4, or 3x4 without the last row); it is converted to
  framegraph's OpenCV **world-to-camera** ``viewmat``.
- Instead of ``fl_x``/``fl_y`` a file may give ``camera_angle_x`` (horizontal field of view in radians,
  the Blender synthetic format). Any of ``w, h, fl_x, fl_y, cx, cy, camera_angle_x`` may also be set
  per frame (overriding the top level). When ``w``/``h`` are given the images must have that size.
- ``file_path`` is looked up relative to the images folder (then with its first folder stripped, then
  with ``.png`` / ``.jpg`` appended: the Blender scenes write ``./train/r_0`` without an extension).
- RGBA images are composited over ``background``.
- Lens distortion (``k1 k2 p1 p2``) is not modelled: a file with non-zero distortion is accepted with a
  warning; undistort the images for best results.

Every error is a :class:`DatasetError` whose message names the file and the problem.
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .cameras import OPENGL_TO_OPENCV, camera_centers, read_json_object

PathLike = str | os.PathLike
_IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")
_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2")


class DatasetError(ValueError):
    """Images or cameras that can't be used; the message names the file and the problem."""


@dataclass
class PosedImages:
    """Images with their cameras.

    Attributes:
        images: ``[N, H, W, 3]`` float32 RGB in [0, 1].
        viewmats: ``[N, 4, 4]`` float32 world-to-camera (OpenCV).
        Ks: ``[N, 3, 3]`` float32 intrinsics in pixels of these images.
        names: one label per image (the ``file_path`` as written in the JSON, or ``view_007``).
        source: where the data came from (for reports).
        files: the image files read, resolved (empty for images that came from no file).
    """

    images: Tensor
    viewmats: Tensor
    Ks: Tensor
    names: list[str] = field(default_factory=list)
    source: str = ""
    files: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        if self.images.dim() != 4 or self.images.shape[-1] != 3:
            raise DatasetError(f"images must be [N, H, W, 3], got {list(self.images.shape)}")
        if self.viewmats.shape != (n, 4, 4) or self.Ks.shape != (n, 3, 3):
            raise DatasetError(f"{n} images need viewmats [{n}, 4, 4] and Ks [{n}, 3, 3], got "
                               f"{list(self.viewmats.shape)} and {list(self.Ks.shape)}")
        if not self.names:
            self.names = [f"view_{i:03d}" for i in range(n)]
        if self.files and len(self.files) != n:
            raise DatasetError(f"{n} images need {n} file names, got {len(self.files)}")

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def height(self) -> int:
        return self.images.shape[1]

    @property
    def width(self) -> int:
        return self.images.shape[2]

    def subset(self, idx: Sequence[int]) -> PosedImages:
        idx = list(idx)
        return PosedImages(self.images[idx], self.viewmats[idx], self.Ks[idx], [self.names[i] for i in idx],
                           self.source, [self.files[i] for i in idx] if self.files else [])

    def split(self, every: int) -> tuple[PosedImages, PosedImages]:
        """``(train, held_out)``: every ``every``-th image (0, every, 2 every, ...) is held out (every=0: none)."""
        n = len(self)
        held = list(range(0, n, every)) if every and n > 1 else []
        train = [i for i in range(n) if i not in set(held)]
        return self.subset(train), self.subset(held)

    def suggested_aabb(self, scale: float = 0.4) -> list[float]:
        """A cube around the cameras' centroid, ``scale`` × their mean distance from it in half-size
        (cameras looking inwards at an object; 0.4 puts the Blender scenes' [-1.5, 1.5] box inside)."""
        centers = camera_centers(self.viewmats.double())
        c = centers.mean(0)
        h = scale * float((centers - c).norm(dim=-1).mean())
        return [*(c - h).tolist(), *(c + h).tolist()]


def load_transforms(cameras: PathLike, images_dir: PathLike | None = None, *,
                    background: Sequence[float] = (0.0, 0.0, 0.0), downscale: int = 1,
                    limit: int | None = None) -> PosedImages:
    """Read a ``transforms.json`` and its images (format in the module docstring).

    Args:
        cameras: the JSON file.
        images_dir: folder the ``file_path`` entries are relative to (default: the JSON's folder).
        background: RGB in [0, 1] under transparent pixels of RGBA images.
        downscale: integer factor to shrink images (box average) and intrinsics by, e.g. 4 for a
            quick CPU fit.
        limit: read only the first ``limit`` frames (None: all).

    Raises :class:`DatasetError` naming the file and the problem (missing or unreadable images,
    sizes that disagree with the JSON or with each other, malformed JSON, missing poses or intrinsics).
    """
    path = Path(cameras)
    root = Path(images_dir) if images_dir is not None else path.parent

    def fail(problem: str) -> DatasetError:
        return DatasetError(f"{path}: {problem}")

    if not path.is_file():
        raise fail("no such file")
    if not root.is_dir():
        raise DatasetError(f"{root}: images folder does not exist")
    if not isinstance(downscale, int) or downscale < 1:
        raise DatasetError(f"downscale must be a positive integer, got {downscale!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise DatasetError(f"limit must be a positive integer or None, got {limit!r}")
    doc = read_json_object(path, fail)
    frames = doc.get("frames")
    if not isinstance(frames, list) or not frames:
        raise fail("needs a non-empty 'frames' list")
    frames = frames[:limit] if limit else frames
    try:
        distorted = any(float(doc.get(k, 0) or 0) != 0 for k in _DISTORTION)
    except (TypeError, ValueError):
        raise fail(f"lens distortion coefficients {_DISTORTION} must be numbers") from None
    if distorted:
        print(f"warning: {path}: lens distortion (k1/k2/p1/p2) is ignored; undistorted images fit better",
              file=sys.stderr)

    images, viewmats, Ks, names, files = [], [], [], [], []
    size = None
    for i, frame in enumerate(frames):
        where = f"frames[{i}]"
        if not isinstance(frame, dict):
            raise fail(f"{where} must be an object")
        if "transform_matrix" not in frame:
            raise fail(f"{where}.transform_matrix is missing (a 4x4 camera-to-world matrix, OpenGL axes)")
        c2w = _matrix(frame["transform_matrix"], lambda p: fail(f"{where}.transform_matrix {p}"))
        file_path = frame.get("file_path")
        if not isinstance(file_path, str) or not file_path:
            raise fail(f"{where} has no 'file_path'")
        image_path = _find_image(root, file_path)
        if image_path is None:
            raise fail(f"{where}: image {file_path!r} not found under {root}")
        img = _read_image(image_path, background)
        h, w = img.shape[:2]
        intr = {k: frame.get(k, doc.get(k)) for k in ("w", "h", "fl_x", "fl_y", "cx", "cy", "camera_angle_x")}
        want_w, want_h = intr["w"], intr["h"]
        try:
            mismatch = want_w is not None and want_h is not None and (int(want_w), int(want_h)) != (w, h)
        except (TypeError, ValueError):
            raise fail(f"{where}: w and h must be integers, got {want_w!r}, {want_h!r}") from None
        if mismatch:
            raise DatasetError(f"{image_path}: image is {w}x{h} but {path} says w={want_w}, h={want_h}")
        if size is None:
            size = (w, h)
        elif (w, h) != size:
            raise DatasetError(f"{image_path}: image is {w}x{h} but the first image is {size[0]}x{size[1]}; "
                               "all images must have one size")
        K = _intrinsics(intr, w, h, lambda p: fail(f"{where}: {p}"))
        if downscale > 1:
            img, K = _downscale(img, K, downscale, image_path)
        images.append(img)
        viewmats.append(torch.linalg.inv(c2w @ OPENGL_TO_OPENCV))
        Ks.append(K)
        names.append(file_path)
        files.append(str(image_path.resolve()))
    return PosedImages(torch.from_numpy(np.stack(images)), torch.stack(viewmats).float(),
                       torch.stack(Ks).float(), names, source=str(path), files=files)


def _matrix(value, fail) -> Tensor:
    try:
        m = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise fail("must be a 4x4 list of numbers") from None
    if m.numel() == 16:
        m = m.reshape(4, 4)
    elif m.shape == (3, 4):
        m = torch.cat([m, torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)])
    else:
        raise fail(f"must be 4x4 (or 3x4), got shape {list(m.shape)}")
    if not torch.isfinite(m).all():
        raise fail("contains NaN/Inf")
    if abs(float(torch.linalg.det(m[:3, :3]))) < 1e-9:
        raise fail("has a singular rotation block")
    return m


def _intrinsics(intr: dict, w: int, h: int, fail) -> Tensor:
    fx, fy = intr["fl_x"], intr["fl_y"]
    if fx is None and intr["camera_angle_x"] is not None:
        try:
            fx = 0.5 * w / math.tan(0.5 * float(intr["camera_angle_x"]))
        except (TypeError, ValueError, ZeroDivisionError):
            raise fail(f"camera_angle_x must be a field of view in radians, got {intr['camera_angle_x']!r}") from None
    if fx is None:
        raise fail("needs focal lengths 'fl_x' (and 'fl_y') in pixels, or 'camera_angle_x'")
    fy = fx if fy is None else fy
    cx = w / 2 if intr["cx"] is None else intr["cx"]
    cy = h / 2 if intr["cy"] is None else intr["cy"]
    try:
        fx, fy, cx, cy = float(fx), float(fy), float(cx), float(cy)
    except (TypeError, ValueError):
        raise fail(f"fl_x, fl_y, cx, cy must be numbers, got {fx!r}, {fy!r}, {cx!r}, {cy!r}") from None
    if not (fx > 0 and fy > 0 and math.isfinite(fx) and math.isfinite(fy) and math.isfinite(cx)
            and math.isfinite(cy)):
        raise fail(f"focal lengths must be positive and finite (got fl_x={fx}, fl_y={fy})")
    return torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float32)


def _find_image(root: Path, file_path: str) -> Path | None:
    rel = Path(file_path)
    candidates = [root / rel]
    if len(rel.parts) > 1:
        candidates.append(root / Path(*rel.parts[1:]))  # "images/x.png" with the images folder given
    out = []
    for c in candidates:
        out.append(c)
        # no extension ("./train/r_0", Blender) or a dotted stem ("frame.001"): try the usual ones
        if c.suffix not in _IMAGE_EXTS:
            out += [c.with_name(c.name + ext) for ext in _IMAGE_EXTS]
    return next((c for c in out if c.is_file()), None)


def _read_image(path: Path, background: Sequence[float]) -> np.ndarray:
    """``[H, W, 3]`` float32 in [0, 1]; alpha composited over ``background``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            if im.mode in ("RGBA", "LA") or (im.mode == "P" and "transparency" in im.info):
                rgba = np.asarray(im.convert("RGBA"), dtype=np.float32) / 255.0
                bg = np.asarray(background, dtype=np.float32)
                return rgba[..., :3] * rgba[..., 3:] + bg * (1.0 - rgba[..., 3:])
            return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise DatasetError(f"{path}: cannot read image ({e})") from None


def _downscale(img: np.ndarray, K: Tensor, factor: int, path: Path) -> tuple[np.ndarray, Tensor]:
    h, w = img.shape[0] // factor, img.shape[1] // factor
    if h < 1 or w < 1:
        raise DatasetError(f"{path}: downscale {factor} leaves no pixels of a {img.shape[1]}x{img.shape[0]} image")
    small = img[: h * factor, : w * factor].reshape(h, factor, w, factor, 3).mean(axis=(1, 3))
    K = K.clone()
    K[:2] /= factor
    return small.astype(np.float32), K


__all__ = ["PosedImages", "DatasetError", "load_transforms"]
