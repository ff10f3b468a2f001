"""MediaPipe's face mesh behind a small API.

It also holds the checks a face must pass to make an avatar.

The mesh has 478 landmarks. Its model is the ``face_landmark.tflite`` carried by the mediapipe 0.10.x wheel.

mediapipe is installed with ``--no-deps``; ``make install`` does it. Its declared dependencies would add
``opencv-contrib-python`` 5 beside our ``opencv-python-headless`` 4. They would also pull jax. The face mesh
needs neither. It needs only the runtime packages in pyproject.toml. They are absl-py, attrs, flatbuffers and
protobuf 4 or 6. Protobuf 5.x breaks the parsing of its graph config.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from typing import Self

import numpy as np

from .landmarks import N_POINTS, FaceLandmarks

MEDIAPIPE = "mediapipe==0.10.21"  # the pin the Makefile installs (0.10.x: the 1.x wheels carry no model)
# a second face at least this fraction of the largest face's width makes an image ambiguous
SECOND_FACE_RATIO = 0.5
# a face the mesh's own (short-range) detector misses is looked for with the full-range one and meshed in a
# square crop this many times the found box's longer side, around its centre
SMALL_FACE_CROP = 2.5


class FaceError(ValueError):
    """A picture or video that cannot make an avatar. It has no face, two faces, or a face too small."""


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved: int | None = None


@contextlib.contextmanager
def native_logs_silenced():
    """Drop what C++ code writes to stderr in the block.

    That is MediaPipe's absl and TFLite logs, which no setting turns off. Examples are ``W0000 ...
    inference_feedback_manager.cc:114] ...`` and ``INFO: Created TensorFlow Lite XNNPACK delegate``. Meanwhile
    the process's stderr descriptor points at /dev/null. ``sys.stderr`` is flushed first. Nested and threaded
    uses share one redirection."""
    global _quiet_depth, _quiet_saved
    with _quiet_lock:
        if _quiet_depth == 0:
            sys.stderr.flush()
            _quiet_saved = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                sys.stderr.flush()
                os.dup2(_quiet_saved, 2)
                os.close(_quiet_saved)
                _quiet_saved = None


def _protobuf_compatible() -> None:
    """Give protobuf's ``MessageFactory`` back its ``GetPrototype``.

    MediaPipe 0.10.21 calls it, but protobuf 5 removed it. Without it each graph prints an ``AttributeError``. It
    is given back as ``GetMessageClass``, which replaced it."""
    from google.protobuf import message_factory

    if not hasattr(message_factory.MessageFactory, "GetPrototype"):
        message_factory.MessageFactory.GetPrototype = lambda self, descriptor: message_factory.GetMessageClass(
            descriptor)


def mediapipe_solution(name: str, needs: str):
    """The module ``mediapipe.python.solutions.<name>``, with MediaPipe's C++ start-up chatter silenced.

    Without mediapipe, raises an ImportError. It begins with ``needs``, what needs it. It says how to install
    the pinned wheel."""
    os.environ.setdefault("GLOG_minloglevel", "2")
    try:
        _protobuf_compatible()
        with native_logs_silenced():
            return importlib.import_module(f"mediapipe.python.solutions.{name}")
    except ImportError as e:
        raise ImportError(
            f"{needs} ({e}); install it without its dependencies, which would add a second OpenCV: "
            f"`pip install --no-deps {MEDIAPIPE}` (make install does it)"
        ) from e


def started(make):
    """``make()``'s MediaPipe solution with its graph started.

    Its calculators open in the graph's threads after ``make`` returns. They log as they do. So they are
    waited for with the C++ logs silenced."""
    with native_logs_silenced():
        solution = make()
        solution._graph.wait_until_idle()  # SolutionBase keeps its CalculatorGraph there
    return solution


class MediaPipeGraph:
    """A MediaPipe solution's graph run on RGB images.

    The subclass sets ``_graph``. It is a context manager; ``close()`` releases the graph."""

    _graph = None

    def _process(self, frame_rgb: np.ndarray, verb: str):
        """The graph's result for ``frame_rgb``, a uint8 ``[H, W, 3]`` RGB image.

        ``verb`` is the calling method. The error on any other input names it."""
        if self._graph is None:
            raise RuntimeError(f"this {type(self).__name__} was closed; make a new one")
        frame = np.asarray(frame_rgb)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"{verb} wants a uint8 [H, W, 3] RGB image; got {frame.dtype} {frame.shape}")
        with native_logs_silenced():
            return self._graph.process(np.ascontiguousarray(frame))

    def close(self) -> None:
        if self._graph is not None:
            with native_logs_silenced():
                self._graph.close()
            self._graph = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FaceLandmarker(MediaPipeGraph):
    """Finds faces and their 478 landmarks in RGB images.

    It is a context manager; ``close()`` releases the MediaPipe graph.

    ``max_faces``: how many faces to look for. Two tell "two faces" apart from one.
    ``video``: the images are frames of one video, in order. The mesh then tracks the face from frame to
    frame. It does not detect it anew. That is faster and steadier. Leave it False for unrelated images.

    The mesh finds faces with MediaPipe's short-range detector. It is made for faces that fill a good part of the
    picture. Examples are a selfie or a face crop. It misses small faces. An example is a person at a lectern in a wide
    frame. On single images, with ``video`` False, a picture with no face is searched again. It uses the full-range
    detector, for faces up to ~5 m away. Each face it finds is meshed in a square crop around it.
    :data:`SMALL_FACE_CROP` sizes the crop. The landmarks come back in px of the whole picture.
    """

    def __init__(self, *, max_faces: int = 2, video: bool = False, min_confidence: float = 0.5):
        if max_faces < 1:
            raise ValueError(f"max_faces must be >= 1; got {max_faces}")
        self.max_faces, self.video = max_faces, video
        face_mesh = mediapipe_solution("face_mesh", "the face landmarks need MediaPipe's face mesh")
        self._graph = started(lambda: face_mesh.FaceMesh(
            static_image_mode=not video, max_num_faces=max_faces, refine_landmarks=True,
            min_detection_confidence=min_confidence, min_tracking_confidence=min_confidence))

    _finder = None  # the full-range face detector, made on first need

    def detect(self, frame_rgb: np.ndarray) -> list[FaceLandmarks]:
        """uint8 [H, W, 3] RGB → the faces found, largest first.

        Returns [] when there is none.

        On single images this also finds small faces; see the class docstring."""
        faces = self._mesh(frame_rgb)
        if faces or self.video:
            return faces
        return self._small_faces(np.asarray(frame_rgb))

    def _mesh(self, frame_rgb: np.ndarray, offset=(0.0, 0.0), size=None) -> list[FaceLandmarks]:
        """The mesh's faces in ``frame_rgb``, largest first.

        Their points are moved by ``offset`` px into a picture of ``size``. ``size`` is (width, height) and
        defaults to this picture's."""
        result = self._process(frame_rgb, "detect")
        height, width = np.shape(frame_rgb)[:2]
        faces = []
        for face in result.multi_face_landmarks or []:
            xy = np.array([(p.x, p.y) for p in face.landmark], np.float32)
            if len(xy) != N_POINTS:  # refine_landmarks=True always gives 478; anything else is a bug
                raise RuntimeError(f"MediaPipe gave {len(xy)} landmarks, expected {N_POINTS}")
            xy = xy * np.array([width, height], np.float32) + np.asarray(offset, np.float32)
            faces.append(FaceLandmarks(xy, size or (width, height)))
        return sorted(faces, key=lambda f: -f.size_px())

    def _small_faces(self, frame: np.ndarray) -> list[FaceLandmarks]:
        """Faces too small for the mesh's detector.

        The full-range detector finds them. Each is meshed in a square crop around it, one face per crop. That
        detector reports one face per picture. So each face found is painted over. Then the picture is searched
        again, up to ``max_faces``."""
        if self._finder is None:
            needs = "finding small faces needs MediaPipe's face detection"
            face_detection = mediapipe_solution("face_detection", needs)
            self._finder = started(lambda: face_detection.FaceDetection(model_selection=1,
                                                                        min_detection_confidence=0.5))
        height, width = frame.shape[:2]
        search, faces = np.ascontiguousarray(frame), []
        for _ in range(self.max_faces):
            with native_logs_silenced():
                found = self._finder.process(search).detections
            if not found:
                break
            box = found[0].location_data.relative_bounding_box
            cx, cy = (box.xmin + box.width / 2) * width, (box.ymin + box.height / 2) * height
            side = max(box.width * width, box.height * height)
            x0, y0, x1, y1 = _square(cx, cy, SMALL_FACE_CROP * side, width, height)
            if x1 - x0 >= 8 and y1 - y0 >= 8:
                faces += self._mesh(frame[y0:y1, x0:x1], (x0, y0), (width, height))[:1]
            search = search.copy()
            x0, y0, x1, y1 = _square(cx, cy, 1.3 * side, width, height)
            search[y0:y1, x0:x1] = search[y0:y1, x0:x1].mean(axis=(0, 1)).astype(np.uint8)
        return sorted(faces, key=lambda f: -f.size_px())

    def close(self) -> None:
        if self._finder is not None:
            with native_logs_silenced():
                self._finder.close()
            self._finder = None
        super().close()

    def detect_one(self, frame_rgb: np.ndarray, *, where: str, min_face_px: int = 0) -> FaceLandmarks:
        """The one face of ``frame_rgb``, or :class:`FaceError` naming ``where``, e.g. "talk.mp4 frame 12"."""
        return one_face(self.detect(frame_rgb), where=where, min_face_px=min_face_px)


