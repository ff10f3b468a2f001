"""Models: what a pipeline's model stages compute with, and how they are trained and run.

The index, by module. Each is imported when used.

- :mod:`.audio`: log-mel, the causal audio encoder, Whisper's speech features and Silero voice activity.
  Also the ``AudioFeatures`` stage.
- :mod:`.avatar`: talking avatars of the portrait, video and MuseTalk kinds.
  Bundles, training, the graph, evaluation.
- :mod:`.dit`: ``AvatarDiT``, the block-autoregressive linear DiT with a constant-memory state.
  Also the ``Denoiser`` stage.
- :mod:`.vae`: ``VideoVAE``, causal in time with a streaming decode. Also ``train_vae`` and the ``VAEDecode`` stage.
- :mod:`.generate`: Wan and SANA-Video causal generation from a diffusers model folder.
- :mod:`.face`: face landmarks and the mouth's measures.
- :mod:`.matte`: the person matte.
- :mod:`.synth`: synthetic talking-portrait clips for training, with eSpeak NG speech and visemes.
- :mod:`.composite`: a generated region pasted into the full frame, ``Composite``.
- :mod:`.sampler`: flow matching, the few-step Euler sampler and its losses.
- :mod:`.runtime`: where a model computes, and each model's engines.
  The runtimes are torch, compiled and ONNX Runtime.
- :mod:`.compile` and :mod:`.graphs`: the compiled runtime and its CUDA graphs.
- :mod:`.onnx`: exports and sessions.
- :mod:`.training`: what the trainers share.
- :mod:`.pretrained`: the diffusers-format model base.
"""

__all__ = ["audio", "avatar", "compile", "composite", "dit", "face", "generate", "graphs", "matte", "onnx",
           "pretrained", "runtime", "sampler", "synth", "training", "vae"]
