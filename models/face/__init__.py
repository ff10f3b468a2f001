"""Face geometry from a real landmark model: MediaPipe's face mesh (478 points) in pixels.

- :class:`FaceLandmarker` (a context manager): uint8 RGB image → the faces' :class:`FaceLandmarks`.
- :class:`FaceLandmarks`: boxes (face, mouth, eyes), lip contours, mouth corners, mouth and eye openness,
  the lower-face polygon a lip-sync model regenerates.
- :func:`track_openness` (a video's frames → per-frame mouth / eye openness) and :func:`outside_mouth_mask`
  (the face without its lower part: what a lip-sync model must leave as it was).
- :func:`one_face` / :class:`FaceError`: the checks a picture must pass to make an avatar (one face, big
  enough), with sentences naming the file and frame.
"""
from .landmarker import MEDIAPIPE, FaceError, FaceLandmarker, one_face
from .landmarks import FaceLandmarks
from .track import OpennessTrack, outside_mouth_mask, track_openness

__all__ = ["MEDIAPIPE", "FaceError", "FaceLandmarker", "FaceLandmarks", "OpennessTrack", "one_face",
           "outside_mouth_mask", "track_openness"]
