"""Monarch attention in Triton, backward: gradients of q, k, v through the alternating updates.

The notation is that of ``reference.py``, per batch and head. There are ``M = F * Hh`` frame rows ``l, k``
and ``b = Ww`` columns ``j, i``. ``scale`` is ``1 / sqrt(D)``. ``T`` is ``num_iters``. Iteration ``t = 1..T``
of the forward is::

    R step   z[k, j, i] = coef[k, j] * a_R[k, j] . k[k, i]      coef = scale / max(c_R, C_MIN) (t=1: a_R=q, c_R=1)
             R[k, j, i] = exp(z - lse_R[k, j])                  softmax over the row's columns i
             a_L[j, k] = sum_i R k[k, i]     c_L[j, k] = sum_i R log R     (t = T)  y[j, k] = sum_i R v[k, i]
    L step   s[j, k, l] = scale * q[l, j] . a_L[j, k] - c_L[j, k]      (causal: -inf unless f(k) <= f(l))
             L[j, k, l] = exp(s - lse_L[j, l])                  softmax over the key rows k
    next R   a_R'[k, j] = sum_l W[l, k] L[j, k, l] q[l, j]      c_R'[k, j] = sum_l W[l, k] L[j, k, l]
             (W = 1, or with block_causal W[l, k] = [f(l) == f(k)]: the R step's own-frame queries)
    output   out[l, j] = sum_k L[j, k, l] y[j, k]               (t = T)

The backward walks ``t = T..1``. Every factor entry it needs is recomputed from small saved statistics. The
forward saves ``lse_L`` of every iteration and ``a_R``, ``c_R`` of iterations 2..T. Re-running iteration
``t``'s R step gives ``lse_R``, ``a_L``, ``c_L`` and ``y``. So neither ``L`` nor ``R`` is ever stored. What
flows into the L softmax of iteration ``t`` always has the form::

    dL[j, k, l] = W[l, k] * (x[l, j] . g[j, k] + h[j, k])
        t = T:  x = dout [.., Dv], g = y,        h = 0,       W = 1      (from out = sum_k L y)
        t < T:  x = q    [.., D],  g = da_R',    h = dc_R',   W as above (from the next R step's sums)

The kernels follow. ``[..]`` is the shape per batch*head, and ``N = M b``.

1. ``_row_step_kernel``: the forward's, with ``lse_R``. It recomputes ``a_L, c_L [b, M, D], [b, M]``,
   ``lse_R`` and ``y [b, M, Dv]`` of iteration ``t``.
2. ``_column_grad_query_kernel``: a program per column j and tile of query rows l. It loops over key rows k.
   This is the "dQ" pass of flash-attention. The softmax shift ``delta`` is computed on the fly::

       u[l, j]     = sum_k W L g[j, k]            (t = T: u = out recomputed; t < T: dq gets u, from a_R')
       delta[l, j] = sum_k L dL = x . u + sum_k W L h
       dS[j, k, l] = L (dL - delta)                                        (softmax backward over k)
       dq[l, j]   += scale * sum_k dS a_L[j, k] = scale * (sum_k L dL a_L - delta * sum_k L a_L)

3. ``_column_grad_key_kernel``: a program per column j and tile of key rows k. It loops over query rows l.
   This is the "dK dV" pass::

       da_L[j, k] = scale * sum_l dS q[l, j]      dc_L[j, k] = -sum_l dS      (t = T) dy[j, k] = sum_l L dout[l, j]

4. ``_row_grad_kernel``: a program per key row k and tile of query columns j. It loops over the row's
   columns i. ``dR = dy . v_i + da_L . k_i + dc_L (log R + 1)``. So the softmax backward over i is::

       dz[k, j, i] = R (dy . v_i + da_L . k_i + dc_L z + rho)
       rho[j, k]   = -(dy . y + da_L . a_L + dc_L (c_L + lse_R))          (stored for kernel 5)
       da_R[k, j]  = coef * sum_i dz k[k, i]      dc_R[k, j] = -sum_i dz z / c_R   (0 where c_R < C_MIN)

   Kernels 2 and 3 of iteration ``t - 1`` read these as ``g``, ``h``. At ``t = 1``, ``a_R = q``, so
   ``dq += da_R``.
5. ``_row_key_grad_kernel``: a program per key row k and tile of columns i. It loops over query columns j.
   It adds::

       dk[k, i] += sum_j R da_L[j, k] + sum_j coef dz a_R[k, j]     (t = T) dv[k, i] = sum_j R dy[j, k]

Work per iteration is two row passes and two column passes on top of the recomputed R step. A row pass is
``O(N b D)``. A column pass is ``O(N M D)``. That is ``Theta(N sqrt(N) D)`` for ``M ~ b ~ sqrt(N)``. Extra
memory is ``O(N D)`` fp32, never ``N x N``. It holds ``a_L``, ``da_L``, ``da_R``, ``y``, ``dy`` and the
``dq``/``dk`` accumulators. The forward keeps ``T N`` floats of ``lse_L`` for the backward. It also keeps
``(T - 1) N (D + 1)`` floats of ``a_R`` and ``c_R``. Each program owns the ``dq`` / ``dk`` rows it adds to.
So there are no atomics, and the result is deterministic. Layouts are as in ``triton.py``. Token-indexed
tensors are ``[B*H, N, ..]`` with ``n = k * b + j``. Column-major per-block statistics are ``[B*H, b, M, ..]``,
indexed ``[j, k]``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import device_capability
from ..tiles import head, load_tile, store_tile
from .triton import (
    C_MIN,
    _frame,
    _frames_end,
    _program_tile,
    _r_scale,
    _row_program,
    check_head_dims,
    row_step,
    tiles,
)


@triton.jit
def _column_grad_program(q_ptr, s_qb, s_qh, x_ptr, s_xb, s_xh, al_ptr, cl_ptr, lse_ptr, g_ptr, h_ptr,
                         H, M, NB, D, G, BLOCK: tl.constexpr):
    """Set-up of a column-gradient program.

    It returns column ``j`` and its tile: the first row, ``BLOCK`` rows and their mask. Then ``bh``. Then the
    pointers moved to this batch, head and column. Token-indexed are q and x. Column-major statistics are
    a_L, c_L, lse_L, g and h. The statistics' column index is ``bh * b + j``.
    """
    col, first, rows, mask, bh = _program_tile(M, BLOCK)
    column = bh * NB + col
    return (col, first, rows, mask, column, head(q_ptr, bh, H, s_qb, s_qh), head(x_ptr, bh, H, s_xb, s_xh),
            al_ptr + column * M * D, cl_ptr + column * M, lse_ptr + column * M, g_ptr + column * M * G,
            h_ptr + column * M)


@triton.jit
def _column_grad_query_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    x_ptr, s_xb, s_xh, s_xn, s_xd,  # query side of dL: dout (OUTPUT_STEP) or q, token-indexed [B, H, N, G]
    al_ptr, cl_ptr, lse_ptr,  # a_L [B*H, b, M, D]; c_L and lse_L [B*H, b, M]
    g_ptr, h_ptr,  # key side of dL: g [B*H, b, M, G] (y or da_R'); h [B*H, b, M] (dc_R', not OUTPUT_STEP)
    delta_ptr,  # output: delta [B*H, b, M] = sum_k L dL
    dq_ptr,  # dq accumulator [B*H, N, D] fp32, token-indexed: added to
    H, M, NB, D, G, ROWS_PER_FRAME,
    SCALE: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BG: tl.constexpr,
    CAUSAL: tl.constexpr, OUTPUT_STEP: tl.constexpr, PRECISION: tl.constexpr,
):
    col, first, ls, l_mask, column, q_ptr, x_ptr, al_ptr, cl_ptr, lse_ptr, g_ptr, h_ptr = _column_grad_program(
        q_ptr, s_qb, s_qh, x_ptr, s_xb, s_xh, al_ptr, cl_ptr, lse_ptr, g_ptr, h_ptr, H, M, NB, D, G, BL,
    )  # column j, tile of query rows l
    delta_ptr += column * M
    dq_ptr += (column // NB) * M * NB * D  # column // b: this (batch, head)

    tokens = ls * NB + col
    qs = load_tile(q_ptr, s_qn, s_qd, tokens, l_mask, D, BD)  # [BL, BD]
    xs = load_tile(x_ptr, s_xn, s_xd, tokens, l_mask, G, BG)  # [BL, BG]
    lse = tl.load(lse_ptr + ls, mask=l_mask, other=0.0)
    k_end = M
    if CAUSAL:  # key rows up to the end of the last query row's frame
        k_end = _frames_end(first + BL, M, ROWS_PER_FRAME)

    u = tl.zeros((BL, BG), dtype=tl.float32)  # sum_k W L g
    w = tl.zeros((BL,), dtype=tl.float32)  # sum_k W L h
    l_dl_a = tl.zeros((BL, BD), dtype=tl.float32)  # sum_k L dL a_L
    l_a = tl.zeros((BL, BD), dtype=tl.float32)  # sum_k L a_L
    for start in range(0, k_end, BK):
        ks = start + tl.arange(0, BK)
        k_mask = ks < k_end
        a_l = load_tile(al_ptr, D, 1, ks, k_mask, D, BD)  # [BK, BD]
        c_l = tl.load(cl_ptr + ks, mask=k_mask, other=0.0)
        g = load_tile(g_ptr, G, 1, ks, k_mask, G, BG)  # [BK, BG]
        s = tl.dot(qs, tl.trans(a_l), input_precision=PRECISION) * SCALE - c_l[None, :]  # [BL, BK]
        ok = l_mask[:, None] & k_mask[None, :]
        if CAUSAL:
            ok = ok & (_frame(ks[None, :], ROWS_PER_FRAME) <= _frame(ls[:, None], ROWS_PER_FRAME))
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)  # L[j, k, l]
        d_l = tl.dot(xs, tl.trans(g), input_precision=PRECISION)  # x . g
        p_w = p
        if not OUTPUT_STEP:
            h_k = tl.load(h_ptr + ks, mask=k_mask, other=0.0)
            d_l += h_k[None, :]
            if CAUSAL:
                same = _frame(ks[None, :], ROWS_PER_FRAME) == _frame(ls[:, None], ROWS_PER_FRAME)
                d_l = tl.where(same, d_l, 0.0)
                p_w = tl.where(same, p, 0.0)
            w += tl.sum(p_w * h_k[None, :], axis=1)
        u += tl.dot(p_w, g, input_precision=PRECISION)
        l_dl_a += tl.dot(p * d_l, a_l, input_precision=PRECISION)
        l_a += tl.dot(p, a_l, input_precision=PRECISION)

    delta = tl.sum(xs * u, axis=1) + w
    dq = SCALE * (l_dl_a - delta[:, None] * l_a)
    if not OUTPUT_STEP:
        dq += u  # a_R' = sum_l W L q: q's own share (G == D here)
    dq += load_tile(dq_ptr, D, 1, tokens, l_mask, D, BD)
    store_tile(dq_ptr, D, 1, tokens, l_mask, D, dq, BD)
    tl.store(delta_ptr + ls, delta, mask=l_mask)


@triton.jit
def _column_grad_key_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    x_ptr, s_xb, s_xh, s_xn, s_xd,  # as in _column_grad_query_kernel
    al_ptr, cl_ptr, lse_ptr, delta_ptr,  # a_L [B*H, b, M, D]; c_L, lse_L, delta [B*H, b, M]
    g_ptr, h_ptr,  # g [B*H, b, M, G]; h [B*H, b, M] (not OUTPUT_STEP)
    dal_ptr, dcl_ptr, dy_ptr,  # outputs: da_L [B*H, b, M, D], dc_L [B*H, b, M], dy [B*H, b, M, G] (OUTPUT_STEP)
    H, M, NB, D, G, ROWS_PER_FRAME,
    SCALE: tl.constexpr, BK: tl.constexpr, BL: tl.constexpr, BD: tl.constexpr, BG: tl.constexpr,
    CAUSAL: tl.constexpr, OUTPUT_STEP: tl.constexpr, PRECISION: tl.constexpr,
):
    col, first, ks, k_mask, column, q_ptr, x_ptr, al_ptr, cl_ptr, lse_ptr, g_ptr, h_ptr = _column_grad_program(
        q_ptr, s_qb, s_qh, x_ptr, s_xb, s_xh, al_ptr, cl_ptr, lse_ptr, g_ptr, h_ptr, H, M, NB, D, G, BK,
    )  # column j, tile of key rows k
    delta_ptr += column * M

    a_l = load_tile(al_ptr, D, 1, ks, k_mask, D, BD)  # [BK, BD]
    c_l = tl.load(cl_ptr + ks, mask=k_mask, other=0.0)
    g = load_tile(g_ptr, G, 1, ks, k_mask, G, BG)  # [BK, BG]
    if not OUTPUT_STEP:
        h_k = tl.load(h_ptr + ks, mask=k_mask, other=0.0)
    l_start = 0
    if CAUSAL:  # queries from the first key row's frame on
        l_start = _frame(first, ROWS_PER_FRAME) * ROWS_PER_FRAME

    da_l = tl.zeros((BK, BD), dtype=tl.float32)
    dc_l = tl.zeros((BK,), dtype=tl.float32)
    dy = tl.zeros((BK, BG), dtype=tl.float32)
    for start in range(l_start, M, BL):
        ls = start + tl.arange(0, BL)
        l_mask = ls < M
        tokens = ls * NB + col
        qs = load_tile(q_ptr, s_qn, s_qd, tokens, l_mask, D, BD)  # [BL, BD]
        xs = load_tile(x_ptr, s_xn, s_xd, tokens, l_mask, G, BG)  # [BL, BG]
        lse = tl.load(lse_ptr + ls, mask=l_mask, other=0.0)
        delta = tl.load(delta_ptr + ls, mask=l_mask, other=0.0)
        s = tl.dot(a_l, tl.trans(qs), input_precision=PRECISION) * SCALE - c_l[:, None]  # [BK, BL]
        ok = k_mask[:, None] & l_mask[None, :]
        if CAUSAL:
            ok = ok & (_frame(ks[:, None], ROWS_PER_FRAME) <= _frame(ls[None, :], ROWS_PER_FRAME))
        p = tl.where(ok, tl.exp(s - lse[None, :]), 0.0)  # L[j, k, l]
        d_l = tl.dot(g, tl.trans(xs), input_precision=PRECISION)
        if not OUTPUT_STEP:
            d_l += h_k[:, None]
            if CAUSAL:
                d_l = tl.where(_frame(ks[:, None], ROWS_PER_FRAME) == _frame(ls[None, :], ROWS_PER_FRAME), d_l, 0.0)
        d_s = p * (d_l - delta[None, :])
        da_l += tl.dot(d_s, qs, input_precision=PRECISION)
        dc_l -= tl.sum(d_s, axis=1)
        if OUTPUT_STEP:
            dy += tl.dot(p, xs, input_precision=PRECISION)

    store_tile(dal_ptr + column * M * D, D, 1, ks, k_mask, D, SCALE * da_l, BD)
    tl.store(dcl_ptr + column * M + ks, dc_l, mask=k_mask)
    if OUTPUT_STEP:
        store_tile(dy_ptr + column * M * G, G, 1, ks, k_mask, G, dy, BG)


@triton.jit
def _row_grad_kernel(
    a_ptr, s_ab, s_ah, s_an, s_ad,  # a_R (q on iteration 1), token-indexed [B, H, N, D]
    c_ptr,  # c_R [B*H, N] fp32 (HAS_C)
    k_ptr, s_kb, s_kh, s_kn, s_kd,
    v_ptr, s_vb, s_vh, s_vn, s_vd,
    lser_ptr, al_ptr, cl_ptr, y_ptr,  # recomputed R step: lse_R, c_L [B*H, b, M]; a_L [.., D]; y [.., Dv]
    dal_ptr, dcl_ptr, dy_ptr,  # from _column_grad_key_kernel: da_L [B*H, b, M, D], dc_L, dy [.., Dv]
    shift_ptr,  # output: rho [B*H, b, M]
    dar_ptr, dcr_ptr,  # outputs (HAS_C): da_R [B*H, b, M, D], dc_R [B*H, b, M]
    dq_ptr,  # (not HAS_C) dq accumulator [B*H, N, D] fp32: on iteration 1 a_R = q, so dq += da_R
    H, M, NB, D, Dv,
    SCALE: tl.constexpr, BJ: tl.constexpr, BI: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
    HAS_C: tl.constexpr, WITH_V: tl.constexpr, PRECISION: tl.constexpr,
):
    row, js, j_mask, bh, a, c, coef, k_ptr, v_ptr = _row_program(  # key row k, tile of query columns j
        a_ptr, s_ab, s_ah, s_an, s_ad, c_ptr, k_ptr, s_kb, s_kh, v_ptr, s_vb, s_vh, H, M, NB, D, SCALE, BJ, BD, HAS_C)
    columns = bh * NB + js  # [j, k] of the column-major statistics: columns * M + row
    lse_r = tl.load(lser_ptr + columns * M + row, mask=j_mask, other=0.0)
    c_l = tl.load(cl_ptr + columns * M + row, mask=j_mask, other=0.0)
    dc_l = tl.load(dcl_ptr + columns * M + row, mask=j_mask, other=0.0)
    a_l = load_tile(al_ptr + row * D, M * D, 1, columns, j_mask, D, BD)
    da_l = load_tile(dal_ptr + row * D, M * D, 1, columns, j_mask, D, BD)
    shift = -tl.sum(da_l * a_l, axis=1) - dc_l * (c_l + lse_r)
    if WITH_V:
        dy = load_tile(dy_ptr + row * Dv, M * Dv, 1, columns, j_mask, Dv, BV)
        shift -= tl.sum(dy * load_tile(y_ptr + row * Dv, M * Dv, 1, columns, j_mask, Dv, BV), axis=1)
    tl.store(shift_ptr + columns * M + row, shift, mask=j_mask)

    dz_k = tl.zeros((BJ, BD), dtype=tl.float32)  # sum_i dz k
    dz_z = tl.zeros((BJ,), dtype=tl.float32)  # sum_i dz z
    for start in range(0, NB, BI):
        cols = start + tl.arange(0, BI)
        i_mask = cols < NB
        keys = load_tile(k_ptr, s_kn, s_kd, row * NB + cols, i_mask, D, BD)  # [BI, BD]
        z = tl.dot(a, tl.trans(keys), input_precision=PRECISION) * coef[:, None]  # [BJ, BI]
        r = tl.where(i_mask[None, :], tl.exp(z - lse_r[:, None]), 0.0)  # R[k, j, i]
        d_r = tl.dot(da_l, tl.trans(keys), input_precision=PRECISION) + dc_l[:, None] * z + shift[:, None]
        if WITH_V:
            vals = load_tile(v_ptr, s_vn, s_vd, row * NB + cols, i_mask, Dv, BV)
            d_r += tl.dot(dy, tl.trans(vals), input_precision=PRECISION)
        dz = r * d_r
        dz_k += tl.dot(dz, keys, input_precision=PRECISION)
        dz_z += tl.sum(dz * z, axis=1)

    da_r = dz_k * coef[:, None]
    if HAS_C:
        dc_r = tl.where(c > C_MIN, -dz_z / c, 0.0)
        store_tile(dar_ptr + row * D, M * D, 1, columns, j_mask, D, da_r, BD)
        tl.store(dcr_ptr + columns * M + row, dc_r, mask=j_mask)
    else:
        tokens = bh * M * NB + row * NB + js
        da_r += load_tile(dq_ptr, D, 1, tokens, j_mask, D, BD)
        store_tile(dq_ptr, D, 1, tokens, j_mask, D, da_r, BD)


@triton.jit
def _row_key_grad_kernel(
    a_ptr, s_ab, s_ah, s_an, s_ad,  # a_R (q on iteration 1), token-indexed [B, H, N, D]
    c_ptr,  # c_R [B*H, N] fp32 (HAS_C)
    k_ptr, s_kb, s_kh, s_kn, s_kd,
    v_ptr, s_vb, s_vh, s_vn, s_vd,
    lser_ptr, shift_ptr, dcl_ptr, dal_ptr, dy_ptr,  # lse_R, rho, dc_L [B*H, b, M]; da_L [.., D]; dy [.., Dv]
    dk_ptr,  # dk accumulator [B*H, N, D] fp32, token-indexed: added to
    dv_ptr, s_dvb, s_dvh, s_dvn, s_dvd,  # output (WITH_V): dv [B, H, N, Dv]
    H, M, NB, D, Dv,
    SCALE: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
    HAS_C: tl.constexpr, WITH_V: tl.constexpr, PRECISION: tl.constexpr,
):
    row, _, cols, i_mask, bh = _program_tile(NB, BI)  # key row k, tile of its columns i
    a_ptr = head(a_ptr, bh, H, s_ab, s_ah)
    k_ptr = head(k_ptr, bh, H, s_kb, s_kh)
    v_ptr = head(v_ptr, bh, H, s_vb, s_vh)
    dv_ptr = head(dv_ptr, bh, H, s_dvb, s_dvh)
    keys = load_tile(k_ptr, s_kn, s_kd, row * NB + cols, i_mask, D, BD)  # [BI, BD]
    if WITH_V:
        vals = load_tile(v_ptr, s_vn, s_vd, row * NB + cols, i_mask, Dv, BV)  # [BI, BV]

    dk = tl.zeros((BI, BD), dtype=tl.float32)
    dv = tl.zeros((BI, BV), dtype=tl.float32)
    for start in range(0, NB, BJ):  # tiles are [BI, BJ]: transposed, so that the sums over j are plain dots
        js = start + tl.arange(0, BJ)
        j_mask = js < NB
        a = load_tile(a_ptr, s_an, s_ad, row * NB + js, j_mask, D, BD)  # [BJ, BD]
        c, coef = _r_scale(c_ptr, bh, M, NB, row, js, j_mask, SCALE, HAS_C, BJ)
        columns = bh * NB + js
        lse_r = tl.load(lser_ptr + columns * M + row, mask=j_mask, other=0.0)
        shift = tl.load(shift_ptr + columns * M + row, mask=j_mask, other=0.0)
        dc_l = tl.load(dcl_ptr + columns * M + row, mask=j_mask, other=0.0)
        da_l = load_tile(dal_ptr + row * D, M * D, 1, columns, j_mask, D, BD)  # [BJ, BD]
        z_t = tl.dot(keys, tl.trans(a), input_precision=PRECISION) * coef[None, :]  # z[k, j, i] as [BI, BJ]
        r_t = tl.where(i_mask[:, None] & j_mask[None, :], tl.exp(z_t - lse_r[None, :]), 0.0)  # R[k, j, i]
        d_r_t = tl.dot(keys, tl.trans(da_l), input_precision=PRECISION) + dc_l[None, :] * z_t + shift[None, :]
        if WITH_V:
            dy = load_tile(dy_ptr + row * Dv, M * Dv, 1, columns, j_mask, Dv, BV)  # [BJ, BV]
            d_r_t += tl.dot(vals, tl.trans(dy), input_precision=PRECISION)
            dv += tl.dot(r_t, dy, input_precision=PRECISION)
        dz_t = r_t * d_r_t
        dk += tl.dot(r_t, da_l, input_precision=PRECISION)
        dk += tl.dot(dz_t * coef[None, :], a, input_precision=PRECISION)

    tokens = bh * M * NB + row * NB + cols
    dk += load_tile(dk_ptr, D, 1, tokens, i_mask, D, BD)
    store_tile(dk_ptr, D, 1, tokens, i_mask, D, dk, BD)
    if WITH_V:
        store_tile(dv_ptr, s_dvn, s_dvd, row * NB + cols, i_mask, Dv, dv, BV)


# ----------------------------------------------------------------------------- launcher


def backward(
    d_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    lse_l: torch.Tensor, a_r: torch.Tensor, c_r: torch.Tensor,
    grid: tuple[int, int, int], num_iters: int, block_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``dq, dk, dv`` of ``out`` given ``d_out [B, H, N, Dv]``. They have q, k, v's dtypes and shapes.

    ``lse_l [T, B, H, b, M]``, ``a_r [T-1, B, H, N, D]`` and ``c_r [T-1, B, H, N]`` are the statistics
    returned by :func:`triton.forward` for the same inputs. They are fp32 and contiguous.
    """
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    check_head_dims(D, Dv)
    frames, height, width = grid
    M, NB = frames * height, width
    cfg = tiles(D, Dv, q.dtype, grid, device_capability(q.device), backward=True)
    BL, BK, BJ, BI, BD, BV = (cfg[name] for name in ("BL", "BK", "BJ", "BI", "BD", "BV"))
    common = dict(SCALE=D ** -0.5, PRECISION=cfg["PRECISION"], num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
    dev, f32 = q.device, torch.float32

    def column_major(*width):
        return torch.empty(B * H, NB, M, *width, device=dev, dtype=f32)

    a_l, c_l, lse_r, y = column_major(D), column_major(), column_major(), column_major(Dv)  # recomputed R step
    da_l, dc_l, dy, delta, shift = column_major(D), column_major(), column_major(Dv), column_major(), column_major()
    da_r, dc_r = column_major(D), column_major()  # gradient of iteration t's R-step inputs, read at t - 1
    dq = torch.zeros(B, H, N, D, device=dev, dtype=f32)
    dk = torch.zeros(B, H, N, D, device=dev, dtype=f32)
    dv = torch.empty(B, H, N, Dv, device=dev, dtype=v.dtype)

    for it in reversed(range(num_iters)):
        last = it == num_iters - 1
        a_src, c_src = (q, c_l) if it == 0 else (a_r[it - 1], c_r[it - 1])
        row_step(a_src, c_src, k, v, a_l, c_l, y, lse_r, grid, cfg, first=it == 0, with_v=last)

        # the L softmax of iteration t: dL = W (x . g + h)
        x, g, h, G, BG = (d_out, y, dc_r, Dv, BV) if last else (q, da_r, dc_r, D, BD)
        column = dict(CAUSAL=bool(block_causal), OUTPUT_STEP=last, BG=BG, **common)
        _column_grad_query_kernel[(NB * triton.cdiv(M, BL), B * H)](
            q, *q.stride(), x, *x.stride(), a_l, c_l, lse_l[it], g, h, delta, dq,
            H, M, NB, D, G, height, BL=BL, BK=BK, BD=BD, **column,
        )
        _column_grad_key_kernel[(NB * triton.cdiv(M, BK), B * H)](
            q, *q.stride(), x, *x.stride(), a_l, c_l, lse_l[it], delta, g, h, da_l, dc_l, dy,
            H, M, NB, D, G, height, BK=BK, BL=BL, BD=BD, **column,
        )

        # the R softmax of iteration t
        row = dict(HAS_C=it > 0, WITH_V=last, BD=BD, BV=BV, **common)
        _row_grad_kernel[(M * triton.cdiv(NB, BJ), B * H)](
            a_src, *a_src.stride(), c_src, k, *k.stride(), v, *v.stride(),
            lse_r, a_l, c_l, y, da_l, dc_l, dy, shift, da_r, dc_r, dq,
            H, M, NB, D, Dv, BJ=BJ, BI=BI, **row,
        )
        _row_key_grad_kernel[(M * triton.cdiv(NB, BI), B * H)](
            a_src, *a_src.stride(), c_src, k, *k.stride(), v, *v.stride(),
            lse_r, shift, dc_l, da_l, dy, dk, dv, *dv.stride(),
            H, M, NB, D, Dv, BI=BI, BJ=BJ, **row,
        )
    return dq.to(q.dtype), dk.to(k.dtype), dv
