"""Fixed capacities for data-sized work lists, so that a steady-state frame never waits for the device.

A renderer's work lists are sized by the data: the (Gaussian, tile) overlaps of a splatting frame, the
samples a ray marcher evaluates. Sizing a tensor by such a count means reading the count back to the host
(a host sync: the CPU waits for the GPU's queue to drain). The usual way around it, used here: give the
list a **capacity** that persists across frames, fill slots ``0 .. count - 1`` and mark the rest as padding
(fixed shapes, no read). A :class:`Capacity`

- on its first use (the warm-up frame) reads the count once (one host sync, outside the steady state) and
  sets the capacity to ``count * headroom``, rounded up to a multiple of ``quantum``;
- afterwards never reads the current count: it keeps, on the device, the largest count of the frames since its
  last look, copies that ``non_blocking`` into a host buffer (pinned on a GPU) and, at the next frame, looks at
  what is there once the copy has landed (a CUDA event that is queried, never waited for; a copy still on its
  way is looked at a frame later, and the maximum it carries still holds every frame before it). If a frame
  needed more than the capacity, it **overflowed**: it dropped the entries beyond the capacity (which ones: see
  the caller), the capacity grows to ``count * headroom`` and :attr:`Capacity.overflows` counts it. A frame that
  needs more than ``headroom`` times the warm-up count is therefore drawn with some work missing, once.

The look at the host buffer is a read of host memory (numpy), not of a tensor: on a GPU it does not wait,
and the launch audit (:mod:`framegraph.stream.audit`) does not count it.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["Capacity"]


class Capacity:
    """A size for a data-dependent count that is read back once, then checked one frame late without a sync.

    Args:
        headroom: capacity = count x headroom when set or grown (1.5).
        quantum: capacities are multiples of this (and at least this).

    Attributes:
        value: the current capacity (None before the first :meth:`size`).
        overflows: looks that found a frame (or frames) needing more than the capacity they were given.
        peak: the largest count seen so far (the warm-up read, then the late checks).
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
        """The capacity for this frame, whose list needs ``count`` (0-d integer tensor) entries.

        First call: reads ``count`` (a host sync). Later calls: no read of ``count``; grows the capacity if the
        previous frame's count (now on the host) exceeded it. ``limit``: an upper bound on any count (for
        example every Gaussian in every tile), the capacity never exceeds it.
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
