"""Fixed capacities for data-sized work lists. A steady-state frame never waits for the device.

A renderer's work lists are sized by the data. Examples: the (Gaussian, tile) overlaps of a splatting frame.
Or the samples a ray marcher evaluates. Sizing a tensor by such a count reads the count back to the host. That
is a host sync: the CPU waits for the GPU's queue to drain. The usual way around it is used here. The list has
a **capacity** that persists across frames. Slots ``0 .. count - 1`` are filled. The rest are padding. Shapes
stay fixed and nothing is read. A :class:`Capacity` works in two phases.

- The warm-up frame reads the count once. That host sync is outside the steady state. The capacity becomes
  ``count * headroom``, rounded up to a multiple of ``quantum``.
- Later frames never read the current count. The device keeps the largest count since the last look. It is
  copied ``non_blocking`` into a host buffer, pinned on a GPU. The next frame looks once the copy has landed.
  A CUDA event tells; it is queried, never waited for. A copy still on its way is looked at a frame later.
  Its maximum still covers every frame before it.
- A frame that needed more than the capacity has **overflowed**. It dropped the entries beyond the capacity.
  The caller decides which. The capacity then grows to ``count * headroom``. :attr:`Capacity.overflows` counts
  it. So a frame needing over ``headroom`` times the warm-up count loses some work, once.

The look reads host memory through numpy, not a tensor. On a GPU it does not wait. The launch audit,
:mod:`framegraph.stream.audit`, does not count it.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["Capacity"]


class Capacity:
    """A size for a data-dependent count. It is read back once, then checked one frame late without a sync.

    Args:
        headroom: capacity = count x headroom when set or grown. Default 1.5.
        quantum: capacities are multiples of this, and at least this.

    Attributes:
        value: the current capacity. None before the first :meth:`size`.
        overflows: looks that found a frame needing more than its capacity.
        peak: the largest count seen so far. The warm-up read and the late checks set it.
    """

    def __init__(self, headroom: float = 1.5, quantum: int = 256):
        if not headroom >= 1.0 or quantum < 1:
            raise ValueError(f"Capacity: headroom must be >= 1 and quantum >= 1, got {headroom!r}, {quantum!r}")
        self.headroom, self.quantum = float(headroom), int(quantum)
        self.value: int | None = None
        self.overflows = 0
        self.peak = 0
        self._max: Tensor | None = None  # [1] int64 on the count's device: the largest count since the last look
        self._host: Tensor | None = None  # [1] int64, pinned on a GPU: _max, copied there
        self._seen = None  # numpy view of _host (reading it is not a tensor read)
        self._landed = None  # CUDA event recorded after the copy (None on a CPU: the copy is synchronous)
        self._pending = False

    def _fit(self, count: int) -> int:
        return max(self.quantum, math.ceil(count * self.headroom / self.quantum) * self.quantum)

    def size(self, count: Tensor, limit: int | None = None) -> int:
        """The capacity for this frame, whose list needs ``count`` entries. ``count`` is a 0-d integer tensor.

        The first call reads ``count``, a host sync. Later calls do not read ``count``. They grow the capacity
        when an earlier frame's count exceeded it. That count is already on the host. ``limit`` bounds any
        count, for example every Gaussian in every tile. The capacity never exceeds it.
        """
        if self.value is None:
            self.peak = int(count)  # the warm-up read
            self.value = self._fit(self.peak)
            self._host = torch.zeros(1, dtype=torch.int64, pin_memory=count.device.type == "cuda")
            self._seen = self._host.numpy()
        else:
            self._check_previous()
            self._record(count)
        return self.value if limit is None else min(self.value, max(int(limit), 0))

    def _check_previous(self) -> None:
        if not self._pending or (self._landed is not None and not self._landed.query()):
            return  # nothing recorded, or its copy has not landed yet: look at the next frame
        self._pending = False
        seen = int(self._seen[0])
        self._max.zero_()  # after every frame the look covered (in stream order): the next frames start afresh
        self.peak = max(self.peak, seen)
        if seen > self.value:
            self.overflows += 1
            self.value = self._fit(seen)

    def _record(self, count: Tensor) -> None:
        if self._max is None:
            self._max = torch.zeros(1, dtype=torch.int64, device=count.device)
        torch.maximum(self._max, count.detach().reshape(1).to(torch.int64), out=self._max)
        self._host.copy_(self._max, non_blocking=True)
        if count.device.type == "cuda":
            self._landed = torch.cuda.Event()
            self._landed.record()
        self._pending = True
