"""Streaming decode and encode for diffusers' causal video VAE ``AutoencoderKLWan``: Wan 2.1 / 2.2, SANA-Video.

``AutoencoderKLWan.decode`` already decodes one latent frame at a time.
Every ``WanCausalConv3d`` of its decoder reads the last ``CACHE_T = 2`` frames of its input from the previous frame's
call.
They sit in a list ``feat_cache`` with one entry per causal conv, walked in order with an index ``feat_idx``.
The first latent frame is decoded with ``first_chunk=True`` and becomes one video frame.
Every later latent frame becomes ``scale_factor_temporal`` frames.
But ``decode`` clears that cache before and after each call, so it can only decode a whole video.

:func:`decode_chunk` runs the same loop over one chunk of latent frames.
The cache is held in a :class:`WanDecodeState` that is passed in and returned. Nothing is kept in the VAE.
Decoding a latent video chunk by chunk gives the frames of one ``vae.decode`` of the whole video.
The state is a fixed number of 2-frame feature maps, so its size does not depend on the stream's length.

Input is what ``vae.decode`` takes.
Diffusers' video pipelines first map the transformer's latents with ``latents * latents_std + latents_mean``.
Those are the VAE config's per-channel statistics.
Spatial tiling with ``vae.enable_tiling()`` is not used here.

:func:`encode_chunk` is the encoder's twin, for video-to-video.
``AutoencoderKLWan.encode`` reads the first video frame alone, then ``scale_factor_temporal`` frames per latent frame.
It keeps the same kind of cache.
Streamed in pieces of whole latent frames, it gives the latents of one ``vae.encode`` of the whole video.
Those latents are the posterior's mean.

Use::

    state = None
    for chunk in latent_chunks:                          # [B, z_dim, F, h, w], any F >= 1
        video, state = decode_chunk(vae, chunk, state)   # [B, 3, T, h * 8, w * 8] in [-1, 1]
    state.reset()                                        # or state = None: a new stream
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, patchify, unpatchify

__all__ = ["WanDecodeState", "WanEncodeState", "decode_chunk", "encode_chunk", "to_vae_scale", "from_vae_scale"]


@dataclass
class WanDecodeState:
    """The decoder's temporal past: the VAE's ``feat_cache`` and how far the stream has come.

    Attributes:
        feat_cache: one entry per ``WanCausalConv3d`` of ``vae.decoder``, in the order the decoder visits them.
            ``None`` before the first frame. Then the last frames of that conv's input, up to 2: ``[B, C, <=2, h,
            w]``. After the first frame a temporal upsampler holds diffusers' marker ``"Rep"`` instead.
        frames: latent frames decoded so far. 0 means the next frame is the stream's first.
        latent_shape: ``(B, h, w)`` of the stream's latents. ``None`` before the first frame.
    """

    feat_cache: list = field(default_factory=list)
    frames: int = 0
    latent_shape: tuple[int, int, int] | None = None

    @classmethod
    def empty(cls, vae: AutoencoderKLWan) -> WanDecodeState:
        """The state of a stream that has not started."""
        return cls([None] * sum(isinstance(m, WanCausalConv3d) for m in vae.decoder.modules()))

    def reset(self) -> None:
        """Forget the stream: the next chunk is decoded as the first of a video."""
        self.feat_cache = [None] * len(self.feat_cache)
        self.frames = 0
        self.latent_shape = None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in self.feat_cache if isinstance(t, torch.Tensor)]

    def nbytes(self) -> int:
        """Bytes held: the same after the first two latent frames however long the stream runs."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


@torch.no_grad()
def decode_chunk(
    vae: AutoencoderKLWan, latents: torch.Tensor, state: WanDecodeState | None = None, *, decoder=None
) -> tuple[torch.Tensor, WanDecodeState]:
    """Decode the next latent frames of a stream.

    Args:
        vae: the stock ``AutoencoderKLWan``.
        latents: ``[B, z_dim, F, h, w]``, ``F >= 1``, the next ``F`` latent frames at VAE scale; see the module docs.
        state: the state returned for the previous chunk. ``None`` starts a stream. It is not modified.
        decoder: what runs ``vae.decoder``. By default it is itself; the compiled runtime passes it compiled.

    Returns:
        ``(video, state)``: ``video [B, out_channels, T, h * s, w * s]`` clamped to ``[-1, 1]``, and the state to pass
        with the next chunk. ``s`` is the spatial factor and ``r`` the temporal one. ``T = 1 + r * (F - 1)`` for the
        stream's first chunk, ``r * F`` after.
    """
    if not isinstance(vae, AutoencoderKLWan):
        raise TypeError(f"decode_chunk: vae is a {type(vae).__name__}; expected an AutoencoderKLWan")
    z_dim = vae.config.z_dim
    if latents.dim() != 5 or latents.shape[1] != z_dim or latents.shape[2] == 0:
        raise ValueError(
            f"decode_chunk: latents have shape {tuple(latents.shape)}; expected [B, z_dim={z_dim}, F >= 1, h, w]"
        )
    if state is None:
        state = WanDecodeState.empty(vae)
    shape = (latents.shape[0], *latents.shape[3:])
    if state.latent_shape is not None and state.latent_shape != shape:
        raise ValueError(
            f"decode_chunk: latents of batch, height, width {shape} do not continue the stream's {state.latent_shape}; "
            f"start a new stream (state=None or state.reset())"
        )
    cache = list(state.feat_cache)  # the decoder rebinds entries; the caller's state stays as it was
    x = vae.post_quant_conv(latents)
    frames = []
    decoder = vae.decoder if decoder is None else decoder
    for i in range(x.shape[2]):
        first = state.frames == 0 and i == 0
        frames.append(decoder(x[:, :, i:i + 1], feat_cache=cache, feat_idx=[0], first_chunk=first))
    out = torch.cat(frames, dim=2)
    if vae.config.patch_size is not None:
        out = unpatchify(out, patch_size=vae.config.patch_size)
    return out.clamp(-1.0, 1.0), WanDecodeState(cache, state.frames + x.shape[2], shape)


