"""diffusers' attention-processor call, once, for every processor in this package.

diffusers calls ``processor(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)`` on
each ``Attention`` module. :class:`AttnProcessor` is that call: it checks the inputs (:meth:`check_call`),
splits the projections into heads (:meth:`heads`), lets the subclass attend (:meth:`attend`) and applies
the module's output projection. :func:`wan_heads` is the stock Wan processor's projections, RMS norms and
rotary embedding.
"""
from __future__ import annotations

import torch

from ..rope.reference import apply_rope


class AttnProcessor:
    """Base of the attention processors (subclasses implement :meth:`attend`, and may override the rest)."""

    cast_to_input_dtype = False  # the output in hidden_states' dtype (Sana), else in the queries' (Wan)

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """hidden_states ``[B, N, C]``; rotary_emb: diffusers' ``(cos, sin)``, each ``[1, N, 1, D]``.
        Returns ``[B, N, C]``."""
        self.check_call(hidden_states, encoder_hidden_states, attention_mask)
        q, k, v = self.heads(attn, hidden_states, encoder_hidden_states, rotary_emb)  # [B, H, N, D]
        out = self.attend(q, k, v, rotary_emb)  # [B, H, N, Dv]
        dtype = hidden_states.dtype if self.cast_to_input_dtype else q.dtype
        hidden_states = out.transpose(1, 2).flatten(2).to(dtype)  # [B, N, H*Dv]
        return attn.to_out[1](attn.to_out[0](hidden_states))

    def check_call(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None,
                   attention_mask: torch.Tensor | None) -> None:
        """Default: a self-attention processor, which takes neither encoder states nor a mask."""
        if encoder_hidden_states is not None or attention_mask is not None:
            raise ValueError(
                f"{type(self).__name__}: got encoder_hidden_states (cross-attention) or attention_mask; it "
                "replaces the self-attention attn1 (frames are masked by its own causal structure) — keep the "
                "stock processor on attn2"
            )

    def heads(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None,
              rotary_emb: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, ...]:
        """Queries, keys, values ``[B, H, N, D]``; default: :func:`wan_heads`."""
        return wan_heads(attn, hidden_states, rotary_emb)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               rotary_emb: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Attention of ``q, k, v [B, H, N, D]`` -> ``[B, H, N, Dv]``."""
        raise NotImplementedError


def wan_heads(attn, hidden_states: torch.Tensor,
              rotary_emb: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, ...]:
    """The stock ``WanAttnProcessor``'s self-attention inputs: projections (fused or not), RMS norms of q and
    k, heads, rotary embedding (interleaved pairs, the same maths as diffusers' ``apply_rotary_emb``).

    ``hidden_states [B, N, C]``; returns q, k, v ``[B, H, N, D]``.
    """
    if getattr(attn, "fused_projections", False):
        query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
    else:
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    query, key = attn.norm_q(query), attn.norm_k(key)
    query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))  # [B, N, H, D]
    if rotary_emb is not None:
        query, key = apply_rope(query, *rotary_emb), apply_rope(key, *rotary_emb)
    return tuple(t.transpose(1, 2) for t in (query, key, value))
