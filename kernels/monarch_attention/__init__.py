"""Monarch attention: softmax attention fitted by a Monarch matrix, after MonarchAttention and MonarchRT.

``monarch_attention(q, k, v, grid=(F, Hh, Ww))`` is the public entry point. ``reference.py`` is the readable
pure-torch version. It writes out the maths, the grid mapping and the causal mask. ``triton.py`` holds the
fused forward kernels. ``triton_backward.py`` holds the backward kernels. They give the gradients of q, k, v
through every alternating update. They recompute the factors from the forward's log-sum-exps. Its docstring
has the maths. The Triton path is the custom op ``torch.ops.framegraph.monarch_attention``. Its backward is
``torch.ops.framegraph.monarch_attention_backward``. Both have fake implementations. So the path survives
``torch.compile`` and CUDA-graph capture.
"""
from __future__ import annotations

import torch

from ..backend import Backend, check_float_dtype, check_rank, check_same_device, resolve_backend
from . import reference
from .reference import MonarchFactors, monarch_factors, monarch_matrix, softmax_attention

__all__ = ["monarch_attention", "monarch_factors", "monarch_matrix", "softmax_attention", "MonarchFactors"]

OP = "monarch_attention"


def monarch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    grid: tuple[int, int, int],
    num_iters: int = 1,
    block_causal: bool = False,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Self-attention over a video token grid, approximated by a fitted Monarch matrix. Never N x N.

    Tokens are in row-major frame, y, x order. That is diffusers' patchified order. Each frame row of ``Ww``
    tokens is one Monarch block. One factor mixes the columns inside each key row. Its weights depend on the
    query's column. The other factor mixes the ``F * Hh`` rows, per query. Both factors are the closed-form
    alternating updates of MonarchAttention. They start from block-diagonal attention. A softmax matrix that is
    itself Monarch-structured is reproduced exactly. The cost is ``O(B H N (F Hh + Ww) D)`` time and
    ``O(B H N D)`` extra memory. ``reference.py`` has the maths.

    Args:
        q: ``[B, H, N, D]`` queries in float32, float16 or bfloat16, with ``N = F * Hh * Ww``.
        k: ``[B, H, N, D]`` keys, of q's shape and dtype. This is self-attention over the grid.
        v: ``[B, H, N, Dv]`` values.
        grid: ``(F, Hh, Ww)``: latent frames, rows and columns after patching.
        num_iters: alternating updates of row factor and column factor, >= 1. Typical values are 1 to 3.
        block_causal: a query sees only keys of its own and earlier frames, as autoregressive video needs.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. ``"auto"`` is Triton on CUDA, torch elsewhere.
            ``"triton"`` needs head dims <= 128.

    Returns:
        ``out [B, H, N, Dv]`` in q's dtype, accumulated in fp32. Scores are scaled by ``1 / sqrt(D)``. It
        is differentiable in q, k, v on both backends. Triton's backward kernels recompute the factors from
        the forward's log-sum-exps, with ``O(B H N D)`` extra memory. The torch backend uses plain autograd.
    """
    grid = _check_args(q, k, v, grid, num_iters, block_causal)
    if resolve_backend(backend, q, k, v, op=OP) == "torch":
        return reference.monarch_attention(q, k, v, grid, num_iters, block_causal)
    out, _lse_l, _a_r, _c_r = torch.ops.framegraph.monarch_attention(q, k, v, *grid, num_iters, block_causal)
    return out


def _check_args(q, k, v, grid, num_iters, block_causal) -> tuple[int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(OP, name, t, 4, "[B, H, N, D]")
        check_float_dtype(OP, name, t)
    check_same_device(OP, q=q, k=k, v=v)
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != q.shape[0]:
            raise ValueError(f"{OP}: {name} has batch {t.shape[0]} (shape {tuple(t.shape)}); q has batch {q.shape[0]}")
        if t.shape[1] != q.shape[1]:
            raise ValueError(
                f"{OP}: {name} has {t.shape[1]} heads (shape {tuple(t.shape)}); q has {q.shape[1]} heads "
                "(expand grouped key/value heads before calling)"
            )
        if t.shape[2] != q.shape[2]:
            raise ValueError(
                f"{OP}: {name} has N={t.shape[2]} tokens (shape {tuple(t.shape)}); q has N={q.shape[2]} "
                "(Monarch attention is self-attention over one grid)"
            )
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"{OP}: k has head dim {k.shape[3]}; q has {q.shape[3]}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{OP}: dtypes q={q.dtype}, k={k.dtype}, v={v.dtype}; expected one dtype")
    if (
        not isinstance(grid, (tuple, list))
        or len(grid) != 3
        or any(isinstance(g, bool) or not isinstance(g, int) or g <= 0 for g in grid)
    ):
        raise ValueError(f"{OP}: grid={grid!r}; expected (frames, height, width), three positive ints")
    frames, height, width = grid
    N = q.shape[2]
    if frames * height * width != N:
        raise ValueError(
            f"{OP}: grid={tuple(grid)} has {frames * height * width} tokens; q has N={N} "
            "(grid must be (frames, height, width) after patching, with frames * height * width == N)"
        )
    if isinstance(num_iters, bool) or not isinstance(num_iters, int) or num_iters < 1:
        raise ValueError(f"{OP}: num_iters={num_iters!r}; expected an int >= 1")
    if not isinstance(block_causal, bool):
        raise TypeError(f"{OP}: block_causal={block_causal!r}; expected a bool")
    return (frames, height, width)


# ----------------------------------------------------------------------------- custom op: the Triton path


@torch.library.custom_op("framegraph::monarch_attention", mutates_args=())
def _forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    frames: int, height: int, width: int, num_iters: int, block_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``out [B, H, N, Dv]`` and the fp32 statistics the backward needs, as in ``triton.forward``.

    They are ``lse_L [T, B, H, Ww, F*Hh]``, ``a_R [T-1, B, H, N, D]`` and ``c_R [T-1, B, H, N]``.
    """
    from . import triton as kernels

    return kernels.forward(q, k, v, (frames, height, width), num_iters, block_causal)


