"""The portrait kind: a still picture talks.

An audio-conditioned linear DiT generates the face region's latents block by block. A causal VAE decodes
them. The region is pasted back into the portrait.

- :mod:`.bundle`: :class:`PortraitAvatar`, with ``DIR/{vae,dit,audio}/``, ``portrait.png`` and
  ``avatar.json``. It holds loading, saving and the graph stages. :func:`random_avatar` is for tests.
- :mod:`.engines`: its engines per runtime, torch and ONNX Runtime.
- :mod:`.compiled`: the compiled runtime's engines.
- :mod:`.onnx`: its export to ONNX, with ``framegraph export --avatar``. The export's int8 files belong to
  :mod:`framegraph.models.avatar.int8`, which runs the graph.
- :mod:`.data`: clips → latents, audio features and states.
- :mod:`.train`: the training phases: VAE, audio encoder, flow matching, distillation, rollout. A trained bundle's
decoder is trained further by :mod:`framegraph.models.avatar.refine`.
"""
