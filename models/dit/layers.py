"""Building blocks of :class:`~.model.AvatarDiT`.

They are patches, positions, time embedding, the cross-attention, and the gated conv FFN with its causal temporal
part.

Token layout everywhere: a latent video ``[B, C, T, h, w]`` becomes ``[B, T * hh * ww, D]`` tokens.
They are in row-major ``(frame, y, x)`` order, with ``hh = h / p`` and ``ww = w / p`` for patch size ``p``.
So the tokens of latent frame ``f`` are the contiguous run ``f * n .. (f + 1) * n - 1`` with ``n = hh * ww``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- patches


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """``[B, C, T, h, w]`` → ``[B, T * (h/p) * (w/p), C * p * p]`` tokens in (frame, y, x) order."""
    B, C, T, H, W = x.shape
    if H % p or W % p:
        raise ValueError(f"patchify: latent size {H}x{W} is not divisible by patch_size={p}")
    x = x.reshape(B, C, T, H // p, p, W // p, p).permute(0, 2, 3, 5, 1, 4, 6)
    return x.reshape(B, T * (H // p) * (W // p), C * p * p)


def unpatchify(tokens: torch.Tensor, channels: int, frames: int, height: int, width: int, p: int) -> torch.Tensor:
    """Inverse of :func:`patchify`: ``[B, T * hh * ww, C * p * p]`` → ``[B, C, T, h, w]``."""
    B = tokens.shape[0]
    x = tokens.reshape(B, frames, height // p, width // p, channels, p, p).permute(0, 4, 1, 2, 5, 3, 6)
    return x.reshape(B, channels, frames, height, width)


# ----------------------------------------------------------------------------- positions and time


def rope_tables(frame_offset: int, frames: int, height: int, width: int, head_dim: int, theta: float = 10_000.0,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """3-D rotary tables over (t, y, x) in the interleaved-pair convention of ``framegraph.kernels.rope``.

    The head dim is split like Wan / Sana-Video.
    y and x get ``2 * (D // 6)`` channels each; time gets the rest.
    Time positions are absolute stream frame indices ``frame_offset .. frame_offset + frames - 1``.
    Angles are computed in float64, so positions stay accurate for hours of frames.

    Returns:
        ``(cos, sin)``, each float32 ``[frames * height * width, head_dim]`` in token order (t, y, x).
    """
    if head_dim % 2:
        raise ValueError(f"rope_tables: head_dim={head_dim} must be even")
    d_y = d_x = 2 * (head_dim // 6)
    d_t = head_dim - d_y - d_x

    def axis(positions: torch.Tensor, dim: int) -> torch.Tensor:  # [P] -> [P, dim] angles, each repeated twice
        if dim == 0:
            return positions.new_zeros(positions.shape[0], 0)
        freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
        return (positions[:, None] * freqs[None]).repeat_interleave(2, dim=1)

    f64 = dict(dtype=torch.float64, device=device)
    a_t = axis(torch.arange(frame_offset, frame_offset + frames, **f64), d_t)[:, None, None]
    a_y = axis(torch.arange(height, **f64), d_y)[None, :, None]
    a_x = axis(torch.arange(width, **f64), d_x)[None, None, :]
    shape = (frames, height, width)
    angles = torch.cat([a_t.expand(*shape, d_t), a_y.expand(*shape, d_y), a_x.expand(*shape, d_x)], dim=-1)
    angles = angles.reshape(-1, head_dim)
    return angles.cos().float(), angles.sin().float()


def sincos_2d(height: int, width: int, dim: int, device=None) -> torch.Tensor:
    """Fixed 2-D sin-cos position embedding ``float32 [height * width, dim]``, MAE / DiT style."""
    quarter = dim // 4
    omega = 1.0 / 10_000 ** (torch.arange(quarter, dtype=torch.float64, device=device) / max(quarter, 1))
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float64, device=device),
                            torch.arange(width, dtype=torch.float64, device=device), indexing="ij")
    parts = []
    for pos in (ys.reshape(-1), xs.reshape(-1)):
        a = pos[:, None] * omega[None]
        parts += [a.sin(), a.cos()]
    emb = torch.cat(parts, dim=1)
    return F.pad(emb, (0, dim - emb.shape[1])).float()


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal embedding of ``1000 * t`` → ``[..., dim]``. ``t`` is in [0, 1], any shape ``[...]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = 1000.0 * t.float()[..., None] * freqs
    emb = torch.cat([args.cos(), args.sin()], dim=-1)
    return F.pad(emb, (0, dim - emb.shape[-1]))


def audio_windows(audio: torch.Tensor, history: torch.Tensor | None, past: int) -> torch.Tensor:
    """Per-frame windows of audio features: frame ``f`` gets frames ``f - past .. f``.

    Args:
        audio: ``[B, T, F]`` features of the frames being processed.
        history: ``[B, past, F]`` features of the ``past`` frames before them. None means zeros, the start of a
            stream.

    Returns:
        ``[B, T, past + 1, F]``, oldest first.
    """
    if past == 0:
        return audio[:, :, None]
    if history is None:
        history = audio.new_zeros(audio.shape[0], past, audio.shape[2])
    seq = torch.cat([history.to(audio.dtype), audio], dim=1)  # [B, past + T, F]
    return seq.unfold(1, past + 1, 1).transpose(2, 3)  # [B, T, past + 1, F]


# ----------------------------------------------------------------------------- cross-attention


class CrossAttention(nn.Module):
    """Softmax cross-attention of each frame's tokens to that frame's context tokens.

    The context of latent frame ``f`` starts with the identity tokens.
    They come from the reference latent and are the same for every frame: "always in context".
    The ``W`` audio tokens of ``f``'s window follow.
    It works per frame, so it adds no dependence between frames.

    Shapes: ``x [B*T, n, D]`` and ``audio [B*T, W, D]``.
    ``ref_kv`` holds keys/values of the identity tokens ``([B, H, m, d], [B, H, m, d])``, or None.
    Returns ``[B*T, n, D]``.
    """

    def __init__(self, dim: int, heads: int, qk_norm: bool = True):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_kv = nn.Linear(dim, 2 * dim)
        self.to_out = nn.Linear(dim, dim)
        self.norm_q = nn.RMSNorm(dim, eps=1e-6) if qk_norm else nn.Identity()
        self.norm_k = nn.RMSNorm(dim, eps=1e-6) if qk_norm else nn.Identity()

    def kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, m, D]`` context tokens → keys, values ``[B, H, m, d]``."""
        k, v = self.to_kv(context).chunk(2, dim=-1)
        k = self.norm_k(k)
        return tuple(t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (k, v))

    def forward(self, x: torch.Tensor, ref_kv: tuple[torch.Tensor, torch.Tensor] | None, audio: torch.Tensor,
                frames: int) -> torch.Tensor:
        q = self.norm_q(self.to_q(x)).unflatten(-1, (self.heads, -1)).transpose(1, 2)  # [B*T, H, n, d]
        k, v = self.kv(audio)  # [B*T, H, W, d]
        if ref_kv is not None:
            rk, rv = (t.repeat_interleave(frames, dim=0) for t in ref_kv)  # [B*T, H, m, d]
            k, v = torch.cat([rk, k], dim=2), torch.cat([rv, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).flatten(2))


# ----------------------------------------------------------------------------- feed-forward


class GatedConvFFN(nn.Module):
    """SANA's GLUMBConv with a causal temporal part, SANA-Video style.

    ``x [B, T, n, D]`` → 1x1 expand to ``2 * hidden`` → depthwise 3x3 conv on each frame's ``hh x ww`` grid.
    Then GLU ``a * silu(gate)`` → 1x1 project to ``D``, giving ``y``.
    Then comes the temporal part, a depthwise causal conv over frames with a residual::

        out[f] = y[f] + sum_{i < k} w_i * y[f - i]          (k = temporal_kernel, w: [D, k], zero-init)

    Streaming keeps ``y`` of the last ``k - 1`` frames as a cache, ``[B, k - 1, n, D]``.
    So a chunk processed after its past gives the full-sequence result.
    """

    def __init__(self, dim: int, hidden: int, temporal_kernel: int = 3):
        super().__init__()
        if temporal_kernel < 1:
            raise ValueError(f"GatedConvFFN: temporal_kernel={temporal_kernel}; expected >= 1")
        self.inverted = nn.Linear(dim, 2 * hidden)
        self.depthwise = nn.Conv2d(2 * hidden, 2 * hidden, 3, padding=1, groups=2 * hidden)
        self.point = nn.Linear(hidden, dim)
        self.temporal_kernel = temporal_kernel
        self.temporal_weight = nn.Parameter(torch.zeros(dim, temporal_kernel))

    def spatial(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """``[B, T, n, D]`` → ``y [B, T, n, D]``, frame by frame."""
        B, T, n, _ = x.shape
        h = self.inverted(x).reshape(B * T, height, width, -1).permute(0, 3, 1, 2)
        h = self.depthwise(h).permute(0, 2, 3, 1).reshape(B, T, n, -1)
        a, gate = h.chunk(2, dim=-1)
        return self.point(a * F.silu(gate))

    def temporal(self, y: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal temporal conv of ``y [B, T, n, D]`` after ``cache [B, k-1, n, D]``. A None cache is zeros.

        Returns ``(out [B, T, n, D], new_cache [B, k-1, n, D])``.
        """
        k, T = self.temporal_kernel, y.shape[1]
        if cache is None:
            cache = y.new_zeros(y.shape[0], k - 1, *y.shape[2:])
        seq = torch.cat([cache.to(y.dtype), y], dim=1)  # [B, k-1+T, n, D]
        out = y
        for i in range(k):
            out = out + self.temporal_weight[:, i] * seq[:, k - 1 - i: k - 1 - i + T]
        return out, seq[:, seq.shape[1] - (k - 1):]

    def temporal_with_clean_past(self, y: torch.Tensor, y_clean: torch.Tensor, frames_per_block: int) -> torch.Tensor:
        """Teacher forcing: frame ``f`` reads ``y`` for frames of its own block.

        For earlier blocks it reads ``y_clean``, the clean sequence at this layer.
        That is what streaming sees once earlier blocks were appended clean. ``y, y_clean: [B, T, n, D]``.
        """
        k, T = self.temporal_kernel, y.shape[1]
        block = torch.arange(T, device=y.device) // frames_per_block
        out = y
        for i in range(k):
            if i == 0:
                out = out + self.temporal_weight[:, 0] * y
                continue
            if i >= T:
                break
            pad = y.new_zeros(y.shape[0], i, *y.shape[2:])
            own = torch.cat([pad, y[:, : T - i]], dim=1)
            past = torch.cat([pad, y_clean[:, : T - i]], dim=1)
            same = (block[i:] == block[: T - i])
            same = torch.cat([torch.ones(i, dtype=torch.bool, device=y.device), same])  # padding: zeros either way
            out = out + self.temporal_weight[:, i] * torch.where(same[None, :, None, None], own, past)
        return out
