"""Face measures over the frames of a video.

They are mouth and eye openness per frame, and the lower face's mask.

    track = track_openness(iter_video_frames("talk.mp4"))
    track.mouth_openness     # float64 [T], NaN where no face was found
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .landmarker import FaceLandmarker
from .landmarks import FaceLandmarks


@dataclass
class OpennessTrack:
    """Per-frame measures of one face through a video, as ``[T]`` arrays. NaN where no face was found."""
    mouth_openness: np.ndarray
    eyes_openness: np.ndarray
    mouth_width_px: np.ndarray

    @property
    def found(self) -> np.ndarray:
        """bool [T]: frames where a face was found."""
        return np.isfinite(self.mouth_openness)


def track_openness(frames: Iterable[np.ndarray], *, max_frames: int | None = None) -> OpennessTrack:
    """Run the face mesh in video mode over ``frames``, uint8 ``[H, W, 3]`` RGB in order.

    It keeps the largest face's measures of every frame. They are mouth openness, eye openness and mouth
    width."""
    mouth, eyes, width = [], [], []
    with FaceLandmarker(max_faces=1, video=True) as landmarker:
        for i, frame in enumerate(frames):
            if max_frames is not None and i >= max_frames:
                break
            faces = landmarker.detect(frame)
            f = faces[0] if faces else None
            mouth.append(f.mouth_openness() if f else np.nan)
            eyes.append(f.eyes_openness() if f else np.nan)
            width.append(f.mouth_width() if f else np.nan)
    as_array = lambda v: np.array(v, dtype=np.float64)  # noqa: E731
    return OpennessTrack(as_array(mouth), as_array(eyes), as_array(width))


def outside_mouth_mask(face: FaceLandmarks, grow_px: int = 4) -> np.ndarray:
    """bool [H, W]: the face box without the lower-face polygon, grown by ``grow_px``.

    A lip-sync model must leave this part of the face as it was. It holds the eyes, brows, nose, forehead and
    upper cheeks."""
    import cv2

    width, height = face.image_size
    mask = np.zeros((height, width), np.uint8)
    x, y, w, h = face.face_box()
    mask[y:y + h, x:x + w] = 1
    lower = np.zeros_like(mask)
    cv2.fillPoly(lower, [np.round(face.lower_face_polygon()).astype(np.int32)], 1)
    if grow_px > 0:
        lower = cv2.dilate(lower, np.ones((2 * grow_px + 1, 2 * grow_px + 1), np.uint8))
    return (mask > 0) & (lower == 0)
