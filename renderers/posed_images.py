"""Posed images from a nerfstudio, instant-ngp or Blender ``transforms.json``, as OpenCV cameras.

This is the one loader of this format in framegraph. ``framegraph fit`` and ``framegraph fit-nerf`` both read
their data through :func:`load_transforms`. The first fits 3D Gaussians, ``renderers/fit``. The second fits a
NeRF, ``renderers/nerf``.

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

- ``transform_matrix`` is **camera-to-world in OpenGL axes**: x right, y up, z backwards. So nerfstudio,
  instant-ngp and Blender write it. It is 4x4, or 3x4 without the last row. It is converted to framegraph's
  OpenCV **world-to-camera** ``viewmat``.
- A file may give ``camera_angle_x`` instead of ``fl_x``/``fl_y``. It is the horizontal field of view in
  radians, the Blender synthetic format. Any of ``w, h, fl_x, fl_y, cx, cy, camera_angle_x`` may also be set
  per frame. That overrides the top level. When ``w``/``h`` are given, the images must have that size.
- ``file_path`` is looked up relative to the images folder. Then with its first folder stripped. Then with
  ``.png`` or ``.jpg`` appended: the Blender scenes write ``./train/r_0`` without an extension. Frames whose
  image is not there are skipped, as instant-ngp does. One warning counts them. Instant-ngp's fox lists 67
  frames and ships 50 images. Fewer than ``min_images`` left is an error.
- RGBA images are composited over ``background``.
- Lens distortion is undone on load. It may be set at the top level or per frame. The OpenCV model has
  ``k1 k2 p1 p2`` and ``k3``. With ``"is_fisheye": true`` or ``"camera_model": "OPENCV_FISHEYE"`` it is the
  fisheye ``k1 k2 k3 k4``. Each image is resampled to a pinhole camera with ``cv2.initUndistortRectifyMap``.
  Its intrinsics keep only valid pixels: ``getOptimalNewCameraMatrix`` with alpha 0, same size.
  :attr:`PosedImages.Ks` are those new intrinsics.
- The scene box. Instant-ngp maps a world point ``p`` to ``p * scale + offset``. There it marches the cube of
  side ``aabb_scale`` centred on ``(0.5, 0.5, 0.5)``. Defaults: ``scale`` 0.33, ``offset`` 0.5, ``aabb_scale``
  1. An ``"aabb": [[min], [max]]`` sets ``scale`` and ``offset`` so that box becomes the unit cube. A file with
  any of these keys gets that box, in world units, as :attr:`PosedImages.scene_box`. Without them,
  :meth:`PosedImages.suggested_aabb` centres a box on the point the cameras look at; see :func:`focus_bounds`.

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
_INTRINSICS = ("w", "h", "fl_x", "fl_y", "cx", "cy", "camera_angle_x", *_DISTORTION, "is_fisheye", "camera_model")
NGP_SCALE, NGP_OFFSET, NGP_MAX_AABB_SCALE = 0.33, 0.5, 128  # instant-ngp's defaults and its largest aabb_scale


class DatasetError(ValueError):
    """Images or cameras that can't be used. The message names the file and the problem."""


