"""Measuring an avatar on what it was not trained on.

- :mod:`.synthetic`: against a synthetic clip's ground truth, with ``framegraph avatar eval --truth``. It
  measures mouth-openness correlation, lips closed in silence and identity SSIM outside the mouth.
- :mod:`.real`: face-landmark measures of generated frames against a person's real frames. They are
  openness correlation and swing, PSNR / SSIM outside the lower face and sharpness. They include lips closed
  where VAD hears silence.
- :mod:`.video`: a video avatar redraws its person's held-out frames from their audio. :mod:`.real` measures
  them.
- :mod:`.musetalk`: a MuseTalk avatar redraws the person's real frames from their sound. :mod:`.real` measures
  them too.
"""
