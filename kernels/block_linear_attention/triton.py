"""Block-causal ReLU linear attention in Triton (forward and backward).

Same maths as ``reference.py``. Work is split so every phase is parallel over blocks:

forward
  1. ``_block_sums_kernel``    per (block, batch*head): dS_c = sum_{n in c} v_n rot(phi(k_n))^T, dz_c = sum phi(k_n)
  2. torch cumsum over blocks  S_c = S_0 + sum_{c' <= c} dS_c'   (inclusive: a block sees itself)
  3. ``_block_output_kernel``  per (span of <= 256 rows, batch*head): out = S_c rot(phi(q)) / (z_c . phi(q) + eps)
backward (recomputes 1-2 instead of saving per-block states)
  4. ``_query_grad_kernel``    per (block, batch*head): dq, and G_c = sum_{m in c} dnum_m rot(phi(q_m))^T,
                               g_c = sum_{m in c} dden_m phi(q_m)
  5. torch reverse cumsum      suffix sums of G, g (plus the gradient of the returned final state)
  6. ``_key_grad_kernel``      per (span of <= 256 rows, batch*head): dk, dv

RoPE (interleaved pairs, see ``kernels/rope``) is fused into the loads: even and odd channels are read
separately, rotated in registers and re-interleaved with ``tl.join`` + ``tl.reshape``. Accumulation is
fp32. For fp32 inputs every dot uses ``input_precision="ieee"``; for fp16/bf16 inputs the dots against
an fp32 state use ``"tf32"`` and the sums that build a state take operands rounded to 16 bits (the input
dtype, or bf16 for gradients), which is where diffusers rounds too (its rotated features are stored in the
input dtype before its fp32 matmul).
Head dims up to 128 are held whole in one program (``D``, ``Dv`` padded to powers of two >= 16).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_HEAD_DIM = 128
ROWS_PER_PROGRAM = 256  # output / key-gradient kernels: rows sharing one load of a block's state


# ----------------------------------------------------------------------------- helpers


@triton.jit
def _interleave(even, odd, BT: tl.constexpr, BK: tl.constexpr):
    """[BT, BK//2] x 2 -> [BT, BK] with even[i] at column 2i and odd[i] at column 2i+1."""
    return tl.reshape(tl.join(even, odd), (BT, BK))


@triton.jit
def _load_rope(rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BK: tl.constexpr):
    """cos of each pair (read at column 2i) and sin (read at column 2i+1), [BT, BK//2] fp32."""
    pairs = tl.arange(0, BK // 2)
    mask = row_mask[:, None] & (2 * pairs[None, :] < D)
    base = rope_ptr + rows[:, None] * s_rn
    cos = tl.load(base + (2 * pairs[None, :]) * s_rd, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(base + s_rt + (2 * pairs[None, :] + 1) * s_rd, mask=mask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _load_features(x_ptr, s_n, s_d, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D,
                   BT: tl.constexpr, BK: tl.constexpr, ROPE: tl.constexpr):
    """phi(x) = relu(x) and rot(phi(x)), both [BT, BK] fp32 (zero outside rows/columns)."""
    if ROPE:
        pairs = tl.arange(0, BK // 2)
        mask = row_mask[:, None] & (2 * pairs[None, :] < D)
        base = x_ptr + rows[:, None] * s_n
        x_even = tl.load(base + (2 * pairs[None, :]) * s_d, mask=mask, other=0.0).to(tl.float32)
        x_odd = tl.load(base + (2 * pairs[None, :] + 1) * s_d, mask=mask, other=0.0).to(tl.float32)
        x_even = tl.maximum(x_even, 0.0)
        x_odd = tl.maximum(x_odd, 0.0)
        cos, sin = _load_rope(rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BK)
        feat = _interleave(x_even, x_odd, BT, BK)
        rot = _interleave(x_even * cos - x_odd * sin, x_even * sin + x_odd * cos, BT, BK)
    else:
        cols = tl.arange(0, BK)
        mask = row_mask[:, None] & (cols[None, :] < D)
        x = tl.load(x_ptr + rows[:, None] * s_n + cols[None, :] * s_d, mask=mask, other=0.0).to(tl.float32)
        feat = tl.maximum(x, 0.0)
        rot = feat
    return feat, rot


@triton.jit
def _unrotate(g, cos, sin, BT: tl.constexpr, BK: tl.constexpr):
    """Transpose of the rotation applied to a gradient: R^T g, [BT, BK]."""
    g_even, g_odd = tl.split(tl.reshape(g, (BT, BK // 2, 2)))
    return _interleave(g_even * cos + g_odd * sin, g_odd * cos - g_even * sin, BT, BK)


@triton.jit
def _load_rows(ptr, s_n, s_d, rows, row_mask, width, BW: tl.constexpr):
    cols = tl.arange(0, BW)
    mask = row_mask[:, None] & (cols[None, :] < width)
    return tl.load(ptr + rows[:, None] * s_n + cols[None, :] * s_d, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_rows(ptr, s_n, s_d, rows, row_mask, width, value, BW: tl.constexpr):
    cols = tl.arange(0, BW)
    mask = row_mask[:, None] & (cols[None, :] < width)
    tl.store(ptr + rows[:, None] * s_n + cols[None, :] * s_d, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _state_ptrs(ptr, bh, c, NB, D, Dv, BK: tl.constexpr, BV: tl.constexpr):
    """Pointers and mask into a contiguous per-block state ``[B*H, NB, Dv, D]``."""
    rv = tl.arange(0, BV)
    rk = tl.arange(0, BK)
    offs = (bh * NB + c) * Dv * D + rv[:, None] * D + rk[None, :]
    return ptr + offs, (rv[:, None] < Dv) & (rk[None, :] < D)


@triton.jit
def _vec_ptrs(ptr, bh, c, NB, D, BK: tl.constexpr):
    """Pointers and mask into a contiguous per-block vector ``[B*H, NB, D]``."""
    rk = tl.arange(0, BK)
    return ptr + (bh * NB + c) * D + rk, rk < D


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _block_sums_kernel(
    k_ptr, s_kb, s_kh, s_kn, s_kd,
    v_ptr, s_vb, s_vh, s_vn, s_vd,
    rope_ptr, s_rt, s_rb, s_rh, s_rn, s_rd,
    kv_ptr, ksum_ptr,
    H, NB, D, Dv, BLOCK,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ROPE: tl.constexpr, PRECISION: tl.constexpr,
):
    c = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    k_ptr += b * s_kb + h * s_kh
    v_ptr += b * s_vb + h * s_vh
    rope_ptr += b * s_rb + h * s_rh

    kv = tl.zeros((BV, BK), dtype=tl.float32)
    ksum = tl.zeros((BK,), dtype=tl.float32)
    for t in range(0, BLOCK, BT):
        offs = t + tl.arange(0, BT)
        row_mask = offs < BLOCK
        rows = c * BLOCK + offs
        feat, rot = _load_features(k_ptr, s_kn, s_kd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        v = _load_rows(v_ptr, s_vn, s_vd, rows, row_mask, Dv, BV)
        if PRECISION == "ieee":
            kv += tl.dot(tl.trans(v), rot, input_precision=PRECISION)
        else:  # fp16/bf16 inputs: multiply in the input dtype, as diffusers' fp32 matmul of bf16-valued tensors
            half = v_ptr.dtype.element_ty
            kv += tl.dot(tl.trans(v.to(half)), rot.to(half))
        ksum += tl.sum(feat, axis=0)

    kv_ptrs, kv_mask = _state_ptrs(kv_ptr, bh, c, NB, D, Dv, BK, BV)
    tl.store(kv_ptrs, kv, mask=kv_mask)
    ks_ptrs, ks_mask = _vec_ptrs(ksum_ptr, bh, c, NB, D, BK)
    tl.store(ks_ptrs, ksum, mask=ks_mask)


@triton.jit
def _block_output_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    rope_ptr, s_rt, s_rb, s_rh, s_rn, s_rd,
    kv_ptr, ksum_ptr,
    o_ptr, s_ob, s_oh, s_on, s_od,
    H, NB, D, Dv, BLOCK, SPANS, SPAN, eps,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ROPE: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    c, span = pid // SPANS, pid % SPANS  # this program: rows [span * SPAN, (span + 1) * SPAN) of block c
    b, h = bh // H, bh % H
    q_ptr += b * s_qb + h * s_qh
    o_ptr += b * s_ob + h * s_oh
    rope_ptr += b * s_rb + h * s_rh

    kv_ptrs, kv_mask = _state_ptrs(kv_ptr, bh, c, NB, D, Dv, BK, BV)
    kv = tl.load(kv_ptrs, mask=kv_mask, other=0.0)
    ks_ptrs, ks_mask = _vec_ptrs(ksum_ptr, bh, c, NB, D, BK)
    ksum = tl.load(ks_ptrs, mask=ks_mask, other=0.0)

    end = tl.minimum((span + 1) * SPAN, BLOCK)
    for t in range(span * SPAN, end, BT):
        offs = t + tl.arange(0, BT)
        row_mask = offs < end
        rows = c * BLOCK + offs
        feat, rot = _load_features(q_ptr, s_qn, s_qd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        num = tl.dot(rot, tl.trans(kv), input_precision=PRECISION)  # [BT, BV]
        den = tl.sum(feat * ksum[None, :], axis=1) + eps  # [BT]
        _store_rows(o_ptr, s_on, s_od, rows, row_mask, Dv, num / den[:, None], BV)


@triton.jit
def _query_grad_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    rope_ptr, s_rt, s_rb, s_rh, s_rn, s_rd,
    kv_ptr, ksum_ptr,
    do_ptr, s_ob, s_oh, s_on, s_od,
    dq_ptr, s_dqb, s_dqh, s_dqn, s_dqd,
    gkv_ptr, gksum_ptr,
    H, NB, D, Dv, BLOCK, eps,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ROPE: tl.constexpr, PRECISION: tl.constexpr,
):
    c = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    q_ptr += b * s_qb + h * s_qh
    do_ptr += b * s_ob + h * s_oh
    dq_ptr += b * s_dqb + h * s_dqh
    rope_ptr += b * s_rb + h * s_rh

    kv_ptrs, kv_mask = _state_ptrs(kv_ptr, bh, c, NB, D, Dv, BK, BV)
    kv = tl.load(kv_ptrs, mask=kv_mask, other=0.0)
    ks_ptrs, ks_mask = _vec_ptrs(ksum_ptr, bh, c, NB, D, BK)
    ksum = tl.load(ks_ptrs, mask=ks_mask, other=0.0)

    gkv = tl.zeros((BV, BK), dtype=tl.float32)
    gksum = tl.zeros((BK,), dtype=tl.float32)
    for t in range(0, BLOCK, BT):
        offs = t + tl.arange(0, BT)
        row_mask = offs < BLOCK
        rows = c * BLOCK + offs
        feat, rot = _load_features(q_ptr, s_qn, s_qd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        do = _load_rows(do_ptr, s_on, s_od, rows, row_mask, Dv, BV)
        num = tl.dot(rot, tl.trans(kv), input_precision=PRECISION)
        den = tl.sum(feat * ksum[None, :], axis=1) + eps
        out = num / den[:, None]
        d_num = do / den[:, None]  # [BT, BV]
        d_den = -tl.sum(do * out, axis=1) / den  # [BT]
        d_feat = tl.dot(d_num, kv, input_precision=PRECISION)  # d rot, [BT, BK]
        if ROPE:
            cos, sin = _load_rope(rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BK)
            d_feat = _unrotate(d_feat, cos, sin, BT, BK)
        d_feat += d_den[:, None] * ksum[None, :]
        dq = tl.where(feat > 0, d_feat, 0.0)
        _store_rows(dq_ptr, s_dqn, s_dqd, rows, row_mask, D, dq, BK)
        if PRECISION == "ieee":
            gkv += tl.dot(tl.trans(d_num), rot, input_precision=PRECISION)
        else:  # fp16/bf16 inputs: operands rounded to bf16 (fp32's range: d_num can be huge), fp32 accumulation
            gkv += tl.dot(tl.trans(d_num.to(tl.bfloat16)), rot.to(tl.bfloat16))
        gksum += tl.sum(d_den[:, None] * feat, axis=0)

    gkv_ptrs, _ = _state_ptrs(gkv_ptr, bh, c, NB, D, Dv, BK, BV)
    tl.store(gkv_ptrs, gkv, mask=kv_mask)
    gks_ptrs, _ = _vec_ptrs(gksum_ptr, bh, c, NB, D, BK)
    tl.store(gks_ptrs, gksum, mask=ks_mask)


@triton.jit
def _key_grad_kernel(
    k_ptr, s_kb, s_kh, s_kn, s_kd,
    v_ptr, s_vb, s_vh, s_vn, s_vd,
    rope_ptr, s_rt, s_rb, s_rh, s_rn, s_rd,
    gkv_ptr, gksum_ptr,
    dk_ptr, s_dkb, s_dkh, s_dkn, s_dkd,
    dv_ptr, s_dvb, s_dvh, s_dvn, s_dvd,
    H, NB, D, Dv, BLOCK, SPANS, SPAN,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ROPE: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    c, span = pid // SPANS, pid % SPANS  # this program: rows [span * SPAN, (span + 1) * SPAN) of block c
    b, h = bh // H, bh % H
    k_ptr += b * s_kb + h * s_kh
    v_ptr += b * s_vb + h * s_vh
    dk_ptr += b * s_dkb + h * s_dkh
    dv_ptr += b * s_dvb + h * s_dvh
    rope_ptr += b * s_rb + h * s_rh

    gkv_ptrs, gkv_mask = _state_ptrs(gkv_ptr, bh, c, NB, D, Dv, BK, BV)
    gkv = tl.load(gkv_ptrs, mask=gkv_mask, other=0.0)  # suffix sum over blocks >= c
    gks_ptrs, gks_mask = _vec_ptrs(gksum_ptr, bh, c, NB, D, BK)
    gksum = tl.load(gks_ptrs, mask=gks_mask, other=0.0)

    end = tl.minimum((span + 1) * SPAN, BLOCK)
    for t in range(span * SPAN, end, BT):
        offs = t + tl.arange(0, BT)
        row_mask = offs < end
        rows = c * BLOCK + offs
        feat, rot = _load_features(k_ptr, s_kn, s_kd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        v = _load_rows(v_ptr, s_vn, s_vd, rows, row_mask, Dv, BV)
        dv = tl.dot(rot, tl.trans(gkv), input_precision=PRECISION)  # [BT, BV]
        d_feat = tl.dot(v, gkv, input_precision=PRECISION)  # d rot, [BT, BK]
        if ROPE:
            cos, sin = _load_rope(rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BK)
            d_feat = _unrotate(d_feat, cos, sin, BT, BK)
        d_feat += gksum[None, :]
        dk = tl.where(feat > 0, d_feat, 0.0)
        _store_rows(dk_ptr, s_dkn, s_dkd, rows, row_mask, D, dk, BK)
        _store_rows(dv_ptr, s_dvn, s_dvd, rows, row_mask, Dv, dv, BV)


# ----------------------------------------------------------------------------- launchers


def _config(q: torch.Tensor, v: torch.Tensor, block_size: int) -> dict:
    D, Dv = q.shape[-1], v.shape[-1]
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(
            f"block_linear_attention (triton): head dims D={D}, Dv={Dv}; the Triton kernels support up to "
            f"{MAX_HEAD_DIM}; use backend='torch'"
        )
    BK = max(16, triton.next_power_of_2(D))
    BV = max(16, triton.next_power_of_2(Dv))
    big = BK * BV > 64 * 64
    BT = max(16, min(32 if big else 64, triton.next_power_of_2(block_size)))
    return dict(
        BT=BT, BK=BK, BV=BV,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=8 if big else 4,
    )


def _spans(block_size: int, BT: int) -> tuple[int, int]:
    """Rows per program (a multiple of BT, so the per-block state is loaded once per ~256 rows) and spans per block."""
    span = BT * max(1, min(ROWS_PER_PROGRAM // BT, triton.cdiv(block_size, BT)))
    return span, triton.cdiv(block_size, span)


def _rope_args(rope: torch.Tensor | None, q: torch.Tensor) -> tuple:
    """``rope`` is ``stack((cos, sin))`` broadcast to ``[2, B, H, N, D]`` (zero strides where broadcast)."""
    if rope is None:
        return (q, 0, 0, 0, 0, 0)
    return (rope, *rope.stride())


def _block_sums(k, v, rope, block_size, cfg):
    B, H, N, D = k.shape
    Dv = v.shape[-1]
    NB = N // block_size
    kv = torch.empty(B, H, NB, Dv, D, device=k.device, dtype=torch.float32)
    ksum = torch.empty(B, H, NB, D, device=k.device, dtype=torch.float32)
    _block_sums_kernel[(NB, B * H)](
        k, *k.stride(), v, *v.stride(), *_rope_args(rope, k), kv, ksum,
        H, NB, D, Dv, block_size, ROPE=rope is not None, **cfg,
    )
    return kv, ksum


def _inclusive_states(k, v, rope, kv0, ksum0, block_size, cfg):
    """Per-block states ``S_c``, ``z_c`` including block ``c`` itself: ``[B, H, NB, Dv, D]``, ``[B, H, NB, D]``."""
    kv, ksum = _block_sums(k, v, rope, block_size, cfg)
    kv = torch.cumsum(kv, dim=2).add_(kv0.float().unsqueeze(2))
    ksum = torch.cumsum(ksum, dim=2).add_(ksum0.float().unsqueeze(2))
    return kv, ksum


def forward(q, k, v, rope, kv0, ksum0, block_size: int, eps: float):
    """Returns ``out [B, H, N, Dv]`` (dtype of q), final ``kv [B, H, Dv, D]`` and ``k_sum [B, H, D]`` (fp32)."""
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    NB = N // block_size
    cfg = _config(q, v, block_size)
    kv, ksum = _inclusive_states(k, v, rope, kv0, ksum0, block_size, cfg)
    out = torch.empty(B, H, N, Dv, device=q.device, dtype=q.dtype)
    span, spans = _spans(block_size, cfg["BT"])
    _block_output_kernel[(NB * spans, B * H)](
        q, *q.stride(), *_rope_args(rope, q), kv, ksum, out, *out.stride(),
        H, NB, D, Dv, block_size, spans, span, eps, ROPE=rope is not None, **cfg,
    )
    return out, kv[:, :, -1].clone(), ksum[:, :, -1].clone()


def backward(d_out, d_kv_final, d_ksum_final, q, k, v, rope, kv0, ksum0, block_size: int, eps: float):
    """Returns ``dq, dk, dv`` (dtypes of q, k, v) and the gradients of the initial state (fp32)."""
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    NB = N // block_size
    cfg = _config(q, v, block_size)
    kv, ksum = _inclusive_states(k, v, rope, kv0, ksum0, block_size, cfg)

    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    g_kv = torch.empty_like(kv)
    g_ksum = torch.empty_like(ksum)
    _query_grad_kernel[(NB, B * H)](
        q, *q.stride(), *_rope_args(rope, q), kv, ksum, d_out, *d_out.stride(), dq, *dq.stride(),
        g_kv, g_ksum, H, NB, D, Dv, block_size, eps, ROPE=rope is not None, **cfg,
    )
    # Keys of block c feed the states of blocks c..NB-1 and the returned final state.
    g_kv = torch.flip(torch.cumsum(torch.flip(g_kv, [2]), dim=2), [2]).add_(d_kv_final.float().unsqueeze(2))
    g_ksum = torch.flip(torch.cumsum(torch.flip(g_ksum, [2]), dim=2), [2]).add_(d_ksum_final.float().unsqueeze(2))

    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    span, spans = _spans(block_size, cfg["BT"])
    _key_grad_kernel[(NB * spans, B * H)](
        k, *k.stride(), v, *v.stride(), *_rope_args(rope, k), g_kv, g_ksum,
        dk, *dk.stride(), dv, *dv.stride(), H, NB, D, Dv, block_size, spans, span, ROPE=rope is not None, **cfg,
    )
    return dq, dk, dv, g_kv[:, :, 0].clone(), g_ksum[:, :, 0].clone()
