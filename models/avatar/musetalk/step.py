"""One frame of MuseTalk 1.5, as it defines the step. The face's latents go in; the redrawn face comes out.

    latents = face_latents(vae, faces)     # [B, 8, S/8, S/8]: the face, lower half blacked out, then whole
    faces = MuseTalkStep(unet, vae)(latents, windows)   # uint8 [B, S, S, 3] (S = 256 for MuseTalk's models)

A face is a square crop, ``uint8 [S, S, 3]`` RGB, scaled to [-1, 1]. Its masked copy has the lower half black
before scaling. The VAE encodes each one. It takes the posterior's mean, times the VAE's ``scaling_factor``. So
every run gives the same picture, where MuseTalk draws a sample. The two latents are joined on channels, masked
first.

The UNet runs once at timestep 0. Its cross-attention is the frame's audio context. That is
:func:`~.audio.frame_windows` plus the position code. The UNet's output is the face's latent. The VAE decodes it as
``x / 2 + 0.5``, clamped and rounded.
"""
from __future__ import annotations

import torch
from torch import nn

from .audio import position_code


def to_unit(faces: torch.Tensor) -> torch.Tensor:
    """``uint8 [B, S, S, 3]`` → ``float32 [B, 3, S, S]`` in [-1, 1]."""
    return faces.permute(0, 3, 1, 2).float() / 127.5 - 1.0


def masked(faces: torch.Tensor) -> torch.Tensor:
    """``uint8 [B, S, S, 3]`` with the lower half black, rows S/2 on. This is what the UNet sees of the mouth."""
    out = faces.clone()
    out[:, faces.shape[1] // 2:] = 0
    return out


@torch.inference_mode()
def encode_faces(vae, faces: torch.Tensor) -> torch.Tensor:
    """``uint8 [B, S, S, 3]`` → ``[B, C, S/f, S/f]``: the posterior's mean, times the VAE's scaling factor."""
    pictures = to_unit(faces).to(vae.device, vae.dtype)
    return vae.encode(pictures).latent_dist.mean * vae.config.scaling_factor


@torch.inference_mode()
def face_latents(vae, faces: torch.Tensor) -> torch.Tensor:
    """``[B, 2C, S/f, S/f]``: the masked faces' latents, then the faces' own. See the module docstring."""
    latents = encode_faces(vae, torch.cat([masked(faces), faces]))
    half = len(faces)
    return torch.cat([latents[:half], latents[half:]], dim=1)


class MuseTalkStep(nn.Module):
    """The UNet and the VAE decoder as one call.

    The call maps ``(latents [B, 8, h, w], windows [B, N, D]) → uint8 [B, S, S, 3]``. ``windows`` is each frame's
    audio context without the position code. The step adds it. Raises :class:`ValueError` when ``windows`` has
    more rows than the position code holds."""

    def __init__(self, unet, vae, context_rows: int | None = None):
        super().__init__()
        self.unet, self.vae = unet, vae
        width = unet.config.cross_attention_dim
        self.max_rows, self.width = context_rows or 64, width  # the context it takes: at most [max_rows, width]
        self.register_buffer("code", position_code(self.max_rows, width), persistent=False)
        self.register_buffer("timestep", torch.zeros((), dtype=torch.long), persistent=False)

    def forward(self, latents: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
        if windows.shape[1] > len(self.code):
            raise ValueError(f"MuseTalkStep: {windows.shape[1]} context rows; the position code holds "
                             f"{len(self.code)}")
        context = windows + self.code[:windows.shape[1]].to(windows.dtype)
        latent = self.unet(latents, self.timestep, encoder_hidden_states=context).sample
        image = self.vae.decode(latent / self.vae.config.scaling_factor).sample
        return (image / 2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8).permute(0, 2, 3, 1)


__all__ = ["MuseTalkStep", "encode_faces", "face_latents", "masked", "to_unit"]
