"""CUDA graphs for the per-frame and per-step calls: one capture, then a replay per call on static buffers.

A :class:`GraphedStep` wraps ``fn(*inputs) -> output(s)``: on its first call on CUDA it runs ``fn`` a few times
on a side stream (first calls of kernels, allocator warm-up, a compiled function's compilation), captures one call
into a ``torch.cuda.CUDAGraph`` reading *static input buffers*, and from then on every call copies its inputs
into those buffers and replays the graph: one launch for the whole step, no Python, no allocation. The outputs
are the graph's own tensors, overwritten by the next call: use or copy them before calling again.

What a captured step must not do (the launch audit, :mod:`framegraph.stream.audit`, checks the first two on a
CPU): read a value back to the host (``.item()``, ``nonzero``...: capture fails), make its shapes or its Python
control flow depend on data, or read tensors it did not own at capture time (a state tensor rebound to a new one
after the capture is not seen by the replay: state must be updated in place, ``copy_``). Values that change from
call to call (a time step, the rotary table of a stream position, a prompt) must be inputs.

Warm-up calls run ``fn`` for real; a stateful step names its ``state`` tensors, which are saved before them and
put back after the capture, so capturing leaves the stream where it was (the capture itself executes nothing).

Off CUDA, or with ``enabled=False``, a :class:`GraphedStep` is ``fn`` itself (same call, same return value): the
code paths and their tests are the same on a CPU.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["GraphedStep"]


class GraphedStep:
    """``fn(*inputs)`` replayed from a CUDA graph (see the module docs).

    Args:
        fn: the step; its tensor arguments are copied into static buffers, its result (a tensor or a tuple /
            list of tensors) is returned as the graph's static outputs.
        enabled: capture (False: call ``fn`` directly). Only CUDA inputs are captured.
        state: tensors ``fn`` updates in place (a stream's state), restored after the warm-up calls.
        warmup: calls of ``fn`` before the capture.
        pool: a graph memory pool to share with the other graphs of one model
            (``torch.cuda.graph_pool_handle()``); None: its own.
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
        """Drop the graph (a new shape or new state storage): the next call captures again."""
        self.graph, self.inputs, self.output = None, [], None