@_forward_op.register_fake
def _(q, k, v, frames, height, width, num_iters, block_causal):
    B, H, N, D = q.shape
    f32 = torch.float32
    return (
        q.new_empty(B, H, N, v.shape[-1]),
        q.new_empty(num_iters, B, H, width, frames * height, dtype=f32),
        q.new_empty(num_iters - 1, B, H, N, D, dtype=f32),
        q.new_empty(num_iters - 1, B, H, N, dtype=f32),
    )


@torch.library.custom_op("framegraph::monarch_attention_backward", mutates_args=())
def _backward_op(
    d_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    lse_l: torch.Tensor, a_r: torch.Tensor, c_r: torch.Tensor,
    frames: int, height: int, width: int, num_iters: int, block_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from . import triton_backward as kernels

    return kernels.backward(d_out, q, k, v, lse_l, a_r, c_r, (frames, height, width), num_iters, block_causal)


@_backward_op.register_fake
def _(d_out, q, k, v, lse_l, a_r, c_r, frames, height, width, num_iters, block_causal):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous, as the kernels return


def _setup_context(ctx, inputs, output):
    q, k, v, *config = inputs
    _, lse_l, a_r, c_r = output
    ctx.save_for_backward(q, k, v, lse_l, a_r, c_r)
    ctx.mark_non_differentiable(lse_l, a_r, c_r)
    ctx.config = config


def _backward(ctx, d_out, _d_lse_l, _d_a_r, _d_c_r):
    q, k, v, lse_l, a_r, c_r = ctx.saved_tensors
    if d_out is None:
        d_out = q.new_zeros(*q.shape[:3], v.shape[-1])
    dq, dk, dv = _backward_op(d_out, q, k, v, lse_l, a_r, c_r, *ctx.config)
    return dq, dk, dv, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)
