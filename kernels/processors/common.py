"""diffusers' attention-processor call, once, for every processor in this package.

On each ``Attention`` module diffusers calls
``processor(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)``. The class
:class:`AttnProcessor` is that call. It checks the inputs with :meth:`check_call`. It splits the projections
into heads with :meth:`heads`. It lets the subclass attend with :meth:`attend`. It applies the module's output
projection. The function :func:`wan_heads` holds the stock Wan processor's projections, RMS norms and rotary
embedding.
"""
from __future__ import annotations

import torch

from ..rope.reference import apply_rope


class AttnProcessor:
    """Base of the attention processors.

    Subclasses implement :meth:`attend`. They may override the rest.
    """

    cast_to_input_dtype = False  # True: the output in hidden_states' dtype, as Sana; else the queries', as Wan

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attend over ``hidden_states [B, N, C]``. Returns ``[B, N, C]``.

        ``rotary_emb`` is diffusers' ``(cos, sin)``, each ``[1, N, 1, D]``.
        """
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
        """Queries, keys, values ``[B, H, N, D]``. The default is :func:`wan_heads`."""
        return wan_heads(attn, hidden_states, rotary_emb)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               rotary_emb: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Attention of ``q, k, v [B, H, N, D]`` -> ``[B, H, N, Dv]``."""
        raise NotImplementedError


def wan_heads(attn, hidden_states: torch.Tensor,
              rotary_emb: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, ...]:
    """The stock ``WanAttnProcessor``'s self-attention inputs.

    These are the projections, fused or not, and RMS norms of q and k. Then come the heads and the rotary
    embedding. It rotates interleaved pairs, the same maths as diffusers' ``apply_rotary_emb``.

    Takes ``hidden_states [B, N, C]``. Returns q, k, v ``[B, H, N, D]``.
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
