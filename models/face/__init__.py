"""Face geometry from a real landmark model: MediaPipe's face mesh (478 points) in pixels.

- :class:`FaceLandmarker` (a context manager): uint8 RGB image → the faces' :class:`FaceLandmarks`.
- :class:`FaceLandmarks`: boxes (face, mouth, eyes), lip contours, mouth corners, mouth and eye openness,
  the lower-face polygon a lip-sync model regenerates.
- :func:`one_face` / :class:`FaceError`: the checks a picture must pass to make an avatar (one face, big
  enough), with sentences naming the file and frame.
"""
from .landmarker import MEDIAPIPE, FaceError, FaceLandmarker, one_face
from .landmarks import FaceLandmarks

__all__ = ["MEDIAPIPE", "FaceError", "FaceLandmarker", "FaceLandmarks", "one_face"]
