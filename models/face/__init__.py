"""Face geometry from a real landmark model, in pixels.

The model is MediaPipe's face mesh of 478 points.

- :class:`FaceLandmarker` is a context manager. It maps a uint8 RGB image to the faces' :class:`FaceLandmarks`.
- :class:`FaceLandmarks` gives boxes for the face, mouth and eyes. It gives lip contours and mouth corners.
  It gives mouth and eye openness. It gives the lower-face polygon that a lip-sync model regenerates.
- :func:`track_openness` maps a video's frames to per-frame mouth and eye openness.
- :func:`outside_mouth_mask` is the face without its lower part. A lip-sync model must leave that part as it was.
- :func:`one_face` and :class:`FaceError` check a picture for an avatar. It needs one face, big enough. The
  errors name the file and frame.
"""
from .landmarker import MEDIAPIPE, FaceError, FaceLandmarker, one_face
from .landmarks import FaceLandmarks
from .track import OpennessTrack, outside_mouth_mask, track_openness

__all__ = ["MEDIAPIPE", "FaceError", "FaceLandmarker", "FaceLandmarks", "OpennessTrack", "one_face",
           "outside_mouth_mask", "track_openness"]
