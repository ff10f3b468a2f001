"""Multiresolution hash encoding, after Müller et al. 2022 and instant-ngp, in readable pure torch.

These conventions are shared with ``triton.py``. The tests hold the two to each other.

- Input points ``x [N, 3]`` are **normalised** to the unit cube ``[0, 1]^3``. The model maps its AABB there.
  Values outside are clamped.
- Level ``l`` has ``N_l = floor(N_min * b**l)`` cells per axis, for ``0 <= l < L``. The geometric growth factor
  is ``b = exp((ln N_max - ln N_min) / (L - 1))``, the paper's eq. 2-3. So ``N_0 = N_min`` and
  ``N_{L-1} = N_max``. Its vertices are the integer points ``0..N_l`` of ``x * N_l``. There are
  ``(N_l + 1)^3`` of them.
- A level whose vertices fit in the table is stored **densely**: ``(N_l + 1)^3 <= T``. It has one entry per
  vertex, index ``i + j (N_l+1) + k (N_l+1)^2``, and no collisions. Instant-ngp does this for its coarse
  levels. Finer levels are **hashed** into ``T`` entries. The spatial hash is
  ``(i * 1) xor (j * 2654435761) xor (k * 805459861)`` in uint32 arithmetic, modulo ``T``.
- All levels live in one table ``[sum_l size_l, F]``, with ``F`` features per entry. Level ``l`` starts at row
  ``offsets[l]``.
- Features of the 8 cell corners are blended trilinearly. The encoding is ``[N, L * F]``. Level ``l`` is in
  columns ``l*F .. l*F + F - 1``.

Unlike tiny-cuda-nn, we do not shift positions by half a cell. Nor do we use ``N_min * b**l - 1``. The grid here
is the one in the paper's text. That makes dense levels exact and easy to check.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

PRIMES = (1, 2654435761, 805459861)
UINT32_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class HashGridConfig:
    """Shape of a multiresolution hash grid.

    Attributes:
        n_levels: L, number of resolution levels. 16 in instant-ngp.
        n_features: F, features per level. Default 2.
        log2_table_size: T = 2**log2_table_size entries per hashed level. 19 in instant-ngp.
        base_resolution: N_min, cells per axis of the coarsest level. Default 16.
        finest_resolution: N_max, cells per axis of the finest level. 2048 for a unit-scale NeRF.
    """

    n_levels: int = 16
    n_features: int = 2
    log2_table_size: int = 19
    base_resolution: int = 16
    finest_resolution: int = 2048

    def __post_init__(self):
        if self.n_levels < 1:
            raise ValueError(f"HashGridConfig: n_levels must be >= 1, got {self.n_levels}")
        if self.n_features not in (1, 2, 4, 8):
            raise ValueError(f"HashGridConfig: n_features must be 1, 2, 4 or 8, got {self.n_features}")
        if not 4 <= self.log2_table_size <= 30:
            raise ValueError(f"HashGridConfig: log2_table_size must be in [4, 30], got {self.log2_table_size}")
        if not 1 <= self.base_resolution <= self.finest_resolution:
            raise ValueError(f"HashGridConfig: need 1 <= base_resolution <= finest_resolution, got "
                             f"{self.base_resolution} and {self.finest_resolution}")

    @property
    def table_size(self) -> int:
        return 1 << self.log2_table_size

    @property
    def growth_factor(self) -> float:
        """b: the ratio between the resolutions of consecutive levels."""
        if self.n_levels == 1:
            return 1.0
        return math.exp((math.log(self.finest_resolution) - math.log(self.base_resolution)) / (self.n_levels - 1))

    @property
    def resolutions(self) -> list[int]:
        """Cells per axis ``N_l`` of each level. The last one is exactly ``finest_resolution``."""
        b = self.growth_factor
        res = [int(math.floor(self.base_resolution * b ** l + 1e-6)) for l in range(self.n_levels)]
        res[-1] = self.finest_resolution if self.n_levels > 1 else self.base_resolution
        return res

    @property
    def dense(self) -> list[bool]:
        """Whether each level is stored densely, because all its vertices fit in the table."""
        return [(r + 1) ** 3 <= self.table_size for r in self.resolutions]

    @property
    def level_sizes(self) -> list[int]:
        """Table rows of each level: ``(N_l + 1)^3`` when dense, ``T`` when hashed."""
        return [(r + 1) ** 3 if d else self.table_size for r, d in zip(self.resolutions, self.dense)]

    @property
    def offsets(self) -> list[int]:
        """First row of each level in the shared table, plus the total row count at the end: ``[L + 1]``."""
        out = [0]
        for s in self.level_sizes:
            out.append(out[-1] + s)
        return out

    @property
    def n_entries(self) -> int:
        return self.offsets[-1]

    @property
    def n_output_dims(self) -> int:
        return self.n_levels * self.n_features

    def level_meta(self, device="cpu") -> Tensor:
        """``[L, 4]`` int64 rows ``(N_l, size_l, offset_l, dense_l)``. The kernels read them."""
        rows = [(r, s, o, int(d)) for r, s, o, d in zip(self.resolutions, self.level_sizes, self.offsets, self.dense)]
        return torch.tensor(rows, dtype=torch.int64, device=device)

    def to_dict(self) -> dict:
        return asdict(self)


def init_table(cfg: HashGridConfig, generator: torch.Generator | None = None, scale: float = 1e-4) -> Tensor:
    """A fresh table ``[n_entries, F]`` float32, uniform in ``[-scale, scale]``. That is instant-ngp's init."""
    t = torch.rand(cfg.n_entries, cfg.n_features, generator=generator, dtype=torch.float32)
    return (t * 2 - 1) * scale


