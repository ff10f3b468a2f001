"""A person's talking video made into training clips (what both avatar kinds train on).

- :mod:`.prepare`: :func:`~.prepare.prepare_video` — checks (one face, speech, lips that move, long enough),
  the face tracked, the video cut into clips with their audio and per-frame landmarks.
- :mod:`.io`: the video read frame by frame (turned upright) and the clips written (PyAV).
"""
