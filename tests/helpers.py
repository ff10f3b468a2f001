"""Small stages the runtime tests build graphs from, and the talking-video makers of the avatar tests."""
from __future__ import annotations

import threading
import time
import wave
from fractions import Fraction
from pathlib import Path

import numpy as np
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


# ---- talking-video fixtures (tests/models/test_avatar_video*.py) -----------------------------------------
SR = 16_000


def write_video(path, frames: np.ndarray, fps: int, audio: np.ndarray | None = None, *, audio_rate: int = SR,
                out_rate: int | None = None, layout: str = "mono", rotation: int | None = None) -> str:
    """An MP4 (H.264, and AAC when ``audio`` int16 mono at ``audio_rate`` is given; re-sampled to
    ``out_rate`` / ``layout`` as a camera would record it)."""
    import av

    c = av.open(str(path), "w", format="mp4")
    vs = c.add_stream("libx264", rate=fps)
    vs.width, vs.height, vs.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
    vs.codec_context.options = {"preset": "ultrafast"}
    if rotation is not None:
        vs.set_display_rotation(rotation)
    if audio is not None:
        a = c.add_stream("aac", rate=out_rate or audio_rate)
        a.layout = layout
        res = av.AudioResampler(format="fltp", layout=layout, rate=out_rate or audio_rate)
        af = av.AudioFrame.from_ndarray(audio.reshape(1, -1).astype(np.int16), format="s16", layout="mono")
        af.sample_rate, af.pts, af.time_base = audio_rate, 0, Fraction(1, audio_rate)
        for o in res.resample(af) + res.resample(None):
            c.mux(a.encode(o))
        c.mux(a.encode(None))
    for i, f in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
        vf.pts = i
        c.mux(vs.encode(vf))
    c.mux(vs.encode(None))
    c.close()
    return str(path)


def write_wav(path, samples: np.ndarray) -> str:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(samples.astype(np.int16).tobytes())
    return str(path)


def tone(seconds: float, amplitude: float = 8000.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 2 * t) > 0)).astype(np.int16)


def still(image: np.ndarray, seconds: float, fps: int = 10) -> np.ndarray:
    return np.repeat(image[None], int(round(seconds * fps)), axis=0)


def astronaut() -> np.ndarray:
    from framegraph.models.synth import astronaut_portrait

    return np.array(astronaut_portrait().image, copy=True)