def spatial_hash(i: Tensor, j: Tensor, k: Tensor, table_size: int) -> Tensor:
    """``(i * 1 xor j * 2654435761 xor k * 805459861) mod 2^32 mod table_size`` on int64 tensors."""
    h = ((i * PRIMES[0]) & UINT32_MASK) ^ ((j * PRIMES[1]) & UINT32_MASK) ^ ((k * PRIMES[2]) & UINT32_MASK)
    return h % table_size


def level_corners(x01: Tensor, resolution: int, size: int, dense: bool):
    """Corner rows within the level, and trilinear weights, for points ``x01 [N, 3]`` in ``[0, 1]^3``.

    Returns ``index [N, 8]`` int64 and ``weight [N, 8]``, of the same dtype as ``x01``. Corner ``c`` is
    ``bx + 2 by + 4 bz``. It takes the upper vertex along axis ``d`` when bit ``d`` of ``c`` is set. Its weight
    is the product over axes of ``frac`` for upper, ``1 - frac`` for lower. So the 8 weights sum to 1. Per axis
    we form the two vertex coordinates and weights ``[N, 3, 2]``. Then we combine them by broadcasting
    ``z × y × x`` into the 8 corners.
    """
    pos = x01.clamp(0.0, 1.0) * resolution
    lower = pos.floor().clamp(max=resolution - 1)  # x = 1 falls in the last cell, with frac = 1
    frac = pos - lower
    vert = lower.to(torch.int64)[:, :, None] + torch.arange(2, device=x01.device)  # [N, 3, 2]: lower, upper
    w = torch.stack([1 - frac, frac], dim=-1)  # [N, 3, 2]

    def corners8(a: Tensor, combine) -> Tensor:  # [N, 3, 2] -> [N, 8] in corner order c = bx + 2 by + 4 bz
        return combine(combine(a[:, 2, :, None, None], a[:, 1, None, :, None]), a[:, 0, None, None, :]).reshape(-1, 8)

    weight = corners8(w, torch.mul)
    if dense:
        stride = torch.tensor([1, resolution + 1, (resolution + 1) ** 2], device=x01.device)
        index = corners8(vert * stride[:, None], torch.add)
    else:
        primes = torch.tensor(PRIMES, device=x01.device)
        index = corners8((vert * primes[:, None]) & UINT32_MASK, torch.bitwise_xor) % size
    return index, weight


def hash_encode(x01: Tensor, table: Tensor, cfg: HashGridConfig) -> Tensor:
    """Encode ``x01 [N, 3]``, in the unit cube, with ``table [n_entries, F]`` → ``[N, L * F]``.

    Differentiable w.r.t. ``table`` by plain autograd. Gradients scatter-add into the corners' rows. No gradient
    flows to ``x01``.
    """
    if table.shape != (cfg.n_entries, cfg.n_features):
        raise ValueError(f"hash_encode: table has shape {list(table.shape)}; expected "
                         f"[{cfg.n_entries}, {cfg.n_features}] for {cfg}")
    x01 = x01.detach()
    feats = []
    for res, size, offset, dense in zip(cfg.resolutions, cfg.level_sizes, cfg.offsets, cfg.dense):
        index, weight = level_corners(x01, res, size, dense)
        corner_feats = table[offset + index]  # [N, 8, F]
        feats.append((weight.to(table.dtype)[..., None] * corner_feats).sum(dim=1))  # [N, F]
    return torch.cat(feats, dim=-1)
