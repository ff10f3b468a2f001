"""Pipeline registry: what a session can ``start``.

A pipeline is a name bound to a **builder**: ``builder(opts: Options) -> Pipeline``. The builder reads
its options from ``opts`` (unknown or bad ones become a ``bad_option`` error for the client), builds a
fresh :class:`~framegraph.stream.Graph` for the session, and returns it together with the inputs the
session feeds (a :class:`PushAudioSource` for client audio, a pose input for camera poses) and the
:class:`~.stages.OutboxSink` the session sends from. Each session owns its own graph.

Built in: ``testcard`` (the stream test card, video + audio out) and ``scope`` (client microphone →
live waveform picture + the audio echoed back in sync: the glass-to-glass latency probe).

Adding a pipeline (``avatar_pipeline.py`` and ``scene_pipeline.py`` are two whole examples)::

    from framegraph.apps.server.pipelines import Pipeline, register, video_options, add_video_out

    @register("mine", "what it does, for the pipeline list")
    def build_mine(opts):
        v = video_options(opts, size=(512, 512), fps=25)
        steps = opts.integer("steps", 2, 1, 4)
        opts.done()                                   # rejects options nobody read
        graph = Graph(Clock("realtime"), name="mine")
        mic = graph.add(PushAudioSource(max_buffer_ms=500), max_in_flight=8)
        ...                                           # the stages that make the picture
        encoder, sink = add_video_out(graph, v, audio_chunk=320)
        graph.connect(picture, encoder, policy="drop_oldest")
        return Pipeline(graph, sink, encoder=encoder, audio_in=mic, format=v.describe())

and list the defining module in :data:`LAZY` (as ``"avatar": "framegraph.apps.server.avatar_pipeline"``)
so the server imports it (and its models) only when a client first asks for that pipeline. Client camera
poses reach a renderer through ``Pipeline.pose_in`` (anything with ``push(matrix)`` and ``close()``; the
scene pipeline pushes them into its ``CameraSource``); client camera pictures reach a graph through
``Pipeline.video_in``, a :class:`~.camera.CameraInput` whose ``source`` is the graph's video source.
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from framegraph.stream import Clock, Graph, Stage
from framegraph.stream.media import (
    H264Encoder,
    JpegEncoder,
    PushAudioSource,
    chunk_samples,
)
from framegraph.stream.testcard import TestCardAudio, TestCardVideo

from .protocol import AUDIO_SAMPLE_RATE, ErrorCode, Kind, ProtocolError
from .stages import AudioScope, OutboxSink

MIN_SIDE = 16  # px: one H.264 macroblock; the test card's frame counter and the scope's waveform fit whole
MAX_PIXELS = 1920 * 1080
FPS_RANGE = (1, 60)
AUDIO_CHUNK = chunk_samples(AUDIO_SAMPLE_RATE, 20)  # 320 samples = 20 ms
PCM16_FORMAT = {"format": "pcm16", "sample_rate": AUDIO_SAMPLE_RATE, "channels": 1, "chunk_ms": 20}


class Options:
    """Typed access to a client's ``options`` object; every failure is a ``bad_option`` error that
    names the option, the value and what was expected. Call :meth:`done` after reading: options
    nobody read are rejected (a typo must not be silently ignored)."""

    def __init__(self, values: dict | None, pipeline: str):
        self.values = dict(values or {})
        self.pipeline = pipeline
        self._read: set[str] = set()

    def _get(self, key: str):
        self._read.add(key)
        return self.values.get(key)

    def _bad(self, key: str, value, expected: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_OPTION, f"{self.pipeline}: option {key!r} = {value!r}; "
                                                   f"expected {expected}")

    def number(self, key: str, default: float, lo: float, hi: float) -> float:
        v = self._get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            raise self._bad(key, v, f"a number in [{lo:g}, {hi:g}]")
        return float(v)

    def integer(self, key: str, default: int | None, lo: int, hi: int) -> int | None:
        v = self._get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self._bad(key, v, f"an integer in [{lo}, {hi}]")
        return v

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        v = self._get(key)
        if v is None:
            return default
        if v not in choices:
            raise self._bad(key, v, f"one of {list(choices)}")
        return v

    def boolean(self, key: str, default: bool) -> bool:
        v = self._get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(key, v, "true or false")
        return v

    def size(self, key: str, default: tuple[int, int]) -> tuple[int, int]:
        """``"WxH"`` or ``[W, H]`` → ``(width, height)`` in pixels: even (H.264 yuv420p), each side at
        least :data:`MIN_SIDE`, at most :data:`MAX_PIXELS` pixels in all."""
        v = self._get(key)
        if v is None:
            return default
        try:
            w, h = (int(p) for p in v.lower().split("x")) if isinstance(v, str) else v
            ok = isinstance(w, int) and isinstance(h, int) and not isinstance(w, bool)
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok or w < MIN_SIDE or h < MIN_SIDE or w % 2 or h % 2 or w * h > MAX_PIXELS:
            raise self._bad(key, v, f'"WxH" or [W, H]: even sides of at least {MIN_SIDE} ({MIN_SIDE}x{MIN_SIDE}), '
                                    f"at most {MAX_PIXELS} pixels in all (1920x1080)")
        return w, h

    def done(self) -> None:
        unknown = sorted(set(self.values) - self._read)
        if unknown:
            raise ProtocolError(ErrorCode.BAD_OPTION, f"{self.pipeline}: unknown option(s) {unknown}; this "
                                                      f"pipeline takes {sorted(self._read)}")


@dataclass
class VideoOptions:
    """The video format every pipeline negotiates: size, fps and codec settings."""

    width: int
    height: int
    fps: float
    codec: str = "jpeg"
    quality: int = 80
    bitrate_kbps: int | None = None
    gop: int | None = None

    def describe(self) -> dict:
        d = {"codec": self.codec, "width": self.width, "height": self.height, "fps": self.fps}
        if self.codec == "jpeg":
            d["quality"] = self.quality
        else:
            d.update(bitrate_kbps=self.bitrate_kbps, gop=self.gop or max(1, round(self.fps)),
                     format="annexb", profile="constrained-baseline-like (x264 ultrafast, zerolatency)")
        return d


def video_options(opts: Options, size=(320, 240), fps: float = 25.0) -> VideoOptions:
    """Read the common video options: ``size`` (see :meth:`Options.size`), ``fps`` (in
    :data:`FPS_RANGE`), ``codec`` (jpeg | h264), ``quality`` (JPEG 1..100), ``bitrate_kbps`` and ``gop``
    (H.264, frames between key frames)."""
    w, h = opts.size("size", size)
    return VideoOptions(w, h, opts.number("fps", fps, *FPS_RANGE), opts.choice("codec", "jpeg", ("jpeg", "h264")),
                        opts.integer("quality", 80, 1, 100), opts.integer("bitrate_kbps", None, 50, 50_000),
                        opts.integer("gop", None, 1, 600))


def add_video_out(graph: Graph, v: VideoOptions, audio_chunk: int | None = None) -> tuple[Stage, OutboxSink]:
    """Add the encoder for ``v.codec`` and the session's sink to ``graph``, encoder → sink connected.
    The caller connects its picture to ``encoder`` (port ``"video"``) and, with ``audio_chunk``, its
    audio to ``sink`` (port ``"audio"``)."""
    if v.codec == "jpeg":
        enc = JpegEncoder(width=v.width, height=v.height, quality=v.quality, name="encode")
        kind, port = Kind.JPEG, "jpeg"
    else:
        enc = H264Encoder(width=v.width, height=v.height, fps=v.fps, gop=v.gop or max(1, round(v.fps)),
                          bitrate_kbps=v.bitrate_kbps, name="encode")
        kind, port = Kind.H264, "h264"
    graph.add(enc)
    sink = graph.add(OutboxSink(video_capacity=enc.outputs[port].shape[0], video_kind=kind,
                                audio_chunk=audio_chunk))
    graph.connect(enc, sink, port, "video")
    return enc, sink


class PoseInput(Protocol):
    """Where a session pushes the client's ``pose`` messages: a :class:`~framegraph.stream.PushSource` of
    ``float32 [4, 4]``, or an adapter such as the scene pipeline's ``CameraPoses``."""

    def push(self, matrix) -> None:
        """A world-to-camera ``[4, 4]`` matrix (OpenCV); raises ``ValueError`` for a bad one."""

    def close(self) -> None:
        """The client's poses end."""


