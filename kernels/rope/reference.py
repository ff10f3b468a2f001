"""Rotary position embedding, pure torch: the readable twin of ``triton.py``.

The convention is diffusers' ``apply_rotary_emb`` inside the Sana-Video / Wan linear attention processors.
Channels are rotated in *interleaved pairs* ``(x[2i], x[2i+1])``. ``cos`` and ``sin`` come in the full head
width ``D``. Each angle is repeated twice, as
``get_1d_rotary_pos_embed(..., repeat_interleave_real=True)`` makes them. Exactly like diffusers, the cosine
of pair ``i`` is read at ``cos[..., 2i]``. The sine is read at ``sin[..., 2i+1]``::

    out[2i]   = x[2i] * cos[2i] - x[2i+1] * sin[2i+1]
    out[2i+1] = x[2i] * sin[2i+1] + x[2i+1] * cos[2i]
"""
from __future__ import annotations

import torch


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs of ``x``. Computed in fp32, returned in ``x.dtype``.

    Args:
        x: ``[..., D]`` with ``D`` even.
        cos, sin: broadcastable to ``x``, ``[..., D]``. Each angle is repeated for both channels of a pair.
    """
    x_even, x_odd = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c = cos[..., 0::2].float()
    s = sin[..., 1::2].float()
    out = torch.stack((x_even * c - x_odd * s, x_even * s + x_odd * c), dim=-1).flatten(-2)
    return out.to(x.dtype)


def diffusers_apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The ``apply_rotary_emb`` of diffusers' ``SanaLinearAttnProcessor3_0``, as diffusers writes it.

    It lives in diffusers/models/transformers/transformer_sana_video.py. It is the same rotation as
    :func:`apply_rope` but computed in ``x``'s dtype. It is the unfused peer that ``bench kernels`` times. The
    tests compare against it. ``x`` is ``[..., D]``. ``cos`` and ``sin`` broadcast to it.
    """
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)
