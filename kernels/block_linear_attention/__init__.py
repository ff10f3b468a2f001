"""Block-causal ReLU linear attention in Sana's style, with a recurrent state for streaming.

``block_linear_attention(q, k, v, block_size=...)`` is the public entry point. ``reference.py`` is the
readable pure-torch version. ``triton.py`` holds the kernels. The Triton path is registered as the custom op
``torch.ops.framegraph.block_linear_attention``. It has a fake implementation and a backward. So it survives
``torch.compile`` and CUDA-graph capture.
"""
from __future__ import annotations

import torch

from ..backend import Backend, check_broadcastable, check_float_dtype, check_rank, check_same_device, resolve_backend
from . import reference
from .reference import LinearAttentionState, zero_state

__all__ = ["block_linear_attention", "LinearAttentionState", "zero_state"]

OP = "block_linear_attention"


def block_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_size: int,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    state: LinearAttentionState | None = None,
    eps: float = 1e-15,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, LinearAttentionState]:
    """Linear attention, bidirectional inside blocks of ``block_size`` tokens and causal across blocks.

    Feature map ``phi = relu`` on q and k; the output of token ``m`` in block ``b`` is::

        out_m = S_b rot(phi(q_m)) / (z_b . phi(q_m) + eps)
        S_b   = state.kv    + sum over tokens n in blocks <= b of v_n rot(phi(k_n))^T
        z_b   = state.k_sum + sum over tokens n in blocks <= b of phi(k_n)

    RoPE, written ``rot``, touches only the numerator. The denominator uses un-rotated features, exactly as
    diffusers' Sana-Video ``SanaLinearAttnProcessor3_0``. With ``block_size == N`` and no state this is
    that processor's attention. Accumulation is fp32 whatever the input dtype.

    Streaming: pass the returned state back in with the next tokens. A stream processed block by block gives
    the full-sequence result. Its memory does not depend on its length. The state is differentiable.
    Gradients flow into ``state`` when it requires grad. The rope tables get none.

    Args:
        q: ``[B, H, N, D]`` queries in float32, float16 or bfloat16.
        k: ``[B, H, N, D]`` keys, same dtype as q.
        v: ``[B, H, N, Dv]`` values, same dtype as q.
        block_size: tokens per block. It must divide ``N``.
        rope: ``cos, sin``, each broadcastable to ``[B, H, N, D]``, with ``D`` even. They follow the
            interleaved-pair convention of ``framegraph.kernels.rope``. The Sana-Video tables of diffusers fit,
            permuted from ``[1, N, 1, D]`` to ``[1, 1, N, D]``. Positions must be absolute when streaming.
        state: a :class:`LinearAttentionState` of float32 ``kv [B, H, Dv, D]`` and ``k_sum [B, H, D]``.
            It sums up every token before ``q[:, :, 0]``. ``None`` means an empty past.
        eps: added to the denominator.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. ``"auto"`` is Triton on CUDA, torch elsewhere.
            ``"triton"`` needs head dims ``D, Dv <= 128``.

    Returns:
        ``out [B, H, N, Dv]`` in q's dtype, and the :class:`LinearAttentionState` after the last token.
    """
    _check_args(q, k, v, block_size, rope, state)
    cos, sin = rope if rope is not None else (None, None)
    if resolve_backend(backend, q, k, v, op=OP) == "torch":
        return reference.block_linear_attention(q, k, v, block_size, rope=rope, state=state, eps=eps)
    if state is None:
        state = zero_state(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], device=q.device)
    out, kv, k_sum = torch.ops.framegraph.block_linear_attention(
        q, k, v, cos, sin, state.kv, state.k_sum, int(block_size), float(eps)
    )
    return out, LinearAttentionState(kv=kv, k_sum=k_sum)


