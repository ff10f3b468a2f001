"""How fast a video avatar's real graph draws, for ``bench video_avatar`` and ``--people``.

It measures frames per second and the time to the first frame. That is at the bundle's region or another; see
:func:`at_region`."""
from __future__ import annotations

import copy
import statistics
import tempfile
import time
import wave

import numpy as np
import torch
import torch.nn.functional as F

from framegraph.models.avatar import RunSettings, build_avatar_graph
from framegraph.models.avatar.video.lipsync import MouthGenerator
from framegraph.stream import PortSpec, Stage
from framegraph.stream.media import SAMPLE_RATE, AudioFileSource


class _Arrivals(Stage):
    """Sink: the wall-clock time each video frame arrives."""

    def __init__(self, height: int, width: int):
        super().__init__("arrivals")
        self.inputs = {"video": PortSpec((height, width, 3), torch.uint8, "cpu")}
        self.times: list[float] = []

    def process(self, inputs, out):
        self.times.append(time.monotonic())


def graph_speed(avatar, audio, seconds: float, warm_runs: int, runtime: str = "torch", threads: int = 2) -> dict:
    """Frames per second and time to the first frame of the avatar's graph on ``audio``, on ``runtime``.

    It runs on a fast clock. The first session runs on ``seconds`` of audio. Then ``warm_runs`` sessions run on
    its first second, for the first frame only. For ``onnx`` the avatar is exported first. The export's time is
    reported, not counted."""
    def session(path: str) -> tuple[list[float], float]:  # the arrival times, the graph's start
        sink = _Arrivals(avatar.height, avatar.width)
        ag = build_avatar_graph(avatar, AudioFileSource(path), sink=sink, audio_sink=None, clock="fast",
                                settings=RunSettings(runtime=runtime, torch_threads=threads, onnx_dir=onnx_dir))
        t0 = time.monotonic()
        ag.graph.run()
        return sink.times, t0

    with tempfile.TemporaryDirectory() as tmp:
        onnx_dir, export_s = None, None
        if runtime != "torch":
            onnx_dir, t = f"{tmp}/onnx", time.monotonic()
            avatar.export_onnx(onnx_dir)
            export_s = round(time.monotonic() - t, 1)
        paths = {}
        for name, s in (("long", seconds), ("short", min(seconds, 1.0))):
            paths[name] = f"{tmp}/{name}.wav"
            with wave.open(paths[name], "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(SAMPLE_RATE)
                w.writeframes(np.asarray(audio[:int(s * SAMPLE_RATE)], np.int16).tobytes())
        t, t0 = session(paths["long"])
        warm = []
        for _ in range(warm_runs):
            times, start = session(paths["short"])
            warm.append(round(1000 * (times[0] - start), 1))
    return {"runtime": runtime, "export_s": export_s, "frames": len(t), "first_frame_ms": round(1000 * (t[0] - t0), 1),
            "first_frame_warm_ms": statistics.median(warm) if warm else None, "first_frame_warm_runs_ms": warm,
            "fps": round((len(t) - 1) / (t[-1] - t[0]), 2) if len(t) > 1 else None,
            "region_size": avatar.region_size, "box_side_px": avatar.box_side}


def at_region(avatar, size: int):
    """The same avatar with a fresh generator at ``size``² and a box of ``size`` px. The architecture is the same."""
    big = copy.copy(avatar)
    c = avatar.generator.config
    big.generator = MouthGenerator(channels=tuple(c.channels), shape_dim=c.shape_dim, sample_size=size).eval()
    resize = lambda m: F.interpolate(m[None, None], size=(size, size), mode="bilinear")[0, 0]  # noqa: E731
    big.mask, big.paste = (resize(avatar.mask) > 0.5).float(), resize(avatar.paste)
    big.reference = F.interpolate(avatar.reference.permute(2, 0, 1)[None].float(), size=(size, size),
                                  mode="bilinear")[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)
    b = avatar.boxes.copy()
    cx, cy = b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2
    b[:, 0] = (cx - size / 2).clip(0, avatar.width - size).round()
    b[:, 1] = (cy - size / 2).clip(0, avatar.height - size).round()
    b[:, 2:] = size
    big.boxes = b
    return big
