"""Block-causal ReLU linear attention in pure torch. The readable twin of ``triton.py``.

Blocks are ``block_size`` consecutive tokens. For a token ``m`` in block ``b``::

    phi(x)  = relu(x)                          feature map, on q and k
    rot(x)  = apply_rope(x, cos, sin)          identity when no rope is given
    S_b     = S_0 + sum_{n in blocks <= b} v_n rot(phi(k_n))^T     [Dv, D]  numerator state
    z_b     = z_0 + sum_{n in blocks <= b} phi(k_n)                [D]      denominator state
    out_m   = S_b rot(phi(q_m)) / (z_b . phi(q_m) + eps)

RoPE rotates only the numerator's features. The denominator uses the un-rotated ones. That is what
diffusers' ``SanaLinearAttnProcessor3_0`` does, in transformer_sana_video.py. Everything is computed in fp32.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..rope.reference import apply_rope


class LinearAttentionState(NamedTuple):
    """Everything before the next token, in fp32. Its memory does not depend on stream length.

    kv: ``[B, H, Dv, D]``, the numerator. It sums ``v rot(phi(k))^T`` over past tokens.
    k_sum: ``[B, H, D]``, the denominator. It sums the un-rotated ``phi(k)`` over past tokens.
    """

    kv: torch.Tensor
    k_sum: torch.Tensor


def zero_state(batch: int, heads: int, dim: int, value_dim: int, device=None) -> LinearAttentionState:
    return LinearAttentionState(
        kv=torch.zeros(batch, heads, value_dim, dim, device=device, dtype=torch.float32),
        k_sum=torch.zeros(batch, heads, dim, device=device, dtype=torch.float32),
    )


def block_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    state: LinearAttentionState | None = None,
    eps: float = 1e-15,
) -> tuple[torch.Tensor, LinearAttentionState]:
    """Block-causal linear attention of ``q, k [B, H, N, D]`` and ``v [B, H, N, Dv]``.

    ``rope`` is ``cos, sin``, broadcastable to ``[B, H, N, D]``. Returns ``out [B, H, N, Dv]`` in q's dtype.
    Also returns the state after the last token.
    """
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    q_feat, k_feat, v32 = F.relu(q.float()), F.relu(k.float()), v.float()
    if rope is None:
        q_rot, k_rot = q_feat, k_feat
    else:
        q_rot, k_rot = apply_rope(q_feat, *rope), apply_rope(k_feat, *rope)

    if state is None:
        state = zero_state(B, H, D, Dv, device=q.device)
    kv, k_sum = state.kv.float(), state.k_sum.float()

    outs = []
    for start in range(0, N, block_size):
        block = slice(start, start + block_size)
        # The block sees itself, bidirectionally, and every earlier block: update first, then read.
        kv = kv + v32[:, :, block].transpose(-1, -2) @ k_rot[:, :, block]  # [B, H, Dv, D]
        k_sum = k_sum + k_feat[:, :, block].sum(dim=2)  # [B, H, D]
        numerator = q_rot[:, :, block] @ kv.transpose(-1, -2)  # [B, H, block, Dv]
        denominator = q_feat[:, :, block] @ k_sum.unsqueeze(-1) + eps  # [B, H, block, 1]
        outs.append(numerator / denominator)
    out = torch.cat(outs, dim=2).to(q.dtype)
    return out, LinearAttentionState(kv=kv, k_sum=k_sum)
