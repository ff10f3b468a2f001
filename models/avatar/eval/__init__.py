"""Measuring an avatar on what it was not trained on.

- :mod:`.synthetic`: against a synthetic clip's ground truth — mouth-openness correlation, lips closed in
  silence, identity SSIM outside the mouth (``framegraph avatar eval --truth``).
- :mod:`.real`: face-landmark measures of generated frames against a person's real frames (openness
  correlation and swing, PSNR / SSIM outside the lower face, sharpness, lips closed where VAD hears silence).
- :mod:`.video`: a video avatar redrawing its person's held-out frames from their audio, measured with
  :mod:`.real`.
"""
