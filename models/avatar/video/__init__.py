"""The video kind: a person's own video talks.

Their frames are looped, with an idle stretch in silence. A ridge head predicts a mouth shape from the speech.
A small UNet redraws the lower face for that shape.

- :mod:`.bundle`: :class:`VideoAvatar`, with ``loop.mp4``, ``regions.npz``, ``generator/``, ``shape_head/``
  and ``audio/``. It holds the geometry, loading, saving and graph stages.
- :mod:`.lipsync`: the two small models.
- :mod:`.stages`: ``MouthShape`` and ``MouthRegion``.
- :mod:`.loop`: the ping-pong loop of the person's frames, ``VideoLoop``.
- :mod:`.train`: training from one video, :func:`~.train.train_video_avatar`.
- :mod:`.generator`: its mouth generator phase. It holds the loop, its checkpoint and exact resume, and its
  time said up front.
- :mod:`.critic`: the lips' texture critic and its guard.
- :mod:`.sync`: how late the video's sound is.
- :mod:`.espeak_rows`: eSpeak sentences the head also learns.
- :mod:`.openness`: the openness asked of the generator, calibrated at the end.
- :mod:`.provenance`: the bundle's ``PROVENANCE.md``.
- :mod:`.features`: what the shape head hears: the encoder's features, and Whisper's beside them.
- :mod:`.jaw`: the frame's own jaw line, kept.
- :mod:`.engines` and :mod:`.onnx`: the runtimes the models run on.
"""
