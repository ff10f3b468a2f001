"""The avatar denoiser: a block-autoregressive linear DiT with a constant-memory stream state.

    from framegraph.models.dit import AvatarDiT, Denoiser, generate

- :class:`AvatarDiT` in ``model.py``: the diffusers-format ``PretrainedModel``. It predicts velocity. It has a
  teacher-forced training call and ``init_stream`` / ``append`` for streaming.
- :class:`DiTStreamState` in ``state.py``: per-layer fp32 linear-attention sums + FFN temporal caches.
- :func:`generate_block`, :func:`generate` in ``generate.py``: few-step Euler denoising + append.
- :class:`Denoiser` in ``stage.py``: the stream-graph stage. Features + state go in, latent chunks come out.
- ``batch.py``: many sessions' streams, one batch per block, through a model service's lane.

Training follows the conventions of :mod:`framegraph.models.sampler`::

    model = AvatarDiT.from_preset("tiny", latent_channels=8, sample_size=8, frames_per_block=1)
    # x0 [B, 8, T, 8, 8] VAE latents of a clip's face region, ref [B, 8, 8, 8] the portrait's latent,
    # audio [B, T, 128] AudioFeatures per video frame, label [B, T, 4] state vectors.
    k = model.config.frames_per_block
    cond = dict(audio=audio, state_label=label, ref=ref, clean=x0)      # teacher forcing
    loss = flow_matching_loss(model, x0, cond, time_shape=(B, T // k), time_repeat=k, shift=shift)
    # few-step distillation (student initialised from the teacher; target = EMA of the student):
    loss = distill_loss(student, teacher, x0, cond, target=ema, time_shape=(B, T // k), time_repeat=k)
    # against drift: generate the context with the model itself, then learn to return to the data
    with torch.no_grad():
        rollout = generate(model, ref, audio, label, steps=2)
    loss = flow_matching_loss(model, x0, dict(cond, clean=rollout), time_shape=(B, T // k), time_repeat=k)
"""
from .generate import generate, generate_block
from .model import PRESETS, AvatarDiT
from .stage import Denoiser, DiTEngine, TorchDiT
from .state import DiTStreamState, LayerStreamState

__all__ = ["AvatarDiT", "PRESETS", "DiTStreamState", "LayerStreamState", "generate", "generate_block", "Denoiser",
           "DiTEngine", "TorchDiT"]