@dataclass
class Pipeline:
    """A session's graph and its handles.

    Attributes:
        graph: built, not started.
        sink: where encoded media leaves the graph.
        encoder: the video encoder (key-frame requests, live ``quality``).
        audio_in: client PCM goes here (None: the pipeline takes no audio).
        pose_in: client camera poses go here (None: no pose input).
        video_in: client camera pictures (JPEG) go here: a :class:`~.camera.CameraInput` (None: no camera input;
            the session adds ``video_in`` to ``ready``).
        format: the negotiated format, sent in ``ready``.
        configure: optional ``configure(opts)`` for pipeline-specific live options (``config``).
        video_burst: the most video frames the graph hands the sink at once (``generate``: a chunk's
            frames); the session's video outbox holds at least that many, so a client that keeps up loses
            none of them (the outbox drops only for a reader that falls behind).
    """

    graph: Graph
    sink: OutboxSink
    encoder: Stage | None = None
    audio_in: PushAudioSource | None = None
    pose_in: PoseInput | None = None
    video_in: Any = None
    format: dict = field(default_factory=dict)
    configure: Callable[[Options], dict] | None = None
    video_burst: int = 1

    def timing_indices(self) -> None:
        """Tell the sink which stages count as encode and compute in the media headers."""
        stages = self.graph.stages
        self.sink.timing = {
            "encode": [stages.index(self.encoder)] if self.encoder in stages else [],
            "compute": [i for i, s in enumerate(stages)
                        if not s.is_source and s is not self.encoder and s is not self.sink]}

    def stop(self) -> None:
        """The client is done: close its inputs (buffered audio still flows), or drain the graph when
        it has none; the session ends when the sink has sent everything."""
        inputs = [src for src in (self.audio_in, self.pose_in, self.video_in) if src is not None]
        if not inputs:
            self.graph.drain()
            return
        for src in inputs:
            src.close()
        if self.audio_in is None and self.video_in is None:  # pose-driven: nothing else would end the frame clock
            self.graph.drain()

    def apply_config(self, opts: Options) -> dict:
        """Live options every pipeline understands (``quality`` for JPEG, ``keyframe``: true) plus the
        pipeline's own ``configure``. Returns what was applied."""
        applied: dict[str, Any] = {}
        if isinstance(self.encoder, JpegEncoder):
            q = opts.integer("quality", None, 1, 100)
            if q is not None:
                self.encoder.quality = applied["quality"] = q
        if opts.boolean("keyframe", False) and isinstance(self.encoder, H264Encoder):
            self.encoder.request_keyframe()
            applied["keyframe"] = True
        if self.configure is not None:
            applied.update(self.configure(opts))
        opts.done()
        return applied


