"""A person's talking video made into training clips. Both trained avatar kinds train on them.

- :mod:`.prepare`: :func:`~.prepare.prepare_video`. It checks for one face, speech, lips that move and enough
  length. It tracks the face. It cuts the video into clips with their audio and per-frame landmarks.
- :mod:`.io`: the video read frame by frame and turned upright, and the clips written, with PyAV.
"""
