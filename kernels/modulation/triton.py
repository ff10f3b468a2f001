"""adaLN modulation and gated residual in Triton: one pass over the row, fp32 maths.

Tensors are viewed as ``[B, N, C]``. ``scale``, ``shift`` and ``gate`` are read through broadcast strides.
So ``[B, 1, C]`` per-sample and ``[B, N, C]`` per-token modulation cost the same. Norm kernels hold a
whole row of ``C`` channels per program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _normalize(x, mask, C, eps, RMS: tl.constexpr):
    """Returns ``x_hat, rstd`` for one row. Masked columns are zero."""
    if RMS:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
        x_hat = x * rstd
    else:
        mean = tl.sum(x, axis=0) / C
        centred = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / C + eps)
        x_hat = centred * rstd
    return x_hat, rstd


@triton.jit
def _row_block(N, C, BC: tl.constexpr):
    """This program's row of the ``[B, N, C]`` view and its block of ``BC`` columns.

    The row comes as its flat index, ``b`` and ``n``. The block is number ``program_id(1)``. The norm kernels
    run one block per row. The columns' in-range mask comes last.
    """
    row = tl.program_id(0)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    return row, row // N, row % N, cols, cols < C


@triton.jit
def _load_row(ptr, s_b, s_n, s_c, b, n, cols, mask):
    """fp32 values at ``cols`` of row ``b, n`` of a ``[B, N, C]`` view.

    Its strides are ``s_b, s_n, s_c``. Zero strides broadcast. Values are zero where masked.
    """
    return tl.load(ptr + b * s_b + n * s_n + cols * s_c, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _norm_modulate_kernel(
    x_ptr, s_xb, s_xn, s_xc,
    scale_ptr, s_sb, s_sn, s_sc,
    shift_ptr, s_tb, s_tn, s_tc,
    w_ptr, y_ptr,
    N, C, eps,
    BC: tl.constexpr, RMS: tl.constexpr, HAS_W: tl.constexpr,
):
    row, b, n, cols, mask = _row_block(N, C, BC)
    x = _load_row(x_ptr, s_xb, s_xn, s_xc, b, n, cols, mask)
    scale = _load_row(scale_ptr, s_sb, s_sn, s_sc, b, n, cols, mask)
    shift = _load_row(shift_ptr, s_tb, s_tn, s_tc, b, n, cols, mask)
    normed, _ = _normalize(x, mask, C, eps, RMS)
    if HAS_W:
        normed *= tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = normed * (1.0 + scale) + shift
    tl.store(y_ptr + row * C + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_modulate_backward_kernel(
    dy_ptr, s_gb, s_gn, s_gc,
    x_ptr, s_xb, s_xn, s_xc,
    scale_ptr, s_sb, s_sn, s_sc,
    w_ptr, dx_ptr, dscale_ptr, dw_ptr,
    N, C, eps,
    BC: tl.constexpr, RMS: tl.constexpr, HAS_W: tl.constexpr,
):
    row, b, n, cols, mask = _row_block(N, C, BC)
    dy = _load_row(dy_ptr, s_gb, s_gn, s_gc, b, n, cols, mask)
    x = _load_row(x_ptr, s_xb, s_xn, s_xc, b, n, cols, mask)
    scale = _load_row(scale_ptr, s_sb, s_sn, s_sc, b, n, cols, mask)
    x_hat, rstd = _normalize(x, mask, C, eps, RMS)
    d_normed = dy * (1.0 + scale)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dw_ptr + row * C + cols, d_normed * x_hat, mask=mask)  # per-row terms of d weight
        tl.store(dscale_ptr + row * C + cols, dy * x_hat * w, mask=mask)  # per-row terms of d scale
        d_hat = d_normed * w
    else:
        tl.store(dscale_ptr + row * C + cols, dy * x_hat, mask=mask)
        d_hat = d_normed
    proj = tl.sum(d_hat * x_hat, axis=0) / C
    if RMS:
        dx = rstd * (d_hat - x_hat * proj)
    else:
        dx = rstd * (d_hat - tl.sum(d_hat, axis=0) / C - x_hat * proj)
    tl.store(dx_ptr + row * C + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gate_residual_kernel(
    x_ptr, s_xb, s_xn, s_xc,
    y_ptr, s_yb, s_yn, s_yc,
    g_ptr, s_gb, s_gn, s_gc,
    o_ptr, N, C,
    BC: tl.constexpr,
):
    row, b, n, cols, mask = _row_block(N, C, BC)
    x = _load_row(x_ptr, s_xb, s_xn, s_xc, b, n, cols, mask)
    y = _load_row(y_ptr, s_yb, s_yn, s_yc, b, n, cols, mask)
    g = _load_row(g_ptr, s_gb, s_gn, s_gc, b, n, cols, mask)
    tl.store(o_ptr + row * C + cols, (x + g * y).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gate_residual_backward_kernel(
    do_ptr, s_ob, s_on, s_oc,
    y_ptr, s_yb, s_yn, s_yc,
    g_ptr, s_gb, s_gn, s_gc,
    dy_ptr, dg_ptr, N, C,
    BC: tl.constexpr,
):
    row, b, n, cols, mask = _row_block(N, C, BC)
    do = _load_row(do_ptr, s_ob, s_on, s_oc, b, n, cols, mask)
    y = _load_row(y_ptr, s_yb, s_yn, s_yc, b, n, cols, mask)
    g = _load_row(g_ptr, s_gb, s_gn, s_gc, b, n, cols, mask)
    tl.store(dy_ptr + row * C + cols, (do * g).to(dy_ptr.dtype.element_ty), mask=mask)
    tl.store(dg_ptr + row * C + cols, do * y, mask=mask)  # per-element terms of d gate (fp32)


def _row_config(C: int) -> dict:
    BC = max(16, triton.next_power_of_2(C))
    return dict(BC=BC, num_warps=min(16, max(1, BC // 256)))


def norm_modulate(x, scale, shift, weight, rms: bool, eps: float) -> torch.Tensor:
    """``x [B, N, C]``; scale, shift expanded to it; weight ``[C]`` or None. Returns ``[B, N, C]``."""
    B, N, C = x.shape
    y = torch.empty(B, N, C, device=x.device, dtype=x.dtype)
    _norm_modulate_kernel[(B * N,)](
        x, *x.stride(), scale, *scale.stride(), shift, *shift.stride(),
        x if weight is None else weight, y, N, C, eps,
        RMS=rms, HAS_W=weight is not None, **_row_config(C),
    )
    return y


def norm_modulate_backward(dy, x, scale, weight, rms: bool, eps: float):
    """Returns ``dx [B, N, C]`` and fp32 per-element terms of d scale and d weight. The caller sums them."""
    B, N, C = x.shape
    dx = torch.empty(B, N, C, device=x.device, dtype=x.dtype)
    d_scale = torch.empty(B, N, C, device=x.device, dtype=torch.float32)
    d_weight = torch.empty(B, N, C, device=x.device, dtype=torch.float32) if weight is not None else d_scale
    _norm_modulate_backward_kernel[(B * N,)](
        dy, *dy.stride(), x, *x.stride(), scale, *scale.stride(),
        x if weight is None else weight, dx, d_scale, d_weight, N, C, eps,
        RMS=rms, HAS_W=weight is not None, **_row_config(C),
    )
    return dx, d_scale, d_weight


_ELEMENTWISE_BC = 1024


def _elementwise_block(C: int) -> int:
    """Columns per program of the gated-residual kernels: the row, up to 1024. A power of two >= 16."""
    return min(_ELEMENTWISE_BC, max(16, triton.next_power_of_2(C)))


def gate_residual(x, y, gate) -> torch.Tensor:
    B, N, C = x.shape
    out = torch.empty(B, N, C, device=x.device, dtype=x.dtype)
    BC = _elementwise_block(C)
    _gate_residual_kernel[(B * N, triton.cdiv(C, BC))](
        x, *x.stride(), y, *y.stride(), gate, *gate.stride(), out, N, C, BC=BC,
    )
    return out


def gate_residual_backward(d_out, y, gate):
    """Returns ``dy [B, N, C]`` in y's dtype and fp32 per-element terms of d gate. The caller sums them."""
    B, N, C = y.shape
    dy = torch.empty(B, N, C, device=y.device, dtype=y.dtype)
    d_gate = torch.empty(B, N, C, device=y.device, dtype=torch.float32)
    BC = _elementwise_block(C)
    _gate_residual_backward_kernel[(B * N, triton.cdiv(C, BC))](
        d_out, *d_out.stride(), y, *y.stride(), gate, *gate.stride(), dy, d_gate, N, C, BC=BC,
    )
    return dy, d_gate
