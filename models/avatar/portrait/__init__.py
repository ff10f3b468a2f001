"""The portrait kind: a still picture talks. An audio-conditioned linear DiT generates the face region's latents
block by block, a causal VAE decodes them, and the region is pasted back into the portrait.

- :mod:`.bundle`: :class:`PortraitAvatar` (``DIR/{vae,dit,audio}/``, ``portrait.png``, ``avatar.json``), its
  loading, saving and graph stages; :func:`random_avatar` for tests.
- :mod:`.engines`: its engines per runtime (torch, ONNX Runtime), :mod:`.compiled` the compiled runtime's;
  :mod:`.onnx`: its export to ONNX (``framegraph
  export --avatar``). The export's int8 files are :mod:`framegraph.models.avatar.int8`'s (it runs the graph).
- :mod:`.data` / :mod:`.train`: clips → latents, audio features and states; the training phases (VAE, audio
  encoder, flow matching, distillation, rollout). A trained bundle's decoder trained further:
  :mod:`framegraph.models.avatar.refine`.
"""
