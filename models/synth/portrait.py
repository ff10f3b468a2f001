"""Portraits for synthetic talking clips: the image and where its mouth and eyes are.

The shipped portrait is ``assets/portraits/astronaut.png``, public domain; see its PROVENANCE.md.
Its measured boxes come in ``astronaut.json``.
For any other image, MediaPipe's face mesh finds the face; see :mod:`framegraph.models.face`.
Its landmarks give the lip line where the lips meet, the corners' curve and the outer lip contour's box.
They also give the eyes' lid boxes.
So the renderer opens the mouth between the real lips and closes the real eyelids.
A mouth box given by the user wins over the landmarks' one.

Boxes are ``(x, y, width, height)`` in pixels of the portrait image, which may be downscaled.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

import framegraph.assets
from framegraph.models.face import FaceError, FaceLandmarker, FaceLandmarks, one_face

Box = tuple[float, float, float, float]
MIN_FACE_PX = 48  # narrower faces give too few pixels for a mouth (the portrait is read at <= 512 px)


class PortraitError(ValueError):
    """The portrait cannot be used: not an image, no face found..."""


@dataclass
class Portrait:
    """An RGB portrait and its face geometry.

    Attributes:
        image: ``uint8 [H, W, 3]`` RGB, H and W even.
        mouth_box: ``(x, y, w, h)`` px around the lips.
        lip_line_y: row where the lips part at the mouth's centre.
        lip_curve: px the corners sit higher than that: a smile. 0 is straight.
        eye_boxes: ``[(x, y, w, h), ...]`` px around each eye's opening, left to right. May be empty.
        face_box: the face detection, when there was one.
        name / source: for ground-truth files.
        region_size: side in px of the square face region a photo avatar of this portrait should generate. It is
            :func:`framegraph.models.vae.region_size` of the face. None: not chosen. It is written to the clips' JSON
            ``portrait`` block, where the avatar trainer reads it.
    """

    image: np.ndarray
    mouth_box: Box
    lip_line_y: float
    eye_boxes: list[Box] = field(default_factory=list)
    face_box: Box | None = None
    lip_curve: float = 0.0
    name: str = "portrait"
    source: str = ""
    region_size: int | None = None

    @property
    def height(self) -> int:
        return self.image.shape[0]

    @property
    def width(self) -> int:
        return self.image.shape[1]

    def to_json(self) -> dict:
        r = lambda b: [round(float(v), 2) for v in b]  # noqa: E731
        return {"name": self.name, "source": self.source, "width": self.width, "height": self.height,
                "mouth_box": r(self.mouth_box), "lip_line_y": round(float(self.lip_line_y), 2),
                "lip_curve": round(float(self.lip_curve), 2),
                "eye_boxes": [r(b) for b in self.eye_boxes], "face_box": r(self.face_box) if self.face_box else None,
                **({"region_size": int(self.region_size)} if self.region_size else {})}


def portraits_folder() -> Path:
    """``assets/portraits`` of the installed framegraph."""

    return Path(framegraph.assets.__file__).parent / "portraits"


def astronaut_portrait() -> Portrait:
    """The shipped public-domain portrait, Eileen Collins of NASA, with its measured boxes."""
    folder = portraits_folder()
    meta = json.loads((folder / "astronaut.json").read_text())
    image = np.asarray(Image.open(folder / meta["image"]).convert("RGB"))
    return Portrait(image, tuple(meta["mouth_box"]), float(meta["lip_line_y"]),
                    [tuple(b) for b in meta["eye_boxes"]], tuple(meta["face_box"]), float(meta.get("lip_curve", 0.0)),
                    meta["name"], str(folder / meta["image"]))


def read_image(path, max_side: int = 512) -> tuple[np.ndarray, float]:
    """Read an image file as ``uint8 [H, W, 3]`` RGB. Returns the image and the scale applied.

    It is scaled so its longer side is at most ``max_side``.
    It is cropped to even sizes for H.264 yuv420p.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"portrait {path!r} does not exist; expected an image file (PNG, JPEG...)")
    if os.path.isdir(path):
        raise PortraitError(f"portrait {path!r} is a folder; expected an image file (PNG, JPEG...)")
    try:
        with Image.open(path) as im:
            im.load()
            im = im.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise PortraitError(f"portrait {path!r} is not an image that can be read ({exc}); "
                            f"expected a PNG or JPEG photo of a face") from None
    scale = min(1.0, max_side / max(im.size))
    if scale < 1.0:
        im = im.resize((max(2, round(im.width * scale)), max(2, round(im.height * scale))), Image.LANCZOS)
    w, h = im.width - im.width % 2, im.height - im.height % 2
    if w < 64 or h < 64:
        raise PortraitError(f"portrait {path!r} is {im.width}x{im.height} px; expected at least 64x64")
    return np.ascontiguousarray(np.asarray(im)[:h, :w]), scale


