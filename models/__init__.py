"""Models: what a pipeline's model stages compute with, and how they are trained and run.

The index, by module (each imported when used):

- :mod:`.audio`: log-mel, the causal audio encoder, Whisper's speech features, Silero voice activity and the
  ``AudioFeatures`` stage;
- :mod:`.avatar`: talking avatars (the portrait, video and MuseTalk kinds): bundles, training, the graph, evaluation;
- :mod:`.dit`: ``AvatarDiT``, the block-autoregressive linear DiT with a constant-memory state, and the
  ``Denoiser`` stage;
- :mod:`.vae`: ``VideoVAE`` (causal in time, streaming decode), ``train_vae`` and the ``VAEDecode`` stage;
- :mod:`.generate`: Wan / SANA-Video causal generation from a diffusers model folder;
- :mod:`.face`: face landmarks and the mouth's measures; :mod:`.matte`: the person matte;
- :mod:`.synth`: synthetic talking-portrait clips (eSpeak NG speech, visemes) for training;
- :mod:`.composite`: a generated region pasted into the full frame (``Composite``);
- :mod:`.sampler`: flow matching, the few-step Euler sampler and its losses;
- :mod:`.runtime`: where a model computes (torch, compiled, ONNX Runtime) and each model's engines;
  :mod:`.compile`, :mod:`.graphs`: the compiled runtime and its CUDA graphs; :mod:`.onnx`: exports and sessions;
- :mod:`.training`: what the trainers share; :mod:`.pretrained`: the diffusers-format model base.
"""

__all__ = ["audio", "avatar", "compile", "composite", "dit", "face", "generate", "graphs", "matte", "onnx",
           "pretrained", "runtime", "sampler", "synth", "training", "vae"]
