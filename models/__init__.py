"""Models: audio features, video VAE, linear-DiT denoiser, samplers, the avatar.

- :mod:`framegraph.models.audio`: log-mel, the causal audio encoder, Silero voice activity and the
  ``AudioFeatures`` stage.
- :mod:`framegraph.models.synth`: synthetic talking-portrait clips (eSpeak NG speech, visemes) for training.
- :mod:`framegraph.models.vae`: ``VideoVAE`` (16× spatial, causal in time, streaming decode with a cache),
  ``train_vae`` and the ``VAEDecode`` stage.
- :mod:`framegraph.models.composite`: the generated face region pasted into the full-resolution portrait
  with a feathered mask (``composite`` and the ``Composite`` stage).
- :mod:`framegraph.models.dit`: ``AvatarDiT``, the block-autoregressive linear DiT with a constant-memory
  stream state, few-step generation and the ``Denoiser`` stage.
- :mod:`framegraph.models.sampler`: flow-matching conventions, the few-step Euler sampler, the flow-matching
  and consistency-distillation losses.
- :mod:`framegraph.models.training`: what the trainers share (lr schedule, CPU threads, the
  resume-or-train rule of a training phase, files written whole).
"""
