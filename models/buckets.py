"""A batched engine on the compiled runtime: each batch padded to a bucket, one compiled call per bucket.

A lane's batch of ``n`` rows runs as the smallest bucket ``b >= n`` of :data:`~framegraph.stream.batching.BUCKETS`.
Its inputs are the rows, then ``b - n`` copies of the last row. The outputs are the first ``n`` rows, copied.
Inductor compiles each bucket once, with static shapes, so a batch size that moves never compiles again. On CUDA
each bucket's call is replayed from its own CUDA graph (:class:`~.graphs.GraphedStep`). The lane's warm-up
(:meth:`~framegraph.stream.batching.Lane.warm`, which runs every bucket) compiles and captures them all before
the first session streams.

The engine must treat rows independently: a row's output may not depend on another row. So the padded rows change
nothing in the real ones.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from framegraph.stream.batching import BUCKETS

from .compile import CompileSettings, compiled
from .graphs import GraphedStep

__all__ = ["BucketedStep"]


class BucketedStep:
    """``fn`` on batches of any size up to the largest bucket, run at the bucket's size. See the module docs.

    Args:
        fn: the batched engine, ``[B, ...]`` tensors in, a tensor or a tuple of ``[B, ...]`` tensors out.
        device: where it runs. CUDA graphs only there.
        settings: the compiled runtime's; ``settings.inductor`` False runs ``fn`` uncompiled at the bucket sizes.
        buckets: the batch sizes it runs at.
    """

    def __init__(self, fn: Callable, *, device, settings: CompileSettings = CompileSettings(),
                 buckets: Sequence[int] = BUCKETS, name: str = "batch"):
        self.fn, self.buckets, self.name = compiled(fn, settings), sorted(buckets), name
        self.graphs = settings.graphs(device)
        self.steps: dict[int, GraphedStep] = {}

    def bucket(self, n: int) -> int:
        """The smallest bucket of ``n`` rows; a ValueError past the largest."""
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"{self.name}: a batch of {n} rows; the largest bucket is {self.buckets[-1]} (the lane's "
                         f"max_batch must not be larger)")

    def __call__(self, *inputs: torch.Tensor):
        n = inputs[0].shape[0]
        b = self.bucket(n)
        if b > n:
            inputs = tuple(torch.cat([x, x[-1:].expand(b - n, *x.shape[1:])]) for x in inputs)
        step = self.steps.get(b)
        if step is None:
            step = self.steps[b] = GraphedStep(self.fn, enabled=self.graphs, name=f"{self.name} bucket {b}")
        out = step(*inputs)
        if isinstance(out, torch.Tensor):
            return out[:n].clone()  # a graph's outputs are its own: the next replay overwrites them
        return tuple(o[:n].clone() for o in out)