@dataclass
class PosedImages:
    """Images with their cameras.

    Attributes:
        images: ``[N, H, W, 3]`` float32 RGB in [0, 1].
        viewmats: ``[N, 4, 4]`` float32 world-to-camera, OpenCV axes.
        Ks: ``[N, 3, 3]`` float32 intrinsics in pixels of these images.
        names: one label per image. The ``file_path`` as written in the JSON, or ``view_007``.
        source: where the data came from, for reports.
        files: the image files read, resolved. Empty for images that came from no file.
        scene_box: ``[xmin, ymin, zmin, xmax, ymax, zmax]`` in world units, or None. It comes from the file's
            instant-ngp keys: ``aabb_scale``, ``scale``, ``offset``, ``aabb``. See the module docstring.
    """

    images: Tensor
    viewmats: Tensor
    Ks: Tensor
    names: list[str] = field(default_factory=list)
    source: str = ""
    files: list[str] = field(default_factory=list)
    scene_box: list[float] | None = None

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
                           self.source, [self.files[i] for i in idx] if self.files else [], self.scene_box)

    def split(self, every: int) -> tuple[PosedImages, PosedImages]:
        """``(train, held_out)``. Every ``every``-th image is held out: 0, every, 2 every, and so on. every=0: none."""
        n = len(self)
        held = list(range(0, n, every)) if every and n > 1 else []
        train = [i for i in range(n) if i not in set(held)]
        return self.subset(train), self.subset(held)

    def suggested_aabb(self, extent: float = 0.4) -> list[float]:
        """The scene box ``[xmin, ymin, zmin, xmax, ymax, zmax]``.

        It is :attr:`scene_box` when the file set one. Else it is the cube of :func:`focus_bounds`. That cube is
        centred on the point the cameras look at. Its half-size is ``extent`` × their median distance to it.
        0.4 puts the Blender scenes' [-1.5, 1.5] box inside."""
        if self.scene_box is not None:
            return list(self.scene_box)
        lo, hi = focus_bounds(self.viewmats, extent)
        return [*lo.tolist(), *hi.tolist()]


def focus_bounds(viewmats: Tensor, extent: float = 0.5) -> tuple[Tensor, Tensor]:
    """A box ``(lo [3], hi [3])`` around what the cameras look at.

    Its centre is the least-squares nearest point to all optical axes. Its half-size is ``extent x`` the median
    camera distance to it."""
    v = viewmats.double()
    centers = camera_centers(v)
    axes = v[:, 2, :3]  # camera +z in world coordinates (rows of R)
    eye = torch.eye(3, dtype=torch.float64)
    P = eye - axes[:, :, None] * axes[:, None, :]  # projectors onto each axis' normal plane
    A, b = P.sum(0), (P @ centers[:, :, None]).sum(0)[:, 0]
    focus = torch.linalg.lstsq(A, b).solution if len(v) > 1 else centers[0] + axes[0]
    half = extent * float((centers - focus).norm(dim=-1).median())
    return (focus - half).float(), (focus + half).float()