def _check_args(q, k, v, block_size, rope, state) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(OP, name, t, 4, "[B, H, N, D]")
        check_float_dtype(OP, name, t)
    check_same_device(OP, q=q, k=k, v=v)
    if k.shape != q.shape:
        raise ValueError(f"{OP}: k has shape {tuple(k.shape)}; expected q's shape [B, H, N, D]={tuple(q.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{OP}: v has shape {tuple(v.shape)}; expected [B, H, N, Dv] "
                         f"with B, H, N={tuple(q.shape[:3])}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{OP}: dtypes q={q.dtype}, k={k.dtype}, v={v.dtype}; expected one dtype")
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"{OP}: block_size={block_size!r}; expected a positive int")
    if N % block_size != 0:
        raise ValueError(f"{OP}: block_size={block_size} does not divide the sequence length N={N}")
    if rope is not None:
        if not isinstance(rope, (tuple, list)) or len(rope) != 2:
            raise ValueError(f"{OP}: rope={type(rope).__name__}; expected a (cos, sin) pair of tensors")
        if D % 2:
            raise ValueError(f"{OP}: rope rotates channel pairs, so D must be even; got D={D}")
        for name, t in zip(("cos", "sin"), rope):
            check_broadcastable(OP, f"rope {name}", t, q.shape, "[B, H, N, D]")
            check_same_device(OP, q=q, **{name: t})
    if state is not None:
        kv, k_sum = state
        if tuple(kv.shape) != (B, H, Dv, D) or tuple(k_sum.shape) != (B, H, D):
            raise ValueError(
                f"{OP}: state has kv {tuple(kv.shape)}, k_sum {tuple(k_sum.shape)}; expected "
                f"kv [B, H, Dv, D]={(B, H, Dv, D)} and k_sum [B, H, D]={(B, H, D)}"
            )
        if kv.dtype != torch.float32 or k_sum.dtype != torch.float32:
            raise TypeError(f"{OP}: state dtypes kv={kv.dtype}, k_sum={k_sum.dtype}; expected float32")
        check_same_device(OP, q=q, state_kv=kv, state_k_sum=k_sum)


# ----------------------------------------------------------------------------- custom op: the Triton path


def _rope_table(q: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor | None:
    """``stack((cos, sin))`` in fp32, broadcast to ``[2, B, H, N, D]`` without copying."""
    if cos is None:
        return None
    cos, sin = (t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) for t in (cos, sin))
    table = torch.stack(torch.broadcast_tensors(cos, sin)).to(torch.float32)
    return table.expand(2, *q.shape)


@torch.library.custom_op("framegraph::block_linear_attention", mutates_args=())
def _forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    kv0: torch.Tensor,
    k_sum0: torch.Tensor,
    block_size: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from . import triton as kernels

    return kernels.forward(q, k, v, _rope_table(q, cos, sin), kv0, k_sum0, block_size, eps)


@_forward_op.register_fake
def _(q, k, v, cos, sin, kv0, k_sum0, block_size, eps):
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    return (
        q.new_empty(B, H, N, Dv),
        q.new_empty(B, H, Dv, D, dtype=torch.float32),
        q.new_empty(B, H, D, dtype=torch.float32),
    )


@torch.library.custom_op("framegraph::block_linear_attention_backward", mutates_args=())
def _backward_op(
    d_out: torch.Tensor,
    d_kv: torch.Tensor,
    d_k_sum: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    kv0: torch.Tensor,
    k_sum0: torch.Tensor,
    block_size: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from . import triton as kernels

    return kernels.backward(d_out, d_kv, d_k_sum, q, k, v, _rope_table(q, cos, sin), kv0, k_sum0, block_size, eps)


@_backward_op.register_fake
def _(d_out, d_kv, d_k_sum, q, k, v, cos, sin, kv0, k_sum0, block_size, eps):
    return (
        torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
        torch.empty_like(kv0, dtype=torch.float32), torch.empty_like(k_sum0, dtype=torch.float32),
    )


def _setup_context(ctx, inputs, output):
    q, k, v, cos, sin, kv0, k_sum0, block_size, eps = inputs
    ctx.save_for_backward(q, k, v, cos, sin, kv0, k_sum0)
    ctx.block_size, ctx.eps = block_size, eps


def _backward(ctx, d_out, d_kv, d_k_sum):
    q, k, v, cos, sin, kv0, k_sum0 = ctx.saved_tensors
    d_out = q.new_zeros(*q.shape[:3], v.shape[-1]) if d_out is None else d_out
    d_kv = torch.zeros_like(kv0, dtype=torch.float32) if d_kv is None else d_kv
    d_k_sum = torch.zeros_like(k_sum0, dtype=torch.float32) if d_k_sum is None else d_k_sum
    dq, dk, dv, d_kv0, d_k_sum0 = _backward_op(
        d_out, d_kv, d_k_sum, q, k, v, cos, sin, kv0, k_sum0, ctx.block_size, ctx.eps
    )
    return dq, dk, dv, None, None, d_kv0, d_k_sum0, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)
