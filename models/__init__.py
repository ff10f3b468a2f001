"""Models: audio features, video VAE, linear-DiT denoiser, samplers, the avatar.

- :mod:`framegraph.models.audio`: log-mel, the causal audio encoder, Silero voice activity and the
  ``AudioFeatures`` stage.
- :mod:`framegraph.models.synth`: synthetic talking-portrait clips (eSpeak NG speech, visemes) for training.
"""
