"""CUDA graphs for the per-frame and per-step calls: one capture, then a replay per call on static buffers.

A :class:`GraphedStep` wraps ``fn(*inputs) -> output(s)``.
On its first call on CUDA it runs ``fn`` a few times on a side stream.
These calls cover first kernel launches, allocator warm-up and a compiled function's compilation.
Then it captures one call into a ``torch.cuda.CUDAGraph`` that reads *static input buffers*.
From then on every call copies its inputs into those buffers and replays the graph.
That is one launch for the whole step, with no Python and no allocation.
The outputs are the graph's own tensors, overwritten by the next call.
Use or copy them before calling again.

What a captured step must not do:

- read a value back to the host, such as ``.item()`` or ``nonzero``. Capture then fails.
- make its shapes or its Python control flow depend on data.
- read tensors it did not own at capture time.
  A state tensor rebound to a new one after the capture is not seen by the replay.
  State must be updated in place, with ``copy_``.

The launch audit, :mod:`framegraph.stream.audit`, checks the first two on a CPU.
Values that change from call to call must be inputs.
Examples are a time step, the rotary table of a stream position and a prompt.

Warm-up calls run ``fn`` for real.
A stateful step names its ``state`` tensors.
They are saved before the warm-up and put back after the capture.
So capturing leaves the stream where it was. The capture itself executes nothing.

Off CUDA, or with ``enabled=False``, a :class:`GraphedStep` is ``fn`` itself, with the same call and return value.
So the code paths and their tests are the same on a CPU.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["GraphedStep"]


class GraphedStep:
    """``fn(*inputs)`` replayed from a CUDA graph. See the module docs.

    Args:
        fn: the step. Its tensor arguments are copied into static buffers.
            Its result, a tensor or a tuple or list of tensors, is returned as the graph's static outputs.
        enabled: capture. False calls ``fn`` directly. Only CUDA inputs are captured.
        state: tensors ``fn`` updates in place, a stream's state. They are restored after the warm-up calls.
        warmup: calls of ``fn`` before the capture.
        pool: a graph memory pool to share with the other graphs of one model.
            Get one with ``torch.cuda.graph_pool_handle()``. None: its own.
        name: for errors.
    """

    def __init__(self, fn: Callable, *, enabled: bool = True, state: Sequence[torch.Tensor] = (), warmup: int = 2,
                 pool=None, name: str = "step"):
        self.fn, self.enabled, self.state = fn, enabled, list(state)
        self.warmup, self.pool, self.name = warmup, pool, name
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[torch.Tensor] = []
        self.output = None
        self.replays = 0

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, *inputs: torch.Tensor):
        if not self.enabled or not inputs or not inputs[0].is_cuda:
            return self.fn(*inputs)
        if self.graph is None:
            self._capture(inputs)
        for buf, x in zip(self.inputs, inputs):
            if buf.data_ptr() != x.data_ptr():
                buf.copy_(x, non_blocking=True)
        self.graph.replay()
        self.replays += 1
        return self.output

    def _capture(self, inputs: Sequence[torch.Tensor]) -> None:
        for x in inputs:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"GraphedStep {self.name}: every input must be a tensor, got a {type(x).__name__}")
        self.inputs = [x.detach().clone() for x in inputs]
        saved = [t.clone() for t in self.state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.output = self.fn(*self.inputs)
        for t, s in zip(self.state, saved):
            t.copy_(s)
        self.graph = graph

    def reset(self) -> None:
        """Drop the graph, for a new shape or new state storage. The next call captures again."""
        self.graph, self.inputs, self.output = None, [], None
