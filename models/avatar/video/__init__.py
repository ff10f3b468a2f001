"""The video kind: a person's own video talks. Their frames are looped (an idle stretch in silence) and a small
UNet redraws the lower face for a mouth shape that a ridge head predicts from the speech.

- :mod:`.bundle`: :class:`VideoAvatar` (``loop.mp4``, ``regions.npz``, ``generator/``, ``shape_head/``,
  ``audio/``), its geometry, loading, saving and graph stages.
- :mod:`.lipsync`: the two small models; :mod:`.stages`: ``MouthShape``, ``MouthRegion``; :mod:`.loop`: the
  ping-pong loop of the person's frames (``VideoLoop``).
- :mod:`.train`: training from one video (:func:`~.train.train_video_avatar`); :mod:`.generator`: its mouth
  generator phase (the loop, its checkpoint and exact resume, its time said up front); :mod:`.critic`: the lips' texture
  critic and its guard; :mod:`.sync`: how late the video's sound is; :mod:`.typed`: eSpeak sentences the head
  also learns; :mod:`.openness`: the openness asked of the generator, calibrated at the end; :mod:`.provenance`:
  the bundle's ``PROVENANCE.md``.
- :mod:`.features`: what the shape head hears (the encoder's features, Whisper's beside them); :mod:`.jaw`: the
  frame's own jaw line kept; :mod:`.engines`, :mod:`.onnx`: the runtimes the models run on.
"""
