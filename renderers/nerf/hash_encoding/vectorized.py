"""Multiresolution hash encoding, vectorized over levels. It is the fast pure-torch path, CPU's default.

It has the same conventions and results as ``reference.py``. The tests hold the two to each other, values and
gradients. It computes them differently:

- It finds the cell, fractions and corner rows of **all levels at once**, on ``[N, L, ...]`` tensors. Per axis
  it forms the two vertex coordinates and their weights ``[N, L, 3, 2]``. For hashed levels the vertex
  coordinate is already multiplied by its prime and masked to uint32. Then it builds the 8 corners by
  broadcasting. That takes two adds for dense levels, or two xors for hashed ones, and two products over
  ``[N, L, 8]``.
- It does **one gather** of all ``N * L * 8`` corner rows, blended by their weights. That is
  :func:`torch.nn.functional.embedding_bag`, ``mode="sum"`` with ``per_sample_weights``. It reads the 8 rows of
  each (point, level) and sums them weighted. Its backward scatter-adds ``weight * grad`` into the table rows.
  There are no per-level ``[N, 8, F]`` intermediate tensors, as the reference builds.

The table size ``T`` is a power of two, so ``h mod T`` is ``h & (T - 1)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .reference import PRIMES, UINT32_MASK, HashGridConfig

# Constants per level, cached per (config, device): building them per call costs more than the math for small N.
_LEVEL_CACHE: dict = {}


def _level_constants(cfg: HashGridConfig, device: torch.device):
    key = (cfg, str(device))
    hit = _LEVEL_CACHE.get(key)
    if hit is None:
        dense = torch.tensor(cfg.dense, device=device)
        res = torch.tensor(cfg.resolutions, device=device)
        # per (level, axis): the multiplier of the vertex coordinate — dense strides 1, R+1, (R+1)^2, or primes
        stride = torch.stack([torch.ones_like(res), res + 1, (res + 1) ** 2], dim=-1)
        mult = torch.where(dense[:, None], stride, torch.tensor(PRIMES, device=device))
        offsets = torch.tensor(cfg.offsets[:-1], device=device, dtype=torch.int32)
        if cfg.n_entries >= 2 ** 31:
            raise ValueError(f"hash_encode: {cfg.n_entries} table rows do not fit int32 indices")
        n_dense = sum(cfg.dense)  # levels are sorted by resolution: the dense ones come first
        if cfg.dense != [True] * n_dense + [False] * (cfg.n_levels - n_dense):
            raise AssertionError(f"hash_encode: dense levels are not a prefix of {cfg.dense}")
        hit = (res, mult, offsets, n_dense)
        _LEVEL_CACHE[key] = hit
    return hit


def level_rows_and_weights(x01: Tensor, cfg: HashGridConfig) -> tuple[Tensor, Tensor]:
    """Table rows ``[N, L, 8]`` int32, offsets included, and trilinear weights ``[N, L, 8]`` of ``x01 [N, 3]``.

    Corner ``c = bx + 2 by + 4 bz``, as in :func:`reference.level_corners`.
    """
    res, mult, offsets, n_dense = _level_constants(cfg, x01.device)
    res = res.to(x01.dtype)
    pos = x01.detach().clamp(0.0, 1.0)[:, None, :] * res[None, :, None]  # [N, L, 3]
    lower = torch.minimum(pos.floor(), (res - 1)[None, :, None])  # x = 1 falls in the last cell, with frac = 1
    frac = pos - lower
    vert = lower.to(torch.int64)[..., None] + torch.arange(2, device=x01.device)  # [N, L, 3, 2]
    vert = vert * mult[None, :, :, None]
    w = torch.stack([1 - frac, frac], dim=-1)  # [N, L, 3, 2]

    def corners8(a: Tensor, combine) -> Tensor:  # [N, l, 3, 2] -> [N, l, 8], corner c = bx + 2 by + 4 bz
        z, y, x = a[:, :, 2, :, None, None], a[:, :, 1, None, :, None], a[:, :, 0, None, None, :]
        return combine(combine(z, y), x).flatten(-3)

    weight = corners8(w, torch.mul)
    parts = []
    if n_dense:
        parts.append(corners8(vert[:, :n_dense], torch.add))
    if n_dense < cfg.n_levels:
        # uint32 bit patterns held in int32 (the cast wraps): xor is the same, and T <= 2^30 keeps h & (T-1) >= 0
        hashed = corners8((vert[:, n_dense:] & UINT32_MASK).to(torch.int32), torch.bitwise_xor)
        parts.append(hashed & (cfg.table_size - 1))
    rows = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    rows = rows.to(torch.int32) + offsets[None, :, None]
    return rows, weight


def hash_encode(x01: Tensor, table: Tensor, cfg: HashGridConfig) -> Tensor:
    """Encode ``x01 [N, 3]``, in the unit cube, with ``table [n_entries, F]`` → ``[N, L * F]``.

    Like :func:`reference.hash_encode`. Differentiable w.r.t. ``table`` only."""
    if table.shape != (cfg.n_entries, cfg.n_features):
        raise ValueError(f"hash_encode: table has shape {list(table.shape)}; expected "
                         f"[{cfg.n_entries}, {cfg.n_features}] for {cfg}")
    N, L = x01.shape[0], cfg.n_levels
    rows, weight = level_rows_and_weights(x01, cfg)
    out = _BlendRows.apply(table, rows.reshape(N * L, 8), weight.reshape(N * L, 8).to(table.dtype))
    return out.reshape(N, L * cfg.n_features)


class _BlendRows(torch.autograd.Function):
    """``out[b] = sum_c weight[b, c] * table[rows[b, c]]`` for ``rows, weight [B, 8]`` → ``[B, F]``.

    Forward: :func:`F.embedding_bag`. Backward, for the table only: ``grad_table[r] += weight * grad_out``. It
    runs over every (b, c) with ``rows[b, c] = r``. It is one :func:`torch.bincount` over the flat
    ``row * F + f``. docs/renderers.md says why.
    """

    @staticmethod
    def forward(ctx, table, rows, weight):
        ctx.save_for_backward(rows, weight)
        ctx.table_shape = table.shape
        return F.embedding_bag(rows, table, per_sample_weights=weight, mode="sum")

    @staticmethod
    def backward(ctx, grad_out):
        rows, weight = ctx.saved_tensors
        E, nf = ctx.table_shape
        flat = (rows.to(torch.int64)[..., None] * nf + torch.arange(nf, device=rows.device)).reshape(-1)
        values = (weight[..., None] * grad_out[:, None, :]).reshape(-1)
        grad_table = torch.bincount(flat, values, minlength=E * nf).reshape(E, nf).to(grad_out.dtype)
        return grad_table, None, None
