"""One transformer block of :class:`~.model.AvatarDiT` and its block-causal self-attention.

A block runs in one of two modes:

- **self** (:meth:`DiTBlock.forward_self`): the tokens attend block-causally to themselves. An optional streamed past,
  a :class:`LayerStreamState`, comes first. It serves a streamed chunk: noisy while denoising, clean when appending
  it. It also serves the clean pass of teacher forcing. It serves a whole noisy sequence too: diffusion forcing and
  the Monarch teacher.
- **clean past** (:meth:`DiTBlock.forward_context`): teacher forcing. Noisy tokens of block ``b`` see their own block.
  They also see the *clean* sequence's blocks ``< b``, as streaming does once those blocks were appended clean.
  Attention takes per-block prefix states of the clean pass. The batch is folded with the blocks, in one kernel call.
  The FFN's temporal conv reads clean features for earlier blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from framegraph.kernels.block_linear_attention import LinearAttentionState, block_linear_attention
from framegraph.kernels.modulation import gate_residual, norm_modulate
from framegraph.kernels.monarch_attention import monarch_attention
from framegraph.kernels.rope import apply_rope

from .layers import CrossAttention, GatedConvFFN
from .state import LayerStreamState

ATTENTIONS = ("linear", "monarch")


@dataclass
class Geometry:
    """Sizes of one call.

    ``batch`` is the batch size. ``frames`` counts latent frames.
    ``height x width`` is the token grid per frame, after patching.
    ``frames_per_block`` is the attention block.
    ``rope = (cos, sin)`` holds the rotary tables at absolute stream positions.
    Each is ``float32 [frames * height * width, head_dim]``, or ``[batch, ...]`` of that.
    The second is a table per row, for rows of streams at different positions: a batch of sessions.
    """

    batch: int
    frames: int
    height: int
    width: int
    frames_per_block: int
    rope: tuple[torch.Tensor, torch.Tensor]

    @property
    def tokens_per_frame(self) -> int:
        return self.height * self.width

    @property
    def block_tokens(self) -> int:
        return self.frames_per_block * self.tokens_per_frame

    def rope_heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables broadcastable to ``[B, H, N, head_dim]``: ``[1, 1, N, d]`` or ``[B, 1, N, d]`` per row."""
        return tuple(t[None, None] if t.dim() == 2 else t[:, None] for t in self.rope)


@dataclass
class CleanContext:
    """What the noisy pass of teacher forcing needs from the clean pass at one layer.

    prefix: attention state before each block, ``kv [B * nb, H, d, d]``, ``k_sum [B * nb, H, d]``.
    ffn: the clean FFN features before the temporal conv, ``[B, T, n, D]``.
    """

    prefix: LinearAttentionState
    ffn: torch.Tensor


