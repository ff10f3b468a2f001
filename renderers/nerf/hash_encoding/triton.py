"""Triton kernels for the multiresolution hash encoding, with the conventions of ``reference.py``.

One program runs per (block of ``BLOCK`` points, level). It computes the cell of each point at that level. Then,
for each of the 8 corners, it finds the row and the trilinear weight. The row is a dense index or a uint32
spatial hash. It accumulates ``weight * table[row]``, ``F`` features at once. The backward pass walks the same
corners. It scatter-adds ``weight * grad_out`` into the table gradient with atomics. Hash collisions and shared
corners make atomics necessary. There is no gradient w.r.t. the positions.

Kernels run on CUDA, or on CPU through Triton's interpreter. For that, set ``TRITON_INTERPRET=1`` before Triton
is first imported.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 128


@triton.jit
def _level_setup(x_ptr, meta_ptr, N, L: tl.constexpr, F: tl.constexpr, BLOCK: tl.constexpr):
    """This program's block of points and level.

    Returns the offsets ``[BLOCK, F]`` of its features in the ``[N, L * F]`` encoding, and the points' mask
    ``[BLOCK, 1]``. Also the level's constants, the lower cell corner, int64, and the fractions."""
    pid_n = tl.program_id(0)
    lvl = tl.program_id(1)
    res = tl.load(meta_ptr + lvl * 4 + 0)
    size = tl.load(meta_ptr + lvl * 4 + 1)
    offset = tl.load(meta_ptr + lvl * 4 + 2)
    dense = tl.load(meta_ptr + lvl * 4 + 3)
    rows = pid_n * BLOCK + tl.arange(0, BLOCK)
    mask = rows < N
    resf = res.to(tl.float32)
    px = tl.minimum(tl.maximum(tl.load(x_ptr + rows * 3 + 0, mask=mask, other=0.0), 0.0), 1.0) * resf
    py = tl.minimum(tl.maximum(tl.load(x_ptr + rows * 3 + 1, mask=mask, other=0.0), 0.0), 1.0) * resf
    pz = tl.minimum(tl.maximum(tl.load(x_ptr + rows * 3 + 2, mask=mask, other=0.0), 0.0), 1.0) * resf
    lx = tl.minimum(tl.floor(px), resf - 1.0)
    ly = tl.minimum(tl.floor(py), resf - 1.0)
    lz = tl.minimum(tl.floor(pz), resf - 1.0)
    out_offs = rows[:, None] * (L * F) + lvl * F + tl.arange(0, F)[None, :]
    return (out_offs, mask[:, None], res, size, offset, dense, lx.to(tl.int64), ly.to(tl.int64), lz.to(tl.int64),
            px - lx, py - ly, pz - lz)


@triton.jit
def _corner(c: tl.constexpr, F: tl.constexpr, res, size, offset, dense, ix, iy, iz, fx, fy, fz):
    """Offsets ``[BLOCK, F]`` of the table row, int64, of corner ``c``, and its trilinear weight ``[BLOCK, 1]``.

    Bit d of ``c`` set means the upper vertex along axis d."""
    bx = c & 1  # constexpr arithmetic: resolved at compile time
    by = (c >> 1) & 1
    bz = (c >> 2) & 1
    cx = ix + bx
    cy = iy + by
    cz = iz + bz
    wx = fx if bx == 1 else 1.0 - fx
    wy = fy if by == 1 else 1.0 - fy
    wz = fz if bz == 1 else 1.0 - fz
    stride = res + 1
    dense_row = cx + (cy + cz * stride) * stride
    h = (cx & 0xFFFFFFFF) ^ ((cy * 2654435761) & 0xFFFFFFFF) ^ ((cz * 805459861) & 0xFFFFFFFF)
    hashed_row = h % size
    row = tl.where(dense != 0, dense_row, hashed_row) + offset
    return row[:, None] * F + tl.arange(0, F)[None, :], (wx * wy * wz)[:, None]


@triton.jit
def _hash_encode_fwd_kernel(x_ptr, table_ptr, meta_ptr, out_ptr, N,
                            L: tl.constexpr, F: tl.constexpr, BLOCK: tl.constexpr):
    out_offs, mask, res, size, offset, dense, ix, iy, iz, fx, fy, fz = _level_setup(x_ptr, meta_ptr, N, L, F, BLOCK)
    acc = tl.zeros((BLOCK, F), dtype=tl.float32)
    for c in tl.static_range(8):
        entry, w = _corner(c, F, res, size, offset, dense, ix, iy, iz, fx, fy, fz)
        acc += w * tl.load(table_ptr + entry, mask=mask, other=0.0)
    tl.store(out_ptr + out_offs, acc, mask=mask)


@triton.jit
def _hash_encode_bwd_kernel(x_ptr, meta_ptr, grad_out_ptr, grad_table_ptr, N,
                            L: tl.constexpr, F: tl.constexpr, BLOCK: tl.constexpr):
    out_offs, mask, res, size, offset, dense, ix, iy, iz, fx, fy, fz = _level_setup(x_ptr, meta_ptr, N, L, F, BLOCK)
    g = tl.load(grad_out_ptr + out_offs, mask=mask, other=0.0)
    for c in tl.static_range(8):
        entry, w = _corner(c, F, res, size, offset, dense, ix, iy, iz, fx, fy, fz)
        tl.atomic_add(grad_table_ptr + entry, w * g, mask=mask)


def hash_encode_fwd(x01: Tensor, table: Tensor, meta: Tensor) -> Tensor:
    """``x01 [N, 3]`` float32, ``table [E, F]`` float32, ``meta [L, 4]`` int64 → ``[N, L * F]`` float32."""
    N, L, F = x01.shape[0], meta.shape[0], table.shape[1]
    out = torch.empty((N, L * F), device=x01.device, dtype=torch.float32)
    if N:
        _hash_encode_fwd_kernel[(triton.cdiv(N, BLOCK), L)](x01, table, meta, out, N, L=L, F=F, BLOCK=BLOCK)
    return out


def hash_encode_bwd(x01: Tensor, meta: Tensor, grad_out: Tensor, n_entries: int, n_features: int) -> Tensor:
    """Gradient w.r.t. the table ``[E, F]`` of :func:`hash_encode_fwd` for ``grad_out [N, L * F]``."""
    N, L = x01.shape[0], meta.shape[0]
    grad_table = torch.zeros((n_entries, n_features), device=x01.device, dtype=torch.float32)
    if N:
        _hash_encode_bwd_kernel[(triton.cdiv(N, BLOCK), L)](x01, meta, grad_out, grad_table, N,
                                                            L=L, F=n_features, BLOCK=BLOCK)
    return grad_table
