"""Block-causal ReLU linear attention in Triton, forward and backward.

The maths is that of ``reference.py``. Work is split so every phase is parallel over blocks. The phases, with
each kernel's grid::

    forward
      1. ``_block_sums_kernel``    per (block, batch*head, BV values): dS_c = sum_{n in c} v_n rot(phi(k_n))^T,
                                   dz_c = sum phi(k_n)
      2. torch cumsum over blocks  S_c = S_0 + sum_{c' <= c} dS_c'   (inclusive: a block sees itself)
      3. ``_block_output_kernel``  per (span of <= 256 rows, batch*head, BV values):
                                   out = S_c rot(phi(q)) / (z_c . phi(q) + eps)
    backward (recomputes 1-2 instead of saving per-block states)
      4. ``_query_grad_kernel``    per (block, batch*head): dq and g_c = sum_{m in c} dden_m phi(q_m), reading S_c
                                   BV values at a time (dden needs every value: dden = -rot . drot / den)
      5. ``_query_state_grad_kernel`` per (block, batch*head, BV values): G_c = sum_{m in c} dnum_m rot(phi(q_m))^T
      6. torch reverse cumsum      suffix sums of G, g (plus the gradient of the returned final state)
      7. ``_key_grad_kernel``      per (span of <= 256 rows, batch*head): dk, dv, reading G_c BV values at a time

No program holds a whole [Dv, D] state in registers. The kernels that build or apply one split it into
[BV, BK] slices over a grid axis. The gradient kernels that need every value of a row loop over the slices.
The function :func:`launch_configs` picks BV, BT, warps and pipeline stages per GPU architecture.

RoPE is fused into the loads. It rotates interleaved pairs, as in ``kernels/rope``. Even and odd channels are
read separately. They are rotated in registers and re-interleaved with ``tl.join`` + ``tl.reshape``.
Accumulation is fp32. For fp32 inputs every dot uses ``input_precision="ieee"``. For fp16/bf16 inputs the dots
against an fp32 state use ``"tf32"``. The sums that build a state then take operands rounded to 16 bits. That
is the input dtype, or bf16 for gradients. The diffusers code rounds there too. It stores its rotated features in the
input dtype before its fp32 matmul. Key head dims up to 128 are held whole in one program. ``D`` is padded to
a power of two >= 16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import device_capability
from ..tiles import head, load_tile, store_tile

MAX_HEAD_DIM = 128
ROWS_PER_PROGRAM = 256  # output and key-gradient kernels: rows sharing one load of a block's state


# ----------------------------------------------------------------------------- helpers


@triton.jit
def _interleave(even, odd, BT: tl.constexpr, BK: tl.constexpr):
    """[BT, BK//2] x 2 -> [BT, BK] with even[i] at column 2i and odd[i] at column 2i+1."""
    return tl.reshape(tl.join(even, odd), (BT, BK))


@triton.jit
def _load_rope(rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BK: tl.constexpr):
    """cos and sin of each pair, [BT, BK//2] fp32. cos is read at column 2i, sin at column 2i+1."""
    pairs = tl.arange(0, BK // 2)
    mask = row_mask[:, None] & (2 * pairs[None, :] < D)
    base = rope_ptr + rows[:, None] * s_rn
    cos = tl.load(base + (2 * pairs[None, :]) * s_rd, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(base + s_rt + (2 * pairs[None, :] + 1) * s_rd, mask=mask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _load_features(x_ptr, s_n, s_d, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D,
                   BT: tl.constexpr, BK: tl.constexpr, ROPE: tl.constexpr):
    """``phi(x) = relu(x)`` and ``rot(phi(x))``, both [BT, BK] fp32. Zero outside the rows and columns."""
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
def _span(SPANS, SPAN, BLOCK):
    """Block ``c`` of this program and the rows ``[start, end)`` within it.

    The program is number ``c * SPANS + span``.
    """
    pid = tl.program_id(0)
    c, span = pid // SPANS, pid % SPANS
    return c, span * SPAN, tl.minimum((span + 1) * SPAN, BLOCK)


@triton.jit
def _block_rows(c, BLOCK, t, end, BT: tl.constexpr):
    """Rows ``t .. t + BT`` of block ``c`` as token indices, and their mask.

    The mask keeps rows below ``end`` within the block.
    """
    offs = t + tl.arange(0, BT)
    return c * BLOCK + offs, offs < end


@triton.jit
def _state_ptrs(ptr, bh, c, NB, D, Dv, v0, BK: tl.constexpr, BV: tl.constexpr):
    """Pointers and mask into rows ``v0 .. v0 + BV`` of a contiguous per-block state ``[B*H, NB, Dv, D]``."""
    rv = v0 + tl.arange(0, BV)
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
    v0 = tl.program_id(2) * BV  # this program: state rows (values) v0 .. v0 + BV
    k_ptr = head(k_ptr, bh, H, s_kb, s_kh)
    v_ptr = head(v_ptr, bh, H, s_vb, s_vh) + v0 * s_vd
    rope_ptr = head(rope_ptr, bh, H, s_rb, s_rh)

    kv = tl.zeros((BV, BK), dtype=tl.float32)
    ksum = tl.zeros((BK,), dtype=tl.float32)
    for t in range(0, BLOCK, BT):
        rows, row_mask = _block_rows(c, BLOCK, t, BLOCK, BT)
        feat, rot = _load_features(k_ptr, s_kn, s_kd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        v = load_tile(v_ptr, s_vn, s_vd, rows, row_mask, Dv - v0, BV)
        if PRECISION == "ieee":
            kv += tl.dot(tl.trans(v), rot, input_precision=PRECISION)
        else:  # fp16/bf16 inputs: multiply in the input dtype, as diffusers' fp32 matmul of bf16-valued tensors
            half = v_ptr.dtype.element_ty
            kv += tl.dot(tl.trans(v.to(half)), rot.to(half))
        ksum += tl.sum(feat, axis=0)

    kv_ptrs, kv_mask = _state_ptrs(kv_ptr, bh, c, NB, D, Dv, v0, BK, BV)
    tl.store(kv_ptrs, kv, mask=kv_mask)
    ks_ptrs, ks_mask = _vec_ptrs(ksum_ptr, bh, c, NB, D, BK)
    if v0 == 0:  # every value slice computes it; the first stores it
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
    c, start, end = _span(SPANS, SPAN, BLOCK)  # this program: rows [start, end) of block c
    bh = tl.program_id(1)
    v0 = tl.program_id(2) * BV  # and output columns (values) v0 .. v0 + BV
    q_ptr = head(q_ptr, bh, H, s_qb, s_qh)
    o_ptr = head(o_ptr, bh, H, s_ob, s_oh) + v0 * s_od
    rope_ptr = head(rope_ptr, bh, H, s_rb, s_rh)

    kv_ptrs, kv_mask = _state_ptrs(kv_ptr, bh, c, NB, D, Dv, v0, BK, BV)
    kv = tl.load(kv_ptrs, mask=kv_mask, other=0.0)
    ks_ptrs, ks_mask = _vec_ptrs(ksum_ptr, bh, c, NB, D, BK)
    ksum = tl.load(ks_ptrs, mask=ks_mask, other=0.0)

    for t in range(start, end, BT):
        rows, row_mask = _block_rows(c, BLOCK, t, end, BT)
        feat, rot = _load_features(q_ptr, s_qn, s_qd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        num = tl.dot(rot, tl.trans(kv), input_precision=PRECISION)  # [BT, BV]
        den = tl.sum(feat * ksum[None, :], axis=1) + eps  # [BT]
        store_tile(o_ptr, s_on, s_od, rows, row_mask, Dv - v0, num / den[:, None], BV)


@triton.jit
def _query_grad_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    rope_ptr, s_rt, s_rb, s_rh, s_rn, s_rd,
    kv_ptr, ksum_ptr,
    do_ptr, s_ob, s_oh, s_on, s_od,
    dq_ptr, s_dqb, s_dqh, s_dqn, s_dqd,
    gksum_ptr,
    H, NB, D, Dv, BLOCK, eps,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ROPE: tl.constexpr, PRECISION: tl.constexpr,
):
    c = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr = head(q_ptr, bh, H, s_qb, s_qh)
    do_ptr = head(do_ptr, bh, H, s_ob, s_oh)
    dq_ptr = head(dq_ptr, bh, H, s_dqb, s_dqh)
    rope_ptr = head(rope_ptr, bh, H, s_rb, s_rh)

    ks_ptrs, ks_mask = _vec_ptrs(ksum_ptr, bh, c, NB, D, BK)
    ksum = tl.load(ks_ptrs, mask=ks_mask, other=0.0)

    gksum = tl.zeros((BK,), dtype=tl.float32)
    for t in range(0, BLOCK, BT):
        rows, row_mask = _block_rows(c, BLOCK, t, BLOCK, BT)
        feat, rot = _load_features(q_ptr, s_qn, s_qd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        den = tl.sum(feat * ksum[None, :], axis=1) + eps  # [BT]
        d_rot = tl.zeros((BT, BK), dtype=tl.float32)  # sum_v dnum_v S[v, :], BV values at a time
        for v0 in range(0, Dv, BV):
            kv_ptrs, kv_mask = _state_ptrs(kv_ptr, bh, c, NB, D, Dv, v0, BK, BV)
            kv = tl.load(kv_ptrs, mask=kv_mask, other=0.0)
            do = load_tile(do_ptr + v0 * s_od, s_on, s_od, rows, row_mask, Dv - v0, BV)
            d_rot += tl.dot(do / den[:, None], kv, input_precision=PRECISION)
        # out = num / den and num = S rot, so  d_den = -sum_v do_v num_v / den^2 = -(rot . d_rot) / den
        d_den = -tl.sum(rot * d_rot, axis=1) / den  # [BT]
        d_feat = d_rot
        if ROPE:
            cos, sin = _load_rope(rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BK)
            d_feat = _unrotate(d_feat, cos, sin, BT, BK)
        d_feat += d_den[:, None] * ksum[None, :]
        dq = tl.where(feat > 0, d_feat, 0.0)
        store_tile(dq_ptr, s_dqn, s_dqd, rows, row_mask, D, dq, BK)
        gksum += tl.sum(d_den[:, None] * feat, axis=0)

    gks_ptrs, _ = _vec_ptrs(gksum_ptr, bh, c, NB, D, BK)
    tl.store(gks_ptrs, gksum, mask=ks_mask)


@triton.jit
def _query_state_grad_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    rope_ptr, s_rt, s_rb, s_rh, s_rn, s_rd,
    ksum_ptr,
    do_ptr, s_ob, s_oh, s_on, s_od,
    gkv_ptr,
    H, NB, D, Dv, BLOCK, eps,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ROPE: tl.constexpr, PRECISION: tl.constexpr,
):
    """G_c[v0 .. v0 + BV] = sum over the rows of block c of dnum^T rot(phi(q)), dnum = do / den."""
    c = tl.program_id(0)
    bh = tl.program_id(1)
    v0 = tl.program_id(2) * BV
    q_ptr = head(q_ptr, bh, H, s_qb, s_qh)
    do_ptr = head(do_ptr, bh, H, s_ob, s_oh) + v0 * s_od
    rope_ptr = head(rope_ptr, bh, H, s_rb, s_rh)

    ks_ptrs, ks_mask = _vec_ptrs(ksum_ptr, bh, c, NB, D, BK)
    ksum = tl.load(ks_ptrs, mask=ks_mask, other=0.0)

    gkv = tl.zeros((BV, BK), dtype=tl.float32)
    for t in range(0, BLOCK, BT):
        rows, row_mask = _block_rows(c, BLOCK, t, BLOCK, BT)
        feat, rot = _load_features(q_ptr, s_qn, s_qd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        den = tl.sum(feat * ksum[None, :], axis=1) + eps
        d_num = load_tile(do_ptr, s_on, s_od, rows, row_mask, Dv - v0, BV) / den[:, None]  # [BT, BV]
        if PRECISION == "ieee":
            gkv += tl.dot(tl.trans(d_num), rot, input_precision=PRECISION)
        else:  # fp16/bf16 inputs: operands rounded to bf16 (fp32's range: d_num can be huge), fp32 accumulation
            gkv += tl.dot(tl.trans(d_num.to(tl.bfloat16)), rot.to(tl.bfloat16))

    gkv_ptrs, gkv_mask = _state_ptrs(gkv_ptr, bh, c, NB, D, Dv, v0, BK, BV)
    tl.store(gkv_ptrs, gkv, mask=gkv_mask)


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
    c, start, end = _span(SPANS, SPAN, BLOCK)  # this program: rows [start, end) of block c
    bh = tl.program_id(1)
    k_ptr = head(k_ptr, bh, H, s_kb, s_kh)
    v_ptr = head(v_ptr, bh, H, s_vb, s_vh)
    dk_ptr = head(dk_ptr, bh, H, s_dkb, s_dkh)
    dv_ptr = head(dv_ptr, bh, H, s_dvb, s_dvh)
    rope_ptr = head(rope_ptr, bh, H, s_rb, s_rh)

    gks_ptrs, gks_mask = _vec_ptrs(gksum_ptr, bh, c, NB, D, BK)
    gksum = tl.load(gks_ptrs, mask=gks_mask, other=0.0)

    for t in range(start, end, BT):
        rows, row_mask = _block_rows(c, BLOCK, t, end, BT)
        feat, rot = _load_features(k_ptr, s_kn, s_kd, rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BT, BK, ROPE)
        d_feat = tl.zeros((BT, BK), dtype=tl.float32)  # d rot = v G, BV values at a time
        for v0 in range(0, Dv, BV):
            gkv_ptrs, gkv_mask = _state_ptrs(gkv_ptr, bh, c, NB, D, Dv, v0, BK, BV)
            gkv = tl.load(gkv_ptrs, mask=gkv_mask, other=0.0)  # suffix sum over blocks >= c
            v = load_tile(v_ptr + v0 * s_vd, s_vn, s_vd, rows, row_mask, Dv - v0, BV)
            dv = tl.dot(rot, tl.trans(gkv), input_precision=PRECISION)  # [BT, BV]
            store_tile(dv_ptr + v0 * s_dvd, s_dvn, s_dvd, rows, row_mask, Dv - v0, dv, BV)
            d_feat += tl.dot(v, gkv, input_precision=PRECISION)
        if ROPE:
            cos, sin = _load_rope(rope_ptr, s_rt, s_rn, s_rd, rows, row_mask, D, BK)
            d_feat = _unrotate(d_feat, cos, sin, BT, BK)
        d_feat += gksum[None, :]
        dk = tl.where(feat > 0, d_feat, 0.0)
        store_tile(dk_ptr, s_dkn, s_dkd, rows, row_mask, D, dk, BK)


# ----------------------------------------------------------------------------- launchers


def check_head_dims(D: int, Dv: int) -> None:
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(
            f"block_linear_attention (triton): head dims D={D}, Dv={Dv}; the Triton kernels support up to "
            f"{MAX_HEAD_DIM}; use backend='torch'"
        )


# Per GPU architecture, for heads wider than 64: (BV, BT, num_warps, num_stages) of each kernel, for fp32
# ("ieee") and fp16/bf16 ("tf32") inputs. BV is state rows (values) per program or per loop step. BT is rows
# per step. At D = Dv = 128 each entry is the largest tile that neither spills nor exceeds the per-block shared
# memory: 99 KiB on sm_89 / sm_120, 227 KiB on sm_90. One [128, 128] fp32 state is 64 KiB, 64 registers a
# thread at 8 warps. A dot stages its operand through shared memory. So the state is split into [BV, 128]
# slices. One pipeline stage, with no prefetch of the next step, is used where three do not fit. The
# backward's dq and dk kernels keep a [BT, 128] gradient. The features and their rotation live across their
# loop over the state's slices. Hence BT = 16 and BV = 32 / 16, the largest that fit in 255 registers.
# `framegraph bench compile` compiles exactly these. The table records fit, not speed: docs/runtimes.md.
_ALL_ARCHS = (89, 90, 120)
_WIDE_TILES = {
    ("sums", "ieee"): dict.fromkeys(_ALL_ARCHS, (128, 32, 8, 1)),
    ("sums", "tf32"): dict.fromkeys(_ALL_ARCHS, (128, 32, 8, 3)),
    ("output", "ieee"): {89: (64, 32, 8, 1), 90: (128, 32, 8, 3), 120: (64, 32, 8, 1)},
    ("output", "tf32"): {89: (128, 32, 8, 1), 90: (128, 32, 8, 3), 120: (128, 32, 8, 1)},
    ("query_grad", "ieee"): dict.fromkeys(_ALL_ARCHS, (32, 16, 8, 1)),
    ("query_grad", "tf32"): dict.fromkeys(_ALL_ARCHS, (32, 16, 8, 1)),
    ("query_state_grad", "ieee"): dict.fromkeys(_ALL_ARCHS, (128, 32, 8, 1)),
    ("query_state_grad", "tf32"): dict.fromkeys(_ALL_ARCHS, (128, 32, 8, 3)),
    ("key_grad", "ieee"): dict.fromkeys(_ALL_ARCHS, (16, 16, 8, 1)),
    ("key_grad", "tf32"): dict.fromkeys(_ALL_ARCHS, (16, 16, 8, 1)),
}
KERNELS = ("sums", "output", "query_grad", "query_state_grad", "key_grad")


def launch_configs(D: int, Dv: int, block_size: int, dtype: torch.dtype, capability: int) -> dict[str, dict]:
    """Launch configuration of each kernel in ``KERNELS``.

    It is for head dims ``D``, ``Dv`` and inputs of ``dtype``, on a GPU of compute ``capability``. For example,
    89 means sm_89. Architectures not in the table get the nearest one below, or sm_89's. Each configuration gives
    ``BT``, ``BK``, ``BV``, ``PRECISION``, ``num_warps`` and ``num_stages``.

    Heads up to 64 wide, a state <= 64 x 64, are small enough for one program on any architecture. They get
    4 warps and 64 rows per step. Wider heads follow ``_WIDE_TILES``. `framegraph bench compile` compiles
    exactly these.
    """
    check_head_dims(D, Dv)
    BK = max(16, triton.next_power_of_2(D))
    BV_full = max(16, triton.next_power_of_2(Dv))
    precision = "ieee" if dtype == torch.float32 else "tf32"
    if BK * BV_full <= 64 * 64:
        BT = max(16, min(64, triton.next_power_of_2(block_size)))
        return {name: dict(BT=BT, BK=BK, BV=BV_full, PRECISION=precision, num_warps=4, num_stages=3)
                for name in KERNELS}
    known = sorted(_WIDE_TILES["sums", precision])
    arch = max([a for a in known if a <= capability], default=known[0])
    configs = {}
    for name in KERNELS:
        BV, BT, warps, stages = _WIDE_TILES[name, precision][arch]
        BT = max(16, min(BT, triton.next_power_of_2(block_size)))
        configs[name] = dict(BT=BT, BK=BK, BV=min(BV, BV_full), PRECISION=precision, num_warps=warps,
                             num_stages=stages)
    return configs


def _configs(q: torch.Tensor, v: torch.Tensor, block_size: int) -> dict[str, dict]:
    return launch_configs(q.shape[-1], v.shape[-1], block_size, q.dtype, device_capability(q.device))


def _spans(block_size: int, BT: int) -> tuple[int, int]:
    """Rows per program and spans per block.

    The rows are a multiple of BT. So the per-block state is loaded once per ~256 rows.
    """
    span = BT * max(1, min(ROWS_PER_PROGRAM // BT, triton.cdiv(block_size, BT)))
    return span, triton.cdiv(block_size, span)


def _rope_args(rope: torch.Tensor | None, q: torch.Tensor) -> tuple:
    """The kernel arguments for ``rope``, which is ``stack((cos, sin))`` broadcast to ``[2, B, H, N, D]``.

    Broadcast dims have zero strides.
    """
    if rope is None:
        return (q, 0, 0, 0, 0, 0)
    return (rope, *rope.stride())


def _block_sums(k, v, rope, block_size, cfg):
    B, H, N, D = k.shape
    Dv = v.shape[-1]
    NB = N // block_size
    kv = torch.empty(B, H, NB, Dv, D, device=k.device, dtype=torch.float32)
    ksum = torch.empty(B, H, NB, D, device=k.device, dtype=torch.float32)
    _block_sums_kernel[(NB, B * H, triton.cdiv(Dv, cfg["BV"]))](
        k, *k.stride(), v, *v.stride(), *_rope_args(rope, k), kv, ksum,
        H, NB, D, Dv, block_size, ROPE=rope is not None, **cfg,
    )
    return kv, ksum


def _inclusive_states(k, v, rope, kv0, ksum0, block_size, cfg):
    """Per-block states ``S_c [B, H, NB, Dv, D]`` and ``z_c [B, H, NB, D]``. Each includes block ``c`` itself."""
    kv, ksum = _block_sums(k, v, rope, block_size, cfg)
    kv = torch.cumsum(kv, dim=2).add_(kv0.float().unsqueeze(2))
    ksum = torch.cumsum(ksum, dim=2).add_(ksum0.float().unsqueeze(2))
    return kv, ksum


def forward(q, k, v, rope, kv0, ksum0, block_size: int, eps: float):
    """Returns ``out [B, H, N, Dv]`` in q's dtype, and the final fp32 ``kv [B, H, Dv, D]`` and ``k_sum [B, H, D]``."""
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    NB = N // block_size
    cfgs = _configs(q, v, block_size)
    kv, ksum = _inclusive_states(k, v, rope, kv0, ksum0, block_size, cfgs["sums"])
    out = torch.empty(B, H, N, Dv, device=q.device, dtype=q.dtype)
    cfg = cfgs["output"]
    span, spans = _spans(block_size, cfg["BT"])
    _block_output_kernel[(NB * spans, B * H, triton.cdiv(Dv, cfg["BV"]))](
        q, *q.stride(), *_rope_args(rope, q), kv, ksum, out, *out.stride(),
        H, NB, D, Dv, block_size, spans, span, eps, ROPE=rope is not None, **cfg,
    )
    return out, kv[:, :, -1].clone(), ksum[:, :, -1].clone()


def backward(d_out, d_kv_final, d_ksum_final, q, k, v, rope, kv0, ksum0, block_size: int, eps: float):
    """Returns ``dq, dk, dv`` in the dtypes of q, k, v, and the fp32 gradients of the initial state."""
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    NB = N // block_size
    cfgs = _configs(q, v, block_size)
    kv, ksum = _inclusive_states(k, v, rope, kv0, ksum0, block_size, cfgs["sums"])

    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    g_kv = torch.empty_like(kv)
    g_ksum = torch.empty_like(ksum)
    _query_grad_kernel[(NB, B * H)](
        q, *q.stride(), *_rope_args(rope, q), kv, ksum, d_out, *d_out.stride(), dq, *dq.stride(),
        g_ksum, H, NB, D, Dv, block_size, eps, ROPE=rope is not None, **cfgs["query_grad"],
    )
    cfg = cfgs["query_state_grad"]
    _query_state_grad_kernel[(NB, B * H, triton.cdiv(Dv, cfg["BV"]))](
        q, *q.stride(), *_rope_args(rope, q), ksum, d_out, *d_out.stride(),
        g_kv, H, NB, D, Dv, block_size, eps, ROPE=rope is not None, **cfg,
    )
    # Keys of block c feed the states of blocks c..NB-1 and the returned final state.
    g_kv = torch.flip(torch.cumsum(torch.flip(g_kv, [2]), dim=2), [2]).add_(d_kv_final.float().unsqueeze(2))
    g_ksum = torch.flip(torch.cumsum(torch.flip(g_ksum, [2]), dim=2), [2]).add_(d_ksum_final.float().unsqueeze(2))

    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    cfg = cfgs["key_grad"]
    span, spans = _spans(block_size, cfg["BT"])
    _key_grad_kernel[(NB * spans, B * H)](
        k, *k.stride(), v, *v.stride(), *_rope_args(rope, k), g_kv, g_ksum,
        dk, *dk.stride(), dv, *dv.stride(), H, NB, D, Dv, block_size, spans, span, ROPE=rope is not None, **cfg,
    )
    return dq, dk, dv, g_kv[:, :, 0].clone(), g_ksum[:, :, 0].clone()