# ---- registry -----------------------------------------------------------------------------------------

@dataclass
class PipelineSpec:
    name: str
    builder: Callable[[Options], Pipeline]
    description: str


REGISTRY: dict[str, PipelineSpec] = {}

# name → module that registers it when imported (heavy pipelines load their models only on first use).
LAZY: dict[str, str] = {
    "avatar": "framegraph.apps.server.avatar_pipeline",
    "generate": "framegraph.apps.server.generate_pipeline",
    "scene": "framegraph.apps.server.scene_pipeline",
}


def register(name: str, description: str):
    """Decorator: register ``builder(opts) -> Pipeline`` under ``name``."""
    def wrap(builder: Callable[[Options], Pipeline]):
        REGISTRY[name] = PipelineSpec(name, builder, description)
        return builder
    return wrap


def available() -> dict[str, str]:
    """Pipeline name → description (lazy ones say they load on first use)."""
    out = {n: s.description for n, s in REGISTRY.items()}
    out.update({n: f"(loaded on first use from {m})" for n, m in LAZY.items() if n not in out})
    return out


def build(name: str, options: dict | None) -> Pipeline:
    """Build a fresh pipeline for one session; raises :class:`ProtocolError` (unknown_pipeline,
    bad_option)."""
    if name not in REGISTRY and name in LAZY:
        try:
            importlib.import_module(LAZY[name])
        except ImportError as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_PIPELINE, f"pipeline {name!r} is not available on this "
                                                            f"server ({exc})") from None
    spec = REGISTRY.get(name)
    if spec is None:
        raise ProtocolError(ErrorCode.UNKNOWN_PIPELINE, f"unknown pipeline {name[:40]!r}; this server has "
                                                        f"{sorted(available())}")
    pipeline = spec.builder(Options(options, name))
    pipeline.format = {"pipeline": name, **pipeline.format}
    pipeline.timing_indices()
    return pipeline