def load_transforms(cameras: PathLike, images_dir: PathLike | None = None, *,
                    background: Sequence[float] = (0.0, 0.0, 0.0), downscale: int = 1,
                    limit: int | None = None, min_images: int = 1) -> PosedImages:
    """Read a ``transforms.json`` and its images. The module docstring gives the format.

    Args:
        cameras: the JSON file.
        images_dir: folder the ``file_path`` entries are relative to. Default: the JSON's folder.
        background: RGB in [0, 1] under transparent pixels of RGBA images.
        downscale: integer factor to shrink images and intrinsics by, e.g. 4 for a quick CPU fit. Images are
            box-averaged, after undistorting at full size.
        limit: read only the first ``limit`` frames. None: all.
        min_images: fewest frames with an image that are enough. Frames without one are skipped with a
            warning. Fewer than this left is an error.

    Raises :class:`DatasetError` naming the file and the problem. Problems: too few images found, unreadable
    images, sizes that disagree with the JSON or with each other, malformed JSON. Also missing poses or
    intrinsics, bad distortion coefficients or scene box keys.
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
    scene_box = ngp_scene_box(doc, fail)

    found = _frames_with_images(frames, root, path, min_images, fail)

    images, viewmats, Ks, names, files = [], [], [], [], []
    size = None
    undistorted = 0
    for i, frame, image_path in found:
        where = f"frames[{i}]"
        if "transform_matrix" not in frame:
            raise fail(f"{where}.transform_matrix is missing (a 4x4 camera-to-world matrix, OpenGL axes)")
        c2w = _matrix(frame["transform_matrix"], lambda p, where=where: fail(f"{where}.transform_matrix {p}"))
        img = _read_image(image_path, background)
        h, w = img.shape[:2]
        intr = {k: frame.get(k, doc.get(k)) for k in _INTRINSICS}
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
        K = _intrinsics(intr, w, h, lambda p, where=where: fail(f"{where}: {p}"))
        lens = _lens(intr, lambda p, where=where: fail(f"{where}: {p}"))
        if lens is not None:
            img, K = undistort(img, K, *lens)
            undistorted += 1
        if downscale > 1:
            img, K = _downscale(img, K, downscale, image_path)
        images.append(img)
        viewmats.append(torch.linalg.inv(c2w @ OPENGL_TO_OPENCV))
        Ks.append(K)
        names.append(frame["file_path"])
        files.append(str(image_path.resolve()))
    if undistorted:
        print(f"note: {path}: undid the lens distortion of {undistorted} images (intrinsics adjusted)",
              file=sys.stderr)
    return PosedImages(torch.from_numpy(np.stack(images)), torch.stack(viewmats).float(),
                       torch.stack(Ks).float(), names, source=str(path), files=files, scene_box=scene_box)


def _frames_with_images(frames: list, root: Path, path: Path, min_images: int, fail) -> list[tuple[int, dict, Path]]:
    """The ``frames`` whose image is under ``root``, as ``(index, frame, image path)``.

    The others are skipped with one warning that counts them. Fewer than ``min_images`` left is an error.
    ``fail(problem)`` builds the errors about ``path``."""
    found, missing = [], []  # (index, frame, image path), file_path
    for i, frame in enumerate(frames):
        where = f"frames[{i}]"
        if not isinstance(frame, dict):
            raise fail(f"{where} must be an object")
        file_path = frame.get("file_path")
        if not isinstance(file_path, str) or not file_path:
            raise fail(f"{where} has no 'file_path'")
        image_path = _find_image(root, file_path)
        if image_path is None:
            missing.append(file_path)
        else:
            found.append((i, frame, image_path))
    if len(found) < min_images:
        first = f" (first missing: {missing[0]!r})" if missing else ""
        raise fail(f"only {len(found)} of {len(frames)} frames have their image under {root}{first}; "
                   f"need at least {min_images} (is the images folder right?)")
    if missing:
        print(f"warning: {path}: skipping {len(missing)} of {len(frames)} frames whose image is not under "
              f"{root} (first: {missing[0]!r}); fitting the {len(found)} found", file=sys.stderr)
    return found


def ngp_scene_box(doc: dict, fail) -> list[float] | None:
    """The box instant-ngp marches, in the file's world units, or None.

    It comes from ``aabb_scale`` / ``scale`` / ``offset`` / ``aabb``; see the module docstring. None when the file
    has none of these keys. ``fail(problem)`` builds the error for a malformed value."""
    if not any(k in doc for k in ("aabb_scale", "scale", "offset", "aabb")):
        return None
    try:
        aabb_scale = float(doc.get("aabb_scale", 1))
        scale = float(doc.get("scale", NGP_SCALE))
        off = doc.get("offset", NGP_OFFSET)
        offset = [float(v) for v in off] if isinstance(off, list) else [float(off)] * 3
        if "aabb" in doc:  # [[min], [max]] becomes the unit cube: sets scale and offset
            lo, hi = ([float(v) for v in corner] for corner in doc["aabb"])
            if len(doc["aabb"]) != 2 or len(lo) != 3 or len(hi) != 3:
                raise ValueError
            scale = 1.0 / max(1e-6, *(abs(b - a) for a, b in zip(lo, hi)))
            offset = [0.5 - 0.5 * (a + b) * scale for a, b in zip(lo, hi)]
    except (TypeError, ValueError):
        raise fail("aabb_scale and scale must be numbers, offset a number or 3 numbers, aabb "
                   f"[[xmin, ymin, zmin], [xmax, ymax, zmax]]; got aabb_scale={doc.get('aabb_scale')!r}, "
                   f"scale={doc.get('scale')!r}, offset={doc.get('offset')!r}, aabb={doc.get('aabb')!r}") from None
    if len(offset) != 3 or not all(math.isfinite(v) for v in (aabb_scale, scale, *offset)) or aabb_scale <= 0 \
            or scale <= 0:
        raise fail(f"aabb_scale and scale must be positive and offset 3 finite numbers; got "
                   f"aabb_scale={aabb_scale}, scale={scale}, offset={offset}")
    half = 0.5 * min(aabb_scale, NGP_MAX_AABB_SCALE)
    return [(0.5 - half - o) / scale for o in offset] + [(0.5 + half - o) / scale for o in offset]


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


def _lens(intr: dict, fail) -> tuple[tuple[float, ...], bool] | None:
    """``(coefficients, fisheye)`` of the frame's lens. None for a pinhole, all zero or absent.

    OpenCV model: ``k1, k2, p1, p2, k3``. Fisheye: ``k1, k2, k3, k4``."""
    try:
        c = {k: float(intr[k] or 0) for k in _DISTORTION}
    except (TypeError, ValueError):
        raise fail(f"lens distortion coefficients {', '.join(_DISTORTION)} must be numbers, got "
                   f"{ {k: intr[k] for k in _DISTORTION if intr[k] is not None} }") from None
    if not all(math.isfinite(v) for v in c.values()):
        raise fail(f"lens distortion coefficients must be finite, got {c}")
    fisheye = bool(intr["is_fisheye"]) or str(intr["camera_model"] or "").upper() == "OPENCV_FISHEYE"
    if not any(c.values()):
        return None
    if fisheye:
        if c["p1"] or c["p2"]:
            raise fail(f"the fisheye lens model has no tangential terms, got p1={c['p1']}, p2={c['p2']}")
        return (c["k1"], c["k2"], c["k3"], c["k4"]), True
    if c["k4"]:
        raise fail(f"k4={c['k4']} belongs to the fisheye model; set \"is_fisheye\": true or drop k4")
    return (c["k1"], c["k2"], c["p1"], c["p2"], c["k3"]), False


_UNDISTORT_MAPS: dict = {}  # (w, h, K, coefficients, fisheye) -> (map_x, map_y, new K): the frames share a lens


def undistort(img: np.ndarray, K: Tensor, coefficients: Sequence[float], fisheye: bool = False
              ) -> tuple[np.ndarray, Tensor]:
    """``img [H, W, 3]`` float32 taken through a distorting lens, resampled to a pinhole camera.

    The pinhole camera has the same size. Its intrinsics keep only valid pixels. Resampling is bilinear.
    Returns ``(image, K [3, 3])`` of that camera.

    ``coefficients``: OpenCV ``k1, k2, p1, p2, k3``, or ``k1, k2, k3, k4`` with ``fisheye``.
    """
    import cv2

    h, w = img.shape[:2]
    key = (w, h, tuple(K.flatten().tolist()), tuple(coefficients), fisheye)
    if key not in _UNDISTORT_MAPS:
        # OpenCV puts pixel centres at integers, framegraph (and COLMAP, nerfstudio) at +0.5
        half = np.array([[0, 0, 0.5], [0, 0, 0.5], [0, 0, 0]])
        K_cv, dist = K.double().numpy() - half, np.asarray(coefficients, np.float64)
        if fisheye:
            new_K = cv2.fisheye.estimateNewCameraMatrixForUndistortRectify(K_cv, dist, (w, h), np.eye(3), balance=0.0)
            maps = cv2.fisheye.initUndistortRectifyMap(K_cv, dist, np.eye(3), new_K, (w, h), cv2.CV_32FC1)
        else:
            new_K, _ = cv2.getOptimalNewCameraMatrix(K_cv, dist, (w, h), 0.0, (w, h))
            maps = cv2.initUndistortRectifyMap(K_cv, dist, None, new_K, (w, h), cv2.CV_32FC1)
        if len(_UNDISTORT_MAPS) > 16:
            _UNDISTORT_MAPS.clear()
        _UNDISTORT_MAPS[key] = (*maps, torch.from_numpy(np.asarray(new_K) + half).float())
    map_x, map_y, new_K = _UNDISTORT_MAPS[key]
    out = cv2.remap(img, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return out.astype(np.float32), new_K.clone()


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
    """``[H, W, 3]`` float32 in [0, 1]. Alpha is composited over ``background``."""
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


__all__ = ["PosedImages", "DatasetError", "load_transforms", "focus_bounds", "undistort", "ngp_scene_box"]
