"""Occupancy grid for empty-space skipping, as in instant-ngp §4 and appendix E.2. nerfacc does it too.

The AABB is split into ``R^3`` cells, 128³ by default. Each cell keeps an exponential moving maximum of the
**step opacity** ``1 - exp(-sigma * step_size)``. It is sampled at random points inside the cell. A cell is
occupied when that value exceeds ``min(threshold, mean over cells)``. Threshold 0.01 means "1 % of the light
stops in one step". The ray marcher never evaluates the network at samples in unoccupied cells.

Cell ``(i, j, k)``, in x, y, z order, covers ``aabb_min + [i, i+1) * cell_size``. The flat index is
``i * R^2 + j * R + k``. ``bits`` is a bool tensor ``[R, R, R]``. :meth:`packed_bits` packs it 8 cells per
byte for saving, in little-endian bit order.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


class OccupancyGrid:
    """Occupancy of ``resolution^3`` cells over ``aabb``.

    Args:
        aabb: ``(xmin, ymin, zmin, xmax, ymax, zmax)``.
        resolution: cells per axis.
        threshold: step opacity above which a cell is occupied.
        decay: EMA decay applied to every cell at each update. Default 0.95.
        device: where the grid lives.

    Attributes:
        opacity: ``[R, R, R]`` float32, the running step opacity of each cell. It starts at 0, nothing measured
            yet. The first update fills it.
        bits: ``[R, R, R]`` bool, the occupancy used for skipping. It starts all occupied.
    """

    def __init__(self, aabb: Sequence[float], resolution: int = 128, *, threshold: float = 0.01,
                 decay: float = 0.95, device="cpu"):
        if resolution < 1:
            raise ValueError(f"OccupancyGrid: resolution must be >= 1, got {resolution}")
        self.aabb = torch.as_tensor(aabb, dtype=torch.float32, device=device).reshape(6)
        self.resolution, self.threshold, self.decay = resolution, threshold, decay
        R = resolution
        self.opacity = torch.zeros((R, R, R), dtype=torch.float32, device=device)
        self.bits = torch.ones((R, R, R), dtype=torch.bool, device=device)
        self.updates = 0

    @property
    def device(self) -> torch.device:
        return self.bits.device

    def to(self, device) -> OccupancyGrid:
        g = OccupancyGrid(self.aabb.tolist(), self.resolution, threshold=self.threshold, decay=self.decay,
                          device=device)
        g.opacity, g.bits, g.updates = self.opacity.to(device), self.bits.to(device), self.updates
        return g

    @property
    def cell_size(self) -> Tensor:
        return (self.aabb[3:] - self.aabb[:3]) / self.resolution

    def cell_coords(self, points: Tensor) -> tuple[Tensor, Tensor]:
        """Integer cell coordinates ``[N, 3]``, int64 and clamped, and an inside-AABB mask ``[N]`` for ``points``."""
        u = (points - self.aabb[:3]) / self.cell_size
        inside = ((u >= 0) & (u <= self.resolution)).all(dim=-1)
        return u.floor().clamp(0, self.resolution - 1).to(torch.int64), inside

    def is_occupied(self, points: Tensor) -> Tensor:
        """``[N]`` bool: the points lie inside the AABB in an occupied cell."""
        c, inside = self.cell_coords(points)
        return self.bits[c[:, 0], c[:, 1], c[:, 2]] & inside

    def set_all(self, occupied: bool = True) -> None:
        self.opacity.fill_(1.0 if occupied else 0.0)
        self.bits.fill_(occupied)

    @torch.no_grad()
    def update(self, density_fn: Callable[[Tensor], Tensor], step_size: float, *, n_cells: int | None = None,
               generator: torch.Generator | None = None, chunk: int = 1 << 16) -> None:
        """One EMA update from ``density_fn(points [M, 3]) -> sigma [M]``.

        Every cell decays by ``decay``. Then ``n_cells`` cells take the max of their decayed value and a new
        sample. The sample is the step opacity at one uniformly random point inside the cell. With ``n_cells``
        None, all cells update. Otherwise half are drawn uniformly and half among the occupied ones. Instant-ngp
        does the same after its warm-up.
        """
        R3 = self.resolution ** 3
        dev = self.device
        if n_cells is None or n_cells >= R3:
            idx = torch.arange(R3, device=dev)
        else:
            uniform = torch.randint(0, R3, (n_cells // 2,), device=dev, generator=generator)
            occ = self.bits.reshape(-1).nonzero()[:, 0]
            if occ.numel():
                pick = torch.randint(0, occ.numel(), (n_cells - n_cells // 2,), device=dev, generator=generator)
                idx = torch.cat([uniform, occ[pick]])
            else:
                idx = uniform
        R = self.resolution
        ijk = torch.stack([idx // (R * R), (idx // R) % R, idx % R], dim=-1).float()
        jitter = torch.rand(ijk.shape, device=dev, generator=generator)
        points = self.aabb[:3] + (ijk + jitter) * self.cell_size
        sigma = torch.cat([density_fn(p).float() for p in points.split(chunk)]) if idx.numel() else points.new_zeros(0)
        step_opacity = 1 - torch.exp(-sigma * step_size)
        flat = self.opacity.reshape(-1)
        flat.mul_(self.decay)
        flat.scatter_reduce_(0, idx, step_opacity, reduce="amax")
        thresh = min(self.threshold, float(flat.mean()))
        self.bits = (self.opacity > thresh)
        self.updates += 1

    def packed_bits(self) -> Tensor:
        """``bits`` as ``uint8 [ceil(R^3 / 8)]``. Cell ``n`` is in bit ``n % 8`` of byte ``n // 8``."""
        flat = self.bits.reshape(-1).to(torch.uint8).cpu()
        pad = (-flat.numel()) % 8
        flat = torch.cat([flat, flat.new_zeros(pad)]).reshape(-1, 8)
        weights = (1 << torch.arange(8, dtype=torch.int32)).to(torch.uint8)
        return (flat.to(torch.int32) * weights.to(torch.int32)).sum(dim=1).to(torch.uint8)

    def load_packed_bits(self, packed: Tensor) -> None:
        """Inverse of :meth:`packed_bits`. The running opacity becomes 1 where occupied, 0 elsewhere."""
        R3 = self.resolution ** 3
        expected = (R3 + 7) // 8
        if packed.dtype != torch.uint8 or packed.shape != (expected,):
            raise ValueError(f"occupancy bits: expected uint8 [{expected}] for a {self.resolution}^3 grid, "
                             f"got {packed.dtype} {list(packed.shape)}")
        bits = (packed.to(torch.int32)[:, None] >> torch.arange(8, dtype=torch.int32)) & 1
        self.bits = bits.reshape(-1)[:R3].bool().reshape(self.bits.shape).to(self.device)
        self.opacity = self.bits.float()

    @property
    def occupied_fraction(self) -> float:
        return float(self.bits.float().mean())