# ---- built-in pipelines -------------------------------------------------------------------------------

@register("testcard", "the stream test card: moving bands, frame counter, a flash each second with a beep on it")
def build_testcard(opts: Options) -> Pipeline:
    v = video_options(opts)
    seconds = opts.number("seconds", 600.0, 0.1, 24 * 3600)
    audio = opts.boolean("audio", True)
    opts.done()
    graph = Graph(Clock("realtime"), name="testcard")
    card = graph.add(TestCardVideo(width=v.width, height=v.height, fps=v.fps, seconds=seconds), max_in_flight=2)
    encoder, sink = add_video_out(graph, v, audio_chunk=AUDIO_CHUNK if audio else None)
    graph.connect(card, encoder, "video", policy="drop_oldest")
    if audio:
        tone = graph.add(TestCardAudio(fps=v.fps, seconds=seconds), max_in_flight=8)
        graph.connect(tone, sink, "audio", capacity=8)
    return Pipeline(graph, sink, encoder=encoder,
                    format={"video": v.describe(), "audio_out": PCM16_FORMAT if audio else None,
                            "audio_in": None, "pose_in": False, "seconds": seconds})


@register("scope", "microphone in → live waveform / level picture + the audio echoed back in sync "
                   "(glass-to-glass latency probe)")
def build_scope(opts: Options) -> Pipeline:
    v = video_options(opts)
    window_ms = opts.number("window_ms", 40.0, 5.0, 1000.0)
    gain = opts.number("gain", 1.0, 0.01, 100.0)
    echo = opts.boolean("echo", True)
    opts.done()
    graph = Graph(Clock("realtime"), name="scope")
    mic = graph.add(PushAudioSource(max_buffer_ms=500, name="mic"), max_in_flight=8)
    scope = graph.add(AudioScope(width=v.width, height=v.height, fps=v.fps, window_ms=window_ms, gain=gain))
    encoder, sink = add_video_out(graph, v, audio_chunk=AUDIO_CHUNK if echo else None)
    graph.connect(mic, scope, "audio", capacity=4)
    graph.connect(scope, encoder, "video", policy="drop_oldest")
    if echo:
        graph.connect(scope, sink, "audio", capacity=8)

    def configure(o: Options) -> dict:
        g = o.number("gain", None, 0.01, 100.0)
        if g is None:
            return {}
        scope.gain = g
        return {"gain": g}

    return Pipeline(graph, sink, encoder=encoder, audio_in=mic, configure=configure,
                    format={"video": v.describe(), "audio_out": PCM16_FORMAT if echo else None,
                            "audio_in": PCM16_FORMAT, "pose_in": False})
