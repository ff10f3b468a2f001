"""Rotary position embedding in Triton: one pass, fp32 maths, output in ``x``'s dtype.

The convention is that of ``reference.py``: interleaved pairs, cos read at column 2i, sin at 2i+1. The
backward is the same kernel with the sine negated. That is the rotation's transpose.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(
    x_ptr, s_x0, s_x1, s_x2, s_x3,
    rope_ptr, s_rt, s_r0, s_r1, s_r2, s_r3,
    o_ptr,
    S1, S2, R, D,
    BR: tl.constexpr, BK: tl.constexpr, SIGN: tl.constexpr,
):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    row_mask = rows < R
    i0, i1, i2 = rows // (S1 * S2), (rows // S2) % S1, rows % S2
    x_row = x_ptr + i0 * s_x0 + i1 * s_x1 + i2 * s_x2
    r_row = rope_ptr + i0 * s_r0 + i1 * s_r1 + i2 * s_r2
    pairs = tl.arange(0, BK // 2)
    mask = row_mask[:, None] & (2 * pairs[None, :] < D)
    even, odd = 2 * pairs[None, :], 2 * pairs[None, :] + 1

    x_even = tl.load(x_row[:, None] + even * s_x3, mask=mask, other=0.0).to(tl.float32)
    x_odd = tl.load(x_row[:, None] + odd * s_x3, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(r_row[:, None] + even * s_r3, mask=mask, other=0.0).to(tl.float32)
    sin = SIGN * tl.load(r_row[:, None] + s_rt + odd * s_r3, mask=mask, other=0.0).to(tl.float32)

    o_row = o_ptr + rows[:, None] * D
    dtype = o_ptr.dtype.element_ty
    tl.store(o_row + even, (x_even * cos - x_odd * sin).to(dtype), mask=mask)
    tl.store(o_row + odd, (x_even * sin + x_odd * cos).to(dtype), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """Rotate ``x [A, S1, S2, D]``. ``cos`` and ``sin`` broadcast to it.

    ``transpose`` applies the inverse rotation.
    """
    table = torch.stack(torch.broadcast_tensors(cos, sin)).to(torch.float32).expand(2, *x.shape)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    A, S1, S2, D = x.shape
    R = A * S1 * S2
    BK = max(16, triton.next_power_of_2(D))
    BR = max(1, min(64, 4096 // BK))
    _rope_kernel[(triton.cdiv(R, BR),)](
        x, *x.stride(), table, *table.stride(), out, S1, S2, R, D,
        BR=BR, BK=BK, SIGN=-1.0 if transpose else 1.0,
    )
    return out
