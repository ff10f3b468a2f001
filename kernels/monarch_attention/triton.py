"""Monarch attention in Triton, forward: the maths of ``reference.py`` with online softmaxes.

The notation is that of ``reference.py``. A query or key token is ``n = l * b + j``. That is row ``l`` of
``M = F * Hh`` frame rows and column ``j`` of ``b = Ww``. Neither factor is ever stored. Each kernel streams
one softmax. It keeps only its running max and sum and the fp32 weighted sums it needs. The kernels, each with
its program and loop::

    ``_row_step_kernel``      program = (key row k, tile of query columns j); loops over the row's columns i:
                              R[k, j, :] = softmax_i(scale * a_R[k, j] . k[k, i] / c_R[k, j]) and from it
                              a_L[j, k] = sum_i R k,   c_L[j, k] = sum_i R log R,   (last step) y[j, k] = sum_i R v
                              (and, for the backward's recomputation, lse_R[j, k] = logsumexp_i of R's logits)
    ``_column_lse_kernel``    program = (column j, tile of query rows l); loops over key rows k:
                              lse_L[j, l] = logsumexp_k(scale * q[l, j] . a_L[j, k] - c_L[j, k])   (causal: k's
                              frame <= l's frame), and on the last step also out[l, j] = sum_k L[j, k, l] y[j, k]
    ``_column_sum_kernel``    program = (column j, tile of key rows k); loops over query rows l with the lse above:
                              a_R[k, j] = sum_l L[j, k, l] q[l, j],   c_R[k, j] = sum_l L[j, k, l]
                              (causal: only the l in k's own frame)

``L`` is normalised over ``k`` but summed over ``l``. Hence the separate log-sum-exp pass. Iteration 1 starts
from ``L = I``, so ``a_R = q`` and ``c_R = 1``. Work per step is ``O(N (M + b) D)``. Extra memory is
``O(N D)``, for ``a_L``, ``a_R`` and ``y``. It is never ``N x N``. Inputs in fp32 use ``input_precision="ieee"``.
Inputs in fp16/bf16 are read into fp32 and multiplied with tf32. Head dims go up to 128. They are padded to
powers of two >= 16.

The backward lives in ``triton_backward.py``. For it :func:`forward` also returns what it cannot cheaply
recompute, like flash-attention's log-sum-exp. That is every iteration's ``lse_L``, ``N`` floats per head and
iteration. It is also the R-step inputs ``a_R``, ``c_R`` of iterations 2..T. Iteration 1's are ``q`` and 1.

Layouts: "token-indexed" tensors are ``[B*H, N, ...]`` with ``n = k * b + j``, like q. "Column-major"
per-block statistics are ``[B*H, b, M, ...]``, indexed ``[j, k]``. Each column is one contiguous run of ``M``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import device_capability
from ..tiles import head, load_tile, store_tile

MAX_HEAD_DIM = 128
MAX_TILE = 64  # rows / columns per tile (32 for head dims > 64); the tests lower it to 16 to exercise multi-tile loops
BACKWARD_MAX_TILE = 32  # rows / columns per tile of the backward: its kernels hold more live tiles; 64 spills
C_MIN = tl.constexpr(1e-20)  # as reference.C_MIN


@triton.jit
def _program_tile(extent, BLOCK: tl.constexpr):
    """What this program works on, on a grid ``(blocks * cdiv(extent, BLOCK), B * H)``.

    It returns its block, a key row or a column. Then its tile's first index. Then the tile's ``BLOCK``
    indices along ``extent`` and their in-range mask. Last comes its batch and head ``bh``.
    """
    pid = tl.program_id(0)
    tiles = tl.cdiv(extent, BLOCK)
    first = (pid % tiles) * BLOCK
    idx = first + tl.arange(0, BLOCK)
    return pid // tiles, first, idx, idx < extent, tl.program_id(1)


@triton.jit
def _r_scale(c_ptr, bh, M, NB, row, js, j_mask, SCALE: tl.constexpr, HAS_C: tl.constexpr, BJ: tl.constexpr):
    """``c_R[k, j]`` of key row ``k = row``, columns ``js``, and the R softmax's logit scale ``SCALE / c_R``.

    In iteration 1, without ``HAS_C``, ``c_R = 1`` and the scale is ``SCALE``.
    """
    if HAS_C:
        c = tl.load(c_ptr + bh * M * NB + row * NB + js, mask=j_mask, other=1.0)
        coef = SCALE / tl.maximum(c, C_MIN)
    else:
        c = tl.full((BJ,), 1.0, tl.float32)
        coef = tl.zeros((BJ,), dtype=tl.float32) + SCALE
    return c, coef


@triton.jit
def _row_program(a_ptr, s_ab, s_ah, s_an, s_ad, c_ptr, k_ptr, s_kb, s_kh, v_ptr, s_vb, s_vh, H, M, NB, D,
                 SCALE: tl.constexpr, BJ: tl.constexpr, BD: tl.constexpr, HAS_C: tl.constexpr):
    """Set-up of an R-step program, for the forward and for the backward's recomputation.

    It returns key row ``k``, its query columns ``js`` with mask ``j_mask``, and ``bh``. Then the ``a_R``
    tile ``[BJ, BD]``, ``c_R`` and the logit scale, as :func:`_r_scale` gives them. Last come the k and v
    pointers moved to this batch and head.
    """
    row, _, js, j_mask, bh = _program_tile(NB, BJ)
    a = load_tile(head(a_ptr, bh, H, s_ab, s_ah), s_an, s_ad, row * NB + js, j_mask, D, BD)  # [BJ, BD]
    c, coef = _r_scale(c_ptr, bh, M, NB, row, js, j_mask, SCALE, HAS_C, BJ)
    return row, js, j_mask, bh, a, c, coef, head(k_ptr, bh, H, s_kb, s_kh), head(v_ptr, bh, H, s_vb, s_vh)


@triton.jit
def _frame(rows, ROWS_PER_FRAME):
    return rows // ROWS_PER_FRAME


@triton.jit
def _frames_end(end, M, ROWS_PER_FRAME):
    """First row after the frame of row ``end - 1``, capped at ``M``.

    Block-causal rows ``[0, end)`` see the rows up to there.
    """
    return tl.minimum(M, (_frame(tl.minimum(end, M) - 1, ROWS_PER_FRAME) + 1) * ROWS_PER_FRAME)


@triton.jit
def _row_step_kernel(
    a_ptr, s_ab, s_ah, s_an, s_ad,  # a_R, token-indexed like q ([B, H, N, D]; n = k * b + j)
    c_ptr,  # c_R [B*H, N] fp32 (unused when HAS_C is false: c_R = 1)
    k_ptr, s_kb, s_kh, s_kn, s_kd,
    v_ptr, s_vb, s_vh, s_vn, s_vd,
    al_ptr, cl_ptr, y_ptr,  # outputs: a_L [B*H, b, M, D], c_L [B*H, b, M], y [B*H, b, M, Dv] (fp32, contiguous)
    lser_ptr,  # optional output (None: not stored): lse_R [B*H, b, M], the log-normaliser of R[k, j, :]
    H, M, NB, D, Dv,
    SCALE: tl.constexpr, BJ: tl.constexpr, BI: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
    HAS_C: tl.constexpr, WITH_V: tl.constexpr, PRECISION: tl.constexpr,
):
    row, js, j_mask, bh, a, _, coef, k_ptr, v_ptr = _row_program(  # key row k, tile of query columns j
        a_ptr, s_ab, s_ah, s_an, s_ad, c_ptr, k_ptr, s_kb, s_kh, v_ptr, s_vb, s_vh, H, M, NB, D, SCALE, BJ, BD, HAS_C)

    m_i = tl.full((BJ,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BJ,), dtype=tl.float32)
    ps_i = tl.zeros((BJ,), dtype=tl.float32)  # sum of p * logit (for the entropy term)
    acc_k = tl.zeros((BJ, BD), dtype=tl.float32)
    acc_v = tl.zeros((BJ, BV), dtype=tl.float32)
    for start in range(0, NB, BI):
        cols = start + tl.arange(0, BI)
        i_mask = cols < NB
        keys = load_tile(k_ptr, s_kn, s_kd, row * NB + cols, i_mask, D, BD)  # [BI, BD]
        s = tl.dot(a, tl.trans(keys), input_precision=PRECISION) * coef[:, None]  # [BJ, BI]
        s = tl.where(i_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        ps_i = ps_i * alpha + tl.sum(p * tl.where(i_mask[None, :], s, 0.0), axis=1)
        acc_k = acc_k * alpha[:, None] + tl.dot(p, keys, input_precision=PRECISION)
        if WITH_V:
            vals = load_tile(v_ptr, s_vn, s_vd, row * NB + cols, i_mask, Dv, BV)
            acc_v = acc_v * alpha[:, None] + tl.dot(p, vals, input_precision=PRECISION)
        m_i = m_new

    # a_L[j, k], c_L[j, k], y[j, k]: rows j of stride M * width, column k
    out_rows = bh * NB + js  # index into [B*H*b]
    store_tile(al_ptr + row * D, M * D, 1, out_rows, j_mask, D, acc_k / l_i[:, None], BD)
    lse_r = m_i + tl.log(l_i)
    tl.store(cl_ptr + out_rows * M + row, ps_i / l_i - lse_r, mask=j_mask)
    if lser_ptr is not None:
        tl.store(lser_ptr + out_rows * M + row, lse_r, mask=j_mask)
    if WITH_V:
        store_tile(y_ptr + row * Dv, M * Dv, 1, out_rows, j_mask, Dv, acc_v / l_i[:, None], BV)


@triton.jit
def _column_lse_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    al_ptr, cl_ptr, y_ptr,  # a_L [B*H, b, M, D], c_L [B*H, b, M], y [B*H, b, M, Dv]
    lse_ptr,  # output: lse_L [B*H, b, M] fp32
    o_ptr, s_ob, s_oh, s_on, s_od,  # out [B, H, N, Dv] (when OUTPUT)
    H, M, NB, D, Dv, ROWS_PER_FRAME,
    SCALE: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
    CAUSAL: tl.constexpr, OUTPUT: tl.constexpr, PRECISION: tl.constexpr,
):
    col, first, ls, l_mask, bh = _program_tile(M, BL)  # column j, tile of query rows l
    q_ptr = head(q_ptr, bh, H, s_qb, s_qh)
    o_ptr = head(o_ptr, bh, H, s_ob, s_oh)
    al_ptr += (bh * NB + col) * M * D
    cl_ptr += (bh * NB + col) * M
    y_ptr += (bh * NB + col) * M * Dv

    qs = load_tile(q_ptr, s_qn, s_qd, ls * NB + col, l_mask, D, BD)  # [BL, BD]
    k_end = M
    if CAUSAL:  # key rows up to the end of the last query row's frame
        k_end = _frames_end(first + BL, M, ROWS_PER_FRAME)

    m_i = tl.full((BL,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BL,), dtype=tl.float32)
    acc = tl.zeros((BL, BV), dtype=tl.float32)
    for start in range(0, k_end, BK):
        ks = start + tl.arange(0, BK)
        k_mask = ks < k_end
        a_l = load_tile(al_ptr, D, 1, ks, k_mask, D, BD)  # [BK, BD]
        c_l = tl.load(cl_ptr + ks, mask=k_mask, other=0.0)
        s = tl.dot(qs, tl.trans(a_l), input_precision=PRECISION) * SCALE - c_l[None, :]  # [BL, BK]
        ok = k_mask[None, :]
        if CAUSAL:
            ok = ok & (_frame(ks[None, :], ROWS_PER_FRAME) <= _frame(ls[:, None], ROWS_PER_FRAME))
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if OUTPUT:
            y = load_tile(y_ptr, Dv, 1, ks, k_mask, Dv, BV)
            acc = acc * alpha[:, None] + tl.dot(p, y, input_precision=PRECISION)
        m_i = m_new

    tl.store(lse_ptr + (bh * NB + col) * M + ls, m_i + tl.log(l_i), mask=l_mask)
    if OUTPUT:
        store_tile(o_ptr, s_on, s_od, ls * NB + col, l_mask, Dv, acc / l_i[:, None], BV)


@triton.jit
def _column_sum_kernel(
    q_ptr, s_qb, s_qh, s_qn, s_qd,
    al_ptr, cl_ptr, lse_ptr,  # a_L [B*H, b, M, D], c_L and lse [B*H, b, M]
    ar_ptr, cr_ptr,  # outputs: a_R [B*H, N, D] (token-indexed, n = k * b + j), c_R [B*H, N] (fp32)
    H, M, NB, D, ROWS_PER_FRAME,
    SCALE: tl.constexpr, BK: tl.constexpr, BL: tl.constexpr, BD: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    col, first, ks, k_mask, bh = _program_tile(M, BK)  # column j, tile of key rows k
    q_ptr = head(q_ptr, bh, H, s_qb, s_qh)
    al_ptr += (bh * NB + col) * M * D
    cl_ptr += (bh * NB + col) * M
    lse_ptr += (bh * NB + col) * M

    a_l = load_tile(al_ptr, D, 1, ks, k_mask, D, BD)  # [BK, BD]
    c_l = tl.load(cl_ptr + ks, mask=k_mask, other=0.0)
    l_start = 0
    l_end = M
    if CAUSAL:  # only the queries of each key row's own frame (see reference.py: no leak of later frames)
        l_start = _frame(first, ROWS_PER_FRAME) * ROWS_PER_FRAME
        l_end = _frames_end(first + BK, M, ROWS_PER_FRAME)

    acc = tl.zeros((BK, BD), dtype=tl.float32)
    c_sum = tl.zeros((BK,), dtype=tl.float32)
    for start in range(l_start, l_end, BL):
        ls = start + tl.arange(0, BL)
        l_mask = ls < l_end
        qs = load_tile(q_ptr, s_qn, s_qd, ls * NB + col, l_mask, D, BD)  # [BL, BD]
        lse = tl.load(lse_ptr + ls, mask=l_mask, other=0.0)
        s = tl.dot(a_l, tl.trans(qs), input_precision=PRECISION) * SCALE - c_l[:, None]  # [BK, BL]
        ok = l_mask[None, :]
        if CAUSAL:
            ok = ok & (_frame(ks[:, None], ROWS_PER_FRAME) == _frame(ls[None, :], ROWS_PER_FRAME))
        p = tl.where(ok, tl.exp(s - lse[None, :]), 0.0)  # L[j, k, l]
        acc += tl.dot(p, qs, input_precision=PRECISION)
        c_sum += tl.sum(p, axis=1)

    out_rows = ks * NB + col
    store_tile(ar_ptr + bh * M * NB * D, D, 1, out_rows, k_mask, D, acc, BD)
    tl.store(cr_ptr + bh * M * NB + out_rows, c_sum, mask=k_mask)


# ----------------------------------------------------------------------------- launchers


def _pow2(n: int, lo: int = 16, hi: int = 64) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def check_head_dims(D: int, Dv: int) -> None:
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(
            f"monarch_attention (triton): head dims D={D}, Dv={Dv}; the Triton kernels support up to "
            f"{MAX_HEAD_DIM}; use backend='torch'"
        )


def tiles(D: int, Dv: int, dtype: torch.dtype, grid: tuple[int, int, int], capability: int,
          backward: bool = False) -> dict:
    """Launch configuration on a GPU of compute ``capability``, such as 89 for sm_89.

    - ``BD``/``BV``: the head dims.
    - ``BJ``/``BI``: columns of a row, per program and per loop step of the R kernels.
    - ``BL``/``BK``: rows of a column, per program and per step of ``_column_lse_kernel``.
      ``_column_sum_kernel`` and the backward's key kernels swap the roles.
    - Then precision, warps and pipeline stages.

    Tiles are at most ``MAX_TILE``, and 32 for head dims > 64. Inputs in fp32 multiply with "ieee" FMA dots. They
    hold far more registers than tf32's tensor-core dots. With heads > 64 they spill at 32-wide loop steps. So
    the forward's steps are 16. In the backward everything is 16, with one pipeline stage. The backward's
    bf16/fp16 ``_row_key_grad_kernel`` spills with 32 columns per program. So ``BI`` is 16 there. The targets
    sm_89, sm_90 and sm_120 get the same tiles. None needs more than 99 KiB of shared memory. ``capability`` is
    accepted so that every launcher answers the same question.
    """
    del capability  # one configuration fits all three targets, as the docstring says
    frames, height, width = grid
    BD, BV = _pow2(D, hi=128), _pow2(Dv, hi=128)
    wide = max(BD, BV) > 64
    fp32 = dtype == torch.float32
    cap = min(MAX_TILE, BACKWARD_MAX_TILE if backward else MAX_TILE, 32 if wide else MAX_TILE)
    row_tile, column_tile = _pow2(width, hi=cap), _pow2(frames * height, hi=cap)
    cfg = dict(BD=BD, BV=BV, BJ=row_tile, BI=row_tile, BL=column_tile, BK=column_tile,
               PRECISION="ieee" if fp32 else "tf32", num_warps=8 if wide else 4, num_stages=3)
    if wide and fp32 and not backward:
        cfg.update(BI=min(row_tile, 16), BK=min(column_tile, 16))
    elif wide and fp32:
        cfg.update(BJ=min(row_tile, 16), BI=min(row_tile, 16), BL=min(column_tile, 16),
                   BK=min(column_tile, 16), num_stages=1)
    elif wide and backward:
        cfg.update(BI=min(row_tile, 16))
    return cfg


def row_step(a_src, c_src, k, v, a_l, c_l, y, lse_r, grid, cfg, *, first: bool, with_v: bool) -> None:
    """One R step for every key row. It writes ``a_L`` and ``c_L``.

    It also writes ``y`` if ``with_v``, and ``lse_R`` if that is not None. ``a_src`` ``[B, H, N, D]`` may have
    any strides. It is ``a_R``, or ``q`` on the ``first`` iteration. There ``c_R = 1`` and ``c_src`` is not
    read. Else ``c_src`` is ``c_R``, fp32 ``[B*H, N]``.
    """
    B, H, N, D = a_src.shape
    M, NB = grid[0] * grid[1], grid[2]
    _row_step_kernel[(M * triton.cdiv(NB, cfg["BJ"]), B * H)](
        a_src, *a_src.stride(), c_src, k, *k.stride(), v, *v.stride(), a_l, c_l, y, lse_r,
        H, M, NB, D, v.shape[-1],
        SCALE=D ** -0.5, BJ=cfg["BJ"], BI=cfg["BI"], BD=cfg["BD"], BV=cfg["BV"], HAS_C=not first,
        WITH_V=with_v, PRECISION=cfg["PRECISION"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: tuple[int, int, int], num_iters: int,
            block_causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Monarch attention of q, k ``[B, H, N, D]`` and v ``[B, H, N, Dv]``, of any strides.

    Returns ``out [B, H, N, Dv]`` in q's dtype. Also returns the statistics the backward reads. They are fp32
    and contiguous, with ``T = num_iters``:

    - ``lse_L [T, B, H, b, M]``: log-normaliser of each iteration's L softmax, indexed ``[j, l]``.
    - ``a_R [T-1, B, H, N, D]``, ``c_R [T-1, B, H, N]``: the R-step inputs of iterations 2..T, token-indexed.
    """
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    check_head_dims(D, Dv)
    frames, height, width = grid
    M, NB = frames * height, width
    cfg = tiles(D, Dv, q.dtype, grid, device_capability(q.device))
    BL, BK, BD, BV = cfg["BL"], cfg["BK"], cfg["BD"], cfg["BV"]
    common = dict(PRECISION=cfg["PRECISION"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                  CAUSAL=bool(block_causal))
    scale = D ** -0.5
    dev, f32 = q.device, torch.float32
    a_l = torch.empty(B * H, NB, M, D, device=dev, dtype=f32)
    c_l = torch.empty(B * H, NB, M, device=dev, dtype=f32)
    y = torch.empty(B * H, NB, M, Dv, device=dev, dtype=f32)
    lse_l = torch.empty(num_iters, B, H, NB, M, device=dev, dtype=f32)
    a_r = torch.empty(num_iters - 1, B, H, N, D, device=dev, dtype=f32)
    c_r = torch.empty(num_iters - 1, B, H, N, device=dev, dtype=f32)
    out = torch.empty(B, H, N, Dv, device=dev, dtype=q.dtype)

    for it in range(num_iters):
        last = it == num_iters - 1
        a_src, c_src = (q, c_l) if it == 0 else (a_r[it - 1], c_r[it - 1])  # iteration 1: L = I, a_R = q, c_R = 1
        row_step(a_src, c_src, k, v, a_l, c_l, y, None, grid, cfg, first=it == 0, with_v=last)
        _column_lse_kernel[(NB * triton.cdiv(M, BL), B * H)](
            q, *q.stride(), a_l, c_l, y, lse_l[it], out, *out.stride(),
            H, M, NB, D, Dv, height,
            SCALE=scale, BL=BL, BK=BK, BD=BD, BV=BV, OUTPUT=last, **common,
        )
        if not last:
            _column_sum_kernel[(NB * triton.cdiv(M, BK), B * H)](
                q, *q.stride(), a_l, c_l, lse_l[it], a_r[it], c_r[it],
                H, M, NB, D, height,
                SCALE=scale, BK=BK, BL=BL, BD=BD, **common,
            )
    return out, lse_l, a_r, c_r