class WanEncodeState(WanDecodeState):
    """The encoder's temporal past: ``feat_cache`` over ``vae.encoder``'s causal convs.

    ``frames`` counts video frames encoded.
    ``latent_shape`` is ``(B, H, W)`` of the stream's video frames.
    """

    @classmethod
    def empty(cls, vae: AutoencoderKLWan) -> WanEncodeState:
        return cls([None] * sum(isinstance(m, WanCausalConv3d) for m in vae.encoder.modules()))


@torch.no_grad()
def encode_chunk(
    vae: AutoencoderKLWan, video: torch.Tensor, state: WanEncodeState | None = None
) -> tuple[torch.Tensor, WanEncodeState]:
    """Encode the next video frames of a stream to latents: the posterior's mean, at VAE scale.

    Args:
        vae: the stock ``AutoencoderKLWan``.
        video: ``[B, 3, T, H, W]`` in ``[-1, 1]``. ``T = 1 + r * k`` for the stream's first chunk, ``r * k`` after.
            ``r = vae.config.scale_factor_temporal``, and ``k >= 0`` counts latent frames.
        state: the state returned for the previous chunk. ``None`` starts a stream. It is not modified.

    Returns:
        ``(latents, state)``: ``latents [B, z_dim, (1 if first) + k, H / s, W / s]`` and the next state.
    """
    if not isinstance(vae, AutoencoderKLWan):
        raise TypeError(f"encode_chunk: vae is a {type(vae).__name__}; expected an AutoencoderKLWan")
    r = vae.config.scale_factor_temporal
    state = WanEncodeState.empty(vae) if state is None else state
    first = state.frames == 0
    frames = video.shape[2] if video.dim() == 5 else 0
    if video.dim() != 5 or (frames - first) % r or frames < first:
        need = f"1 + {r} * k (the stream's first chunk)" if first else f"a multiple of {r}"
        raise ValueError(f"encode_chunk: video has shape {tuple(video.shape)}; expected [B, 3, T, H, W] "
                         f"with T = {need}")
    shape = (video.shape[0], *video.shape[3:])
    if state.latent_shape is not None and state.latent_shape != shape:
        raise ValueError(
            f"encode_chunk: frames of batch, height, width {shape} do not continue the stream's {state.latent_shape}; "
            f"start a new stream (state=None)"
        )
    x = patchify(video, patch_size=vae.config.patch_size) if vae.config.patch_size is not None else video
    cache, outs = list(state.feat_cache), []
    pieces = ([(0, 1)] if first else []) + [(s, s + r) for s in range(int(first), frames, r)]
    for start, end in pieces:
        outs.append(vae.encoder(x[:, :, start:end], feat_cache=cache, feat_idx=[0]))
    moments = vae.quant_conv(torch.cat(outs, dim=2))
    return moments[:, : vae.config.z_dim], WanEncodeState(cache, state.frames + frames, shape)


def _stats(vae: AutoencoderKLWan, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean, dtype=like.dtype, device=like.device).view(1, z, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=like.dtype, device=like.device).view(1, z, 1, 1, 1)
    return mean, std


def to_vae_scale(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """The transformer's latents ``[B, z_dim, F, h, w]`` → what ``vae.decode`` takes.

    It computes ``x * std + mean``, as diffusers' Wan and SANA-Video pipelines do.
    """
    mean, std = _stats(vae, latents)
    return latents * std + mean


def from_vae_scale(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`to_vae_scale`: encoder output → the transformer's latent space."""
    mean, std = _stats(vae, latents)
    return (latents - mean) / std
