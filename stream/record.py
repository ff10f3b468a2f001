"""Stages at the two ends of a graph built from plain Python values. For tests, tools and small apps.

- :class:`IterableSource`: emits the items of an iterable on one port. Items are tensors, arrays or numbers.
- :class:`CountSource`: emits frames filled with their index 0, 1, 2, ... It stops after a given number or never.
- :class:`RecordingSink`: keeps a copy of every frame that reaches it, with its metadata.

They run in the graph like any other stage, with threads, rings, pacing and the flow limiter. They spare
writing a ``Stage`` subclass to feed known values in or to look at what came out.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from .frame import Flag, PortSpec
from .stage import EndOfStream, IndexedSource, Stage


class IterableSource(Stage):
    """Emits each item of ``items`` as one frame on port ``port``, described by ``spec``.

    The ``pts`` is the item's index at ``fps`` frames per second. An item is anything ``torch.as_tensor``
    takes with the spec's shape. A list, tensor or array plays again from its start when the graph is set up
    again. A one-shot iterator plays once.

    Args:
        items: the values, in order.
        spec: shape, dtype and device of one item.
        port: the output port's name.
        fps: the items' rate, for their pts.
        name: the stage name.
    """

    def __init__(self, items: Iterable, spec: PortSpec, *, port: str = "x", fps: float = 25.0,
                 name: str = "items"):
        super().__init__(name)
        self.items, self.spec, self.port, self.fps = items, spec, port, fps
        self.outputs = {port: spec}
        self._it: Iterator | None = None
        self.sent = 0

    def setup(self, ctx):
        super().setup(ctx)
        self._it, self.sent = iter(self.items), 0

    def process(self, inputs, out):
        item = next(self._it, StopIteration)
        if item is StopIteration:
            raise EndOfStream
        value = torch.as_tensor(item, dtype=self.spec.dtype)
        if tuple(value.shape) != tuple(self.spec.shape):
            raise ValueError(f"{self.name}: item {self.sent} has shape {list(value.shape)}, "
                             f"expected {list(self.spec.shape)}")
        frame = out.write(self.port)
        frame.data.copy_(value)
        frame.pts = self.ctx.clock.ticks_from_frame(self.sent, self.fps)
        self.sent += 1


class CountSource(IndexedSource):
    """Emits ``n`` frames on port ``"x"``. With ``n=None`` it runs until the graph stops.

    Frame ``i`` is filled with ``i``. Its ``pts`` is that of frame ``i`` at ``fps``. The count starts from 0
    again when the graph is set up again. The runtime's tests and benches feed their graphs with it.

    Args:
        n: frames to emit, or None for no end.
        fps: the frames' rate, for their pts.
        shape, dtype, device: of one frame's data.
        name: the stage name.
    """

    def __init__(self, n: int | None = 10, *, fps: float = 100, shape=(4,), name="src", dtype=torch.float32,
                 device="cpu"):
        super().__init__(name, fps=fps, n_frames=n)
        self.outputs = {"x": PortSpec(shape, dtype, device)}

    def emit(self, out):
        f = out.write("x")
        f.data.fill_(self.index)
        return f


@dataclass
class Recorded:
    """One frame as a :class:`RecordingSink` saw it. ``data`` is a CPU copy, safe to keep."""

    port: str
    data: torch.Tensor
    seq: int
    pts: int
    flags: Flag
    length: int


class RecordingSink(Stage):
    """Sink: keeps a :class:`Recorded` copy of every frame on each of its input ports, in arrival order.

    Args:
        ports: input port name → :class:`PortSpec`.
        name: the stage name.
        delay_s: sleep this long per call. It stands for a slow consumer.
    """

    def __init__(self, ports: dict[str, PortSpec], *, name: str = "record", delay_s: float = 0.0):
        super().__init__(name)
        self.inputs = dict(ports)
        self.delay_s = delay_s
        self.records: list[Recorded] = []

    def process(self, inputs, out):
        if self.delay_s:
            time.sleep(self.delay_s)
        for port, f in inputs.items():
            self.records.append(Recorded(port, f.data.detach().to("cpu", copy=True), f.seq, f.pts, f.flags, f.length))

    def of(self, port: str | None = None) -> list[Recorded]:
        """The records of one port. With ``port`` None, the sink must have exactly one port."""
        if port is None:
            if len(self.inputs) != 1:
                raise ValueError(f"{self.name} has ports {sorted(self.inputs)}: name one")
            (port,) = self.inputs
        return [r for r in self.records if r.port == port]

    def data(self, port: str | None = None) -> list[torch.Tensor]:
        """The copied payloads of one port, in order."""
        return [r.data for r in self.of(port)]

    def pts(self, port: str | None = None) -> list[int]:
        return [r.pts for r in self.of(port)]
