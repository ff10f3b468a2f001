"""Generating a stream block by block: denoise with a few Euler steps, then append the clean block."""
from __future__ import annotations

import torch

from ..sampler import sample_euler
from .model import AvatarDiT
from .state import DiTStreamState


def generate_block(model: AvatarDiT, stream: DiTStreamState, noise: torch.Tensor, audio: torch.Tensor,
                   state_label: torch.Tensor, *, steps: int = 4, shift: float = 1.0,
                   renoise: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """Denoise one block and advance the stream past it.

    Args:
        noise: ``[B, C, frames_per_block, h, w]`` starting noise, ``x`` at ``t = 1``.
        audio: ``[B, frames_per_block, audio_dim]``.
        state_label: ``[B, frames_per_block, state_dim]``.
        steps / shift / renoise / generator: the sampler, :func:`~framegraph.models.sampler.sample_euler`.

    Returns:
        the clean latents ``[B, C, frames_per_block, h, w]``, already appended to ``stream``.
    """
    x0 = sample_euler(lambda x, t: model(x, t, audio, state_label, stream=stream), noise, steps=steps,
                      shift=shift, renoise=renoise, generator=generator)
    model.append(x0, audio, state_label, stream)
    return x0


def generate(model: AvatarDiT, ref: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor, *,
             steps: int = 4, shift: float = 1.0, generator: torch.Generator | None = None,
             stream: DiTStreamState | None = None) -> torch.Tensor:
    """Generate ``T`` latent frames for ``audio [B, T, F]`` / ``state_label [B, T, S]`` block by block.

    An offline convenience over :func:`generate_block`. ``T`` is a multiple of ``frames_per_block``.

    Returns ``[B, C, T, h, w]``.
    """
    B, T = audio.shape[:2]
    k = model.config.frames_per_block
    if T % k:
        raise ValueError(f"generate: T={T} frames is not a multiple of frames_per_block={k}")
    stream = stream if stream is not None else model.init_stream(ref, batch=B)
    h, w = stream.ref.shape[-2:]
    blocks = []
    for start in range(0, T, k):
        noise = torch.randn(B, model.config.latent_channels, k, h, w, generator=generator, device=stream.ref.device)
        blocks.append(generate_block(model, stream, noise.to(stream.ref.dtype), audio[:, start:start + k],
                                     state_label[:, start:start + k], steps=steps, shift=shift, generator=generator))
    return torch.cat(blocks, dim=2)