class BlockCausalSelfAttention(nn.Module):
    """Multi-head self-attention, linear or Monarch.

    ``attention="linear"`` is ReLU linear attention, the streaming one.
    ``"monarch"`` is Monarch-approximated softmax attention. It is frame-causal and takes whole sequences only.

    q/k get RMSNorm with ``qk_norm``. RoPE over (t, y, x) goes to the linear-attention kernel.
    That kernel rotates the ReLU features of the numerator only, as Sana-Video does.
    For Monarch, RoPE rotates q and k.

    ``decay`` is for linear attention only.
    The streamed sums are multiplied by ``decay`` after every block.
    So a block sees block ``b - j`` with weight ``decay^j``.
    ``1`` is Sana-Video's plain sum. There the current chunk's share of the context shrinks as ``1 / frames`` over a
    long stream.
    ``< 1`` bounds the effective context to about ``1 / (1 - decay)`` blocks.
    Training clips longer than that then see the same attention statistics as a 10-minute stream.
    """

    def __init__(self, dim: int, heads: int, qk_norm: bool = True, attention: str = "linear", backend: str = "auto",
                 decay: float = 1.0):
        super().__init__()
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"BlockCausalSelfAttention: decay={decay}; expected 0 < decay <= 1")
        self.decay = float(decay)
        if dim % heads:
            raise ValueError(f"BlockCausalSelfAttention: width={dim} is not divisible by heads={heads}")
        if attention not in ATTENTIONS:
            raise ValueError(f"BlockCausalSelfAttention: attention={attention!r}; expected one of {ATTENTIONS}")
        self.heads, self.attention, self.backend = heads, attention, backend
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.norm_q = nn.RMSNorm(dim, eps=1e-6) if qk_norm else nn.Identity()
        self.norm_k = nn.RMSNorm(dim, eps=1e-6) if qk_norm else nn.Identity()
        self.to_out = nn.Linear(dim, dim)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, N, D]`` → q, k, v ``[B, H, N, d]``."""
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k = self.norm_q(q), self.norm_k(k)
        return tuple(t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))

    def _out(self, out: torch.Tensor, dtype) -> torch.Tensor:
        return self.to_out(out.transpose(1, 2).flatten(2).to(dtype))

    def forward(self, x: torch.Tensor, geo: Geometry, state: LinearAttentionState | None = None,
                want_prefix: bool = False):
        """Self mode. ``x [B, N, D]``. ``state`` is the streamed past; None means empty.

        Returns ``(out [B, N, D], state after the last block or None, prefix states or None)``.
        With ``decay < 1`` the returned state is already decayed for the next block.
        """
        q, k, v = self._qkv(x)
        cos, sin = geo.rope
        if self.attention == "monarch":
            if state is not None or want_prefix:
                raise ValueError("attention='monarch' has no constant-memory state: it runs on whole sequences "
                                 "only (no streaming, no teacher forcing); use attention='linear'")
            q, k = apply_rope(q, cos, sin, backend=self.backend), apply_rope(k, cos, sin, backend=self.backend)
            out = monarch_attention(q, k, v, grid=(geo.frames, geo.height, geo.width), block_causal=True,
                                    backend=self.backend)
            return self._out(out, x.dtype), None, None
        if self.decay == 1.0:  # plain sums (Sana-Video): one kernel call carries the state across blocks
            out, new_state = block_linear_attention(q, k, v, block_size=geo.block_tokens,
                                                    rope=geo.rope_heads(), state=state,
                                                    backend=self.backend)
            prefix = self._prefix_states(k, v, geo, state)[0] if want_prefix else None
            return self._out(out, x.dtype), new_state, prefix
        prefix, new_state = self._prefix_states(k, v, geo, state)  # decayed: every block from its own prefix
        return self._attend_after(q, k, v, geo, prefix, x.dtype), new_state, (prefix if want_prefix else None)

    def forward_context(self, x: torch.Tensor, geo: Geometry, prefix: LinearAttentionState) -> torch.Tensor:
        """Clean-past mode: block ``b`` of ``x [B, N, D]`` attends to itself after ``prefix`` state ``b``."""
        q, k, v = self._qkv(x)
        return self._attend_after(q, k, v, geo, prefix, x.dtype)

    def _attend_after(self, q, k, v, geo: Geometry, prefix: LinearAttentionState, dtype) -> torch.Tensor:
        """Each block of ``q, k, v [B, H, N, d]`` attends to itself after its own prefix state ``[B * nb, ...]``.

        The blocks are folded into the batch, in one kernel call.
        """
        B, H, N, d = q.shape
        nb, bs = N // geo.block_tokens, geo.block_tokens

        def fold(t):  # [B, H, N, d] -> [B * nb, H, bs, d]
            return t.reshape(B, H, nb, bs, t.shape[-1]).transpose(1, 2).reshape(B * nb, H, bs, t.shape[-1])

        rope = tuple(t.reshape(-1, nb, 1, bs, d).expand(B, nb, 1, bs, d).reshape(B * nb, 1, bs, d) for t in geo.rope)
        out, _ = block_linear_attention(fold(q), fold(k), fold(v), block_size=bs, rope=rope, state=prefix,
                                        backend=self.backend)
        out = out.reshape(B, nb, H, bs, -1).transpose(1, 2).reshape(B, H, N, -1)
        return self._out(out, dtype)

    def _prefix_states(self, k: torch.Tensor, v: torch.Tensor, geo: Geometry, state: LinearAttentionState | None):
        """Per-block prefix states: the kernel's sums written out, by the same formula as its reference::

            own_j = (sum over block j of v rot(relu(k))^T,  sum over block j of relu(k))
            E_0 = state (or 0),   E_{b+1} = decay * (E_b + own_b)

        Input is ``k, v [B, H, N, d]``. All outputs are fp32.
        ``E_0..E_{nb-1}`` come folded as ``kv [B * nb, H, d, d]`` and ``k_sum [B * nb, H, d]``.
        ``E_nb`` comes as ``[B, H, ...]``. With ``decay = 1`` these are plain exclusive prefix sums.
        """
        B, H, N, d = k.shape
        nb, bs = N // geo.block_tokens, geo.block_tokens
        k_feat = F.relu(k.float())
        k_rot = apply_rope(k_feat, *geo.rope_heads(), backend="torch")
        own_kv = torch.einsum("bhnsv,bhnsd->bhnvd", v.float().reshape(B, H, nb, bs, -1), k_rot.reshape(B, H, nb, bs, d))
        own_ks = k_feat.reshape(B, H, nb, bs, d).sum(dim=3)  # [B, H, nb, d]
        if self.decay == 1.0:
            kv = torch.cat([torch.zeros_like(own_kv[:, :, :1]), own_kv.cumsum(dim=2)], dim=2)  # [B, H, nb + 1, dv, d]
            ks = torch.cat([torch.zeros_like(own_ks[:, :, :1]), own_ks.cumsum(dim=2)], dim=2)
            carry = torch.ones(nb + 1, device=k.device)
        else:  # E_b = sum_{j < b} decay^(b - j) own_j + decay^b E_0
            b = torch.arange(nb + 1, device=k.device, dtype=torch.float64)
            j = torch.arange(nb, device=k.device, dtype=torch.float64)
            weights = torch.where(j[None] < b[:, None], self.decay ** (b[:, None] - j[None]), 0.0).float()
            kv = torch.einsum("cj,bhjvd->bhcvd", weights, own_kv)
            ks = torch.einsum("cj,bhjd->bhcd", weights, own_ks)
            carry = (self.decay ** b).float()
        if state is not None:
            kv = kv + carry[:, None, None] * state.kv[:, :, None]
            ks = ks + carry[:, None] * state.k_sum[:, :, None]
        prefix = LinearAttentionState(kv=kv[:, :, :nb].transpose(1, 2).reshape(B * nb, H, *kv.shape[-2:]),
                                      k_sum=ks[:, :, :nb].transpose(1, 2).reshape(B * nb, H, d))
        return prefix, LinearAttentionState(kv=kv[:, :, nb], k_sum=ks[:, :, nb])


class DiTBlock(nn.Module):
    """adaLN-modulated block with three parts. Modulation is per latent frame.

    The parts are block-causal self-attention, then cross-attention to the identity and the audio window.
    Last comes the gated conv FFN with a causal temporal conv.

    Per-frame conditioning is ``mod [B, T, 6, D]``, a shared adaLN-single projection.
    This block's learned table is added to it.
    That gives shift / scale / gate for the attention and the FFN; see ``norm_modulate`` and ``gate_residual``.
    """

    def __init__(self, dim: int, heads: int, hidden: int, temporal_kernel: int = 3, qk_norm: bool = True,
                 attention: str = "linear", backend: str = "auto", decay: float = 1.0):
        super().__init__()
        self.backend = backend
        self.modulation = nn.Parameter(torch.randn(6, dim) / dim**0.5)
        self.attn = BlockCausalSelfAttention(dim, heads, qk_norm, attention, backend, decay)
        self.norm_cross = nn.LayerNorm(dim, eps=1e-6)
        self.cross = CrossAttention(dim, heads, qk_norm)
        self.ffn = GatedConvFFN(dim, hidden, temporal_kernel)

    def _mods(self, mod: torch.Tensor) -> list[torch.Tensor]:
        """``[B, T, 6, D]`` → six ``[B * T, 1, D]``: shift/scale/gate for attention, then for the FFN."""
        m = (mod + self.modulation.to(mod.dtype)).flatten(0, 1)  # [B*T, 6, D]
        return [m[:, i: i + 1] for i in range(6)]

    def _attend(self, x, mods, geo, ref_kv, audio_tokens, attention):
        """The shared part up to the FFN's temporal conv.

        ``x [B, T*n, D]`` → ``(h [B*T, n, D], y [B, T, n, D], extra)``.
        """
        B, T, n = geo.batch, geo.frames, geo.tokens_per_frame
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = mods
        h = x.reshape(B * T, n, -1)
        a = norm_modulate(h, scale_a, shift_a, backend=self.backend)
        out, extra = attention(a.reshape(B, T * n, -1))
        h = gate_residual(h, out.reshape(B * T, n, -1), gate_a, backend=self.backend)
        h = h + self.cross(self.norm_cross(h), ref_kv, audio_tokens, T)
        m = norm_modulate(h, scale_f, shift_f, backend=self.backend)
        y = self.ffn.spatial(m.reshape(B, T, n, -1), geo.height, geo.width)
        return h, y, extra

    def forward_self(self, x: torch.Tensor, mod: torch.Tensor, geo: Geometry, ref_kv, audio_tokens: torch.Tensor,
                     state: LayerStreamState | None = None, want_context: bool = False):
        """Self mode. ``x [B, T*n, D]``; ``audio_tokens [B*T, W, D]``. ``ref_kv`` holds identity keys/values or None.

        Returns ``(x_out [B, T*n, D], (attention state, FFN cache) after these frames, CleanContext or None)``.
        """
        mods = self._mods(mod)
        attn_state = state.attn if state is not None else None

        def attention(a):
            out, new_state, prefix = self.attn(a, geo, attn_state, want_prefix=want_context)
            return out, (new_state, prefix)

        h, y, (new_state, prefix) = self._attend(x, mods, geo, ref_kv, audio_tokens, attention)
        y_t, cache = self.ffn.temporal(y, state.ffn_cache if state is not None else None)
        h = gate_residual(h, y_t.reshape(-1, *h.shape[1:]), mods[5], backend=self.backend)  # -1: a traced batch
        context = CleanContext(prefix=prefix, ffn=y) if want_context else None
        return h.reshape(-1, *x.shape[1:]), (new_state, cache), context

    def forward_context(self, x: torch.Tensor, mod: torch.Tensor, geo: Geometry, ref_kv, audio_tokens: torch.Tensor,
                        context: CleanContext) -> torch.Tensor:
        """Clean-past mode for teacher forcing; shapes as :meth:`forward_self`. Returns ``x_out [B, T*n, D]``."""
        mods = self._mods(mod)

        def attention(a):
            return self.attn.forward_context(a, geo, context.prefix), None

        h, y, _ = self._attend(x, mods, geo, ref_kv, audio_tokens, attention)
        y_t = self.ffn.temporal_with_clean_past(y, context.ffn, geo.frames_per_block)
        h = gate_residual(h, y_t.reshape(h.shape), mods[5], backend=self.backend)
        return h.reshape(x.shape)