def _square(cx: float, cy: float, side: float, width: int, height: int) -> tuple[int, int, int, int]:
    """The square of ``side`` px centred at (``cx``, ``cy``), as (x0, y0, x1, y1).

    It is clipped to a ``width`` x ``height`` picture."""
    half = side / 2
    x0, y0 = max(0, int(cx - half)), max(0, int(cy - half))
    return x0, y0, min(width, int(cx + half) + 1), min(height, int(cy + half) + 1)


def one_face(faces: list[FaceLandmarks], *, where: str, min_face_px: int = 0) -> FaceLandmarks:
    """The single face of an image, else :class:`FaceError`.

    ``faces`` are as :meth:`FaceLandmarker.detect` returns them, largest first. The error is raised when no face is
    found. It is raised for two faces. A second face counts if it is at least ``SECOND_FACE_RATIO`` of the first's
    width. A smaller face in the background is ignored. It is raised when the face is narrower than ``min_face_px``."""
    if not faces:
        raise FaceError(f"no face found in {where}: the face must be visible, frontal-ish and lit; "
                        "try a frame where the person looks at the camera")
    if len(faces) > 1 and faces[1].size_px() >= SECOND_FACE_RATIO * faces[0].size_px():
        raise FaceError(f"two faces found in {where} ({faces[0].size_px()} and {faces[1].size_px()} px wide); "
                        "an avatar is made of one person: crop the picture to that person")
    size = faces[0].size_px()
    if size < min_face_px:
        raise FaceError(f"face too small in {where} ({size} px wide, need ≥ {min_face_px} px): use a closer "
                        "shot or a higher resolution")
    return faces[0]