def landmark_regions(face: FaceLandmarks) -> dict:
    """The renderer's geometry from one face's landmarks, in px.

    It is ``{"face_box", "mouth_box", "lip_line_y", "lip_curve", "eye_boxes"}``.
    The lip line is where the lips meet at the mouth's centre: the mean of the inner lips' middle points.
    The curve is how much higher the corners sit.
    The boxes are those of the face, the outer lip contour and each eye's lids.
    """
    centre_y = float(np.mean(face.points[[13, 14], 1]))
    left, right = face.mouth_corners()
    return {"face_box": tuple(float(v) for v in face.face_box()),
            "mouth_box": tuple(float(v) for v in face.mouth_box()),
            "lip_line_y": centre_y, "lip_curve": centre_y - float(left[1] + right[1]) / 2,
            "eye_boxes": [tuple(float(v) for v in b) for b in face.eye_boxes()]}


def detect_face_regions(image: np.ndarray, where: str = "the portrait") -> dict:
    """Find the one face of ``image`` with MediaPipe's face mesh and return :func:`landmark_regions` of it.

    ``image`` is ``uint8 [H, W, 3]`` RGB.
    Raises :class:`PortraitError` naming ``where`` for no face, two faces, or a face narrower than ``MIN_FACE_PX``.
    """
    with FaceLandmarker(max_faces=2) as landmarker:
        faces = landmarker.detect(np.ascontiguousarray(image, dtype=np.uint8))
    try:
        face = one_face(faces, where=where, min_face_px=MIN_FACE_PX)
    except FaceError as exc:
        raise PortraitError(f"{exc}; or give the mouth box yourself (--mouth-box X,Y,W,H)") from None
    return landmark_regions(face)


def estimate_eyes(mouth_box: Box) -> list[Box]:
    """Eye boxes guessed from the mouth box alone, by typical adult proportions."""
    x, y, w, h = mouth_box
    cx, cy = x + w / 2, y + h / 2
    ew, eh = 0.45 * w, 0.17 * w
    ey = cy - 1.05 * w
    return [(cx - 0.52 * w - ew / 2, ey - eh / 2, ew, eh), (cx + 0.52 * w - ew / 2, ey - eh / 2, ew, eh)]


def parse_box(text: str) -> Box:
    """``"X,Y,W,H"`` → a box, with an error saying what was expected."""
    try:
        x, y, w, h = (float(v) for v in text.split(","))
    except ValueError:
        raise PortraitError(f"box {text!r}: expected X,Y,W,H in pixels, e.g. 102,119,42,14") from None
    if w <= 0 or h <= 0:
        raise PortraitError(f"box {text!r}: width and height must be positive")
    return (x, y, w, h)


def load_portrait(path=None, *, mouth_box: Box | None = None, max_side: int = 512) -> Portrait:
    """The portrait to animate.

    Args:
        path: an image file; None for the shipped astronaut portrait.
        mouth_box: ``(x, y, w, h)`` px in the *original* image, scaled with it. None: detect.
        max_side: larger images are scaled down to this longer side.
    Raises:
        FileNotFoundError / PortraitError with the file name and what was expected.
    """
    if path is None:
        p = astronaut_portrait()
        if mouth_box is not None:
            p.mouth_box, p.lip_line_y, p.lip_curve = tuple(mouth_box), mouth_box[1] + mouth_box[3] / 2, 0.0
        return p
    image, scale = read_image(path, max_side)
    h, w = image.shape[:2]
    if mouth_box is not None:
        box = tuple(float(v) * scale for v in mouth_box)
        if box[0] < 0 or box[1] < 0 or box[0] + box[2] > w or box[1] + box[3] > h:
            raise PortraitError(f"mouth box {tuple(mouth_box)} is outside the {round(w / scale)}x"
                                f"{round(h / scale)} portrait {os.fspath(path)!r}")
        try:
            found = detect_face_regions(image, f"portrait {os.fspath(path)!r}")
            eyes, face = found["eye_boxes"], found["face_box"]
        except PortraitError:
            eyes, face = estimate_eyes(box), None
        regions = {"mouth_box": box, "lip_line_y": box[1] + box[3] / 2, "lip_curve": 0.0, "eye_boxes": eyes,
                   "face_box": face}
    else:
        regions = detect_face_regions(image, f"portrait {os.fspath(path)!r}")
    return Portrait(image, regions["mouth_box"], regions["lip_line_y"], regions["eye_boxes"], regions["face_box"],
                    regions["lip_curve"], Path(path).stem, os.fspath(path))
