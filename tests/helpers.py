"""Small stages the runtime tests build graphs from."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from framegraph.stream import EndOfStream, PortSpec, Stage

REPO = Path(__file__).resolve().parents[1]  # the checkout
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where kernel tests run (Triton's interpreter on CPU)


class CountSource(Stage):
    """Emits ``n`` frames (``data`` filled with the frame index) at ``fps`` pts spacing; n=None: forever."""

    def __init__(self, n: int | None = 10, *, fps: float = 100, shape=(4,), name="src", dtype=torch.float32,
                 device="cpu"):
        super().__init__(name)
        self.n, self.fps = n, fps
        self.outputs = {"x": PortSpec(shape, dtype, device)}
        self.i = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.i = 0

    def process(self, inputs, out):
        if self.n is not None and self.i >= self.n:
            raise EndOfStream
        f = out.write("x")
        f.data.fill_(self.i)
        f.pts = self.ctx.clock.ticks_from_frame(self.i, self.fps)
        self.i += 1


class AddOne(Stage):
    def __init__(self, name="add", shape=(4,), delay_s: float = 0.0):
        super().__init__(name)
        self.inputs = {"x": PortSpec(shape)}
        self.outputs = {"x": PortSpec(shape)}
        self.delay_s = delay_s
        self.resets = 0

    def process(self, inputs, out):
        if self.delay_s:
            time.sleep(self.delay_s)  # stands for heavy compute
        f = out.write("x")
        torch.add(inputs["x"].data, 1, out=f.data)

    def reset(self):
        self.resets += 1


class Collect(Stage):
    """Sink: records (value, seq, pts, flags) of each frame; optional per-frame delay (a slow consumer)."""

    def __init__(self, name="sink", shape=(4,), delay_s: float = 0.0, ports=("x",)):
        super().__init__(name)
        self.inputs = {p: PortSpec(shape) for p in ports}
        self.delay_s = delay_s
        self.got: list[tuple] = []
        self.torn_down = 0
        self.set_up = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.set_up += 1

    def process(self, inputs, out):
        if self.delay_s:
            time.sleep(self.delay_s)
        for port, f in inputs.items():
            self.got.append((port, float(f.data[0]), f.seq, f.pts, f.flags))

    def teardown(self):
        self.torn_down += 1

    def values(self, port="x"):
        return [v for p, v, *_ in self.got if p == port]


class CollectFrames(Stage):
    """Sink of one port: keeps ``(pts, data copy)`` of every frame in ``got``."""

    def __init__(self, port: str, shape, dtype=torch.float32, name: str = "collect"):
        super().__init__(name)
        self.port = port
        self.inputs = {port: PortSpec(tuple(shape), dtype)}
        self.got: list[tuple[int, torch.Tensor]] = []

    def process(self, inputs, out):
        f = inputs[self.port]
        self.got.append((f.pts, f.data.clone()))


class Boom(Stage):
    """Raises on frame ``at``."""

    def __init__(self, at: int = 3, name="boom", shape=(4,)):
        super().__init__(name)
        self.inputs = {"x": PortSpec(shape)}
        self.outputs = {"x": PortSpec(shape)}
        self.at, self.seen = at, 0

    def process(self, inputs, out):
        self.seen += 1
        if self.seen > self.at:
            raise RuntimeError(f"kaboom at frame {self.seen}")
        out.write("x").data.copy_(inputs["x"].data)


def framegraph_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("framegraph:")]
