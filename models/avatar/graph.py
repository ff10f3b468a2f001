"""The avatar's stream graph: audio in, the talking picture and the audio out, for a bundle of any kind.

    audio source ──audio──▶ AudioFeatures ──features──▶ [the bundle's stages] ──video──▶ sink
        │                          └──state──▶ StateOverride ──state──▶ │
        └───────────────────────────────────────audio──────────────────────────────────────▶ sink

:func:`build_avatar_graph` adds the source and the sinks. It asks the bundle, an :class:`~.base.AvatarBundle`,
for the stages in between. A portrait gives ``Denoiser → VAEDecode → Composite`` (:mod:`.portrait`). A video
avatar gives ``MouthShape, VideoLoop → MouthRegion`` (:mod:`.video`). Each runs on the run's runtime.

Audio pts are the master. ``AudioFeatures`` stamps video frame ``k`` with ``clock.ticks_from_frame(k, fps)``, counted
from audio samples. Every later stage keeps those pts. The sink muxes by pts. So the video is in sync with the echoed
audio. That holds however long each stage takes. A stream of ``S`` samples makes ``ceil(S · fps / 16000)`` frames with
``chunk_frames = 1``. Larger chunks round the last one up.

    from framegraph.models.avatar import load_avatar, build_avatar_graph
    from framegraph.stream.media import AudioFileSource
    ag = build_avatar_graph(load_avatar("assets/avatars/astronaut"), AudioFileSource("speech.wav"), out="talk.mp4")
    ag.graph.run()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from framegraph.models.composite import OverBackground
from framegraph.models.runtime import default_device
from framegraph.stream import Clock, Graph, Stage
from framegraph.stream.clock import ClockMode
from framegraph.stream.media import (
    SAMPLE_RATE,
    AlphaVideoSink,
    AudioFileSource,
    JoinAlpha,
    MP4Sink,
    ScaleVideo,
    alpha_format,
    decode_audio,
)
from framegraph.stream.ring import Policy

from .base import STATE_MODES, AvatarBundle, RunSettings, StateMode, StateOverride
from .bundle import load_avatar


@dataclass
class AvatarGraph:
    """What :func:`build_avatar_graph` made.

    It holds the graph and its source. It holds the audio side every kind has, ``features`` and ``state``. It
    holds the bundle's own stages by name, as ``stages``. A portrait has ``denoiser`` / ``decode`` /
    ``composite``. A video avatar has ``mouth_shape`` / ``loop`` / ``mouth_region``. ``video`` is the stage
    with the ``"video"`` output. Then come the sinks, None when the caller connects the outputs. ``batched``:
    the models run in the model service's batches (asked for, and possible)."""

    graph: Graph
    source: Stage
    features: Stage
    state: StateOverride
    stages: dict[str, Stage]
    video: Stage
    sink: Stage | None
    audio_sink: Stage | None
    batched: bool = False

    def set_state(self, mode: StateMode) -> None:
        """``auto`` (VAD) or a forced ``speaking`` / ``listening`` / ``idle``."""
        self.state.set_mode(mode)
        self.features.set_listening(mode == "listening")


def build_avatar_graph(avatar: AvatarBundle, audio_source: Stage, sink: Stage | None = None, *,
                       settings: RunSettings | None = None, out: str | None = None,
                       audio_sink: Stage | None | bool = True, graph: Graph | None = None, clock: ClockMode = "fast",
                       max_in_flight: int | None = 8, preset: str = "offline", video_policy: Policy = "block",
                       name: str = "avatar") -> AvatarGraph:
    """Build the avatar graph around ``audio_source``, for a bundle of any kind.

    ``audio_source`` is an ``AudioFileSource`` or ``PushAudioSource``. It may be any stage with an ``"audio"``
    ``int16 [320]`` output.

    Args:
        avatar: a loaded bundle, from :func:`~.bundle.load_avatar`.
        sink: the stage the picture's ``"video"`` goes to, e.g. an MP4Sink or an encoder. None with ``out``:
            an ``MP4Sink(out)`` at the avatar's size, with the audio. None without ``out``: the caller
            connects ``video`` itself.
        settings: how the run uses the bundle, a :class:`~.base.RunSettings`, passed whole to its stages. None:
            the defaults, torch on the CPU. Its ``video_device`` None means the device of the ``sink``'s video
            input. With ``out`` it is the CPU. Else it is ``settings.device``.
        audio_sink: where the source's audio is echoed, to its ``"audio"`` input. True means ``sink``, when it
            has an audio input. It may be a stage. None or False means no echo.
        graph: add to this graph. Default: a new one on ``Clock(clock)``.
        max_in_flight: bound on frames between the source and the sinks.
        video_policy: ring policy into ``sink``. Use ``"drop_oldest"`` for a live encoder.
    """
    settings = settings if settings is not None else RunSettings()
    if settings.video_device is None:
        settings = replace(settings, video_device=sink.inputs["video"].device if sink is not None
                           else "cpu" if out is not None else settings.device)
    g = graph if graph is not None else Graph(Clock(clock), name=name)
    src = audio_source if audio_source in g.stages else g.add(audio_source, max_in_flight=max_in_flight)
    parts = avatar.add_stages(g, src, settings)
    if sink is None and out is not None:
        sink = g.add(MP4Sink(out, width=avatar.width, height=avatar.height, fps=avatar.fps,
                             audio_rate=SAMPLE_RATE if audio_sink else None, preset=preset))
    if sink is not None:
        if sink not in g.stages:
            g.add(sink)
        g.connect(parts.video, sink, "video", "video", capacity=4, policy=video_policy)
    if audio_sink is True:
        audio_sink = sink if sink is not None and "audio" in sink.inputs else None
    if audio_sink:
        if audio_sink not in g.stages:
            g.add(audio_sink)
        g.connect(src, audio_sink, "audio", "audio", capacity=8)
    return AvatarGraph(g, src, parts.features, parts.state, parts.stages, parts.video, sink, audio_sink or None,
                       parts.batched)


def warm_avatar(avatar: AvatarBundle, settings: RunSettings | None = None, *, seconds: float = 0.3) -> float:
    """Warm a loaded bundle for the sessions that will use it; returns the seconds it took.

    This is the preload's second half. A short graph runs ``seconds`` of silence through every stage. It runs
    at the session's shape with the sessions' ``settings``. So its kernels get their first calls. A compiled
    runtime compiles. That is cached on disk, and a restart reads it back. A session started after it finds its
    models ready. Its first frame then costs about what a steady frame does."""
    import time

    from framegraph.stream import PortSpec
    from framegraph.stream.record import IterableSource, RecordingSink

    started = time.perf_counter()
    n = max(2, math.ceil(seconds * SAMPLE_RATE / 320))
    silence = IterableSource(torch.zeros(n, 320, dtype=torch.int16), PortSpec((320,), torch.int16), port="audio",
                             fps=SAMPLE_RATE / 320, name="silence")
    ag = build_avatar_graph(avatar, silence, audio_sink=None, settings=settings, name="warm-up")
    ag.graph.connect(ag.video, ag.graph.add(RecordingSink({"video": ag.video.outputs["video"]}, name="drop")))
    ag.graph.run()
    return time.perf_counter() - started


def render_avatar_graph(avatar_dir, audio_path, out: str, settings: RunSettings | None = None, *,
                        preset: str = "offline", size: tuple[int, int] | None = None, alpha: bool = False,
                        background=None) -> tuple[Graph, Stage, int]:
    """``framegraph render --avatar DIR --audio FILE --out FILE``.

    Returns the offline graph, on a fast clock with the video and the audio. It also returns its sink and the number of
    frames it will write. The count serves a progress bar.

    ``settings``: the run's :class:`~.base.RunSettings`. None: torch, on
    :func:`~framegraph.models.runtime.default_device`. The picture always goes to the CPU, for the codec.

    ``size`` is (width, height) of the video when it is not the avatar's. The picture is scaled to fit, aspect kept, by
    :class:`~framegraph.stream.media.ScaleVideo`. ``alpha``: a video with the person matte as its alpha channel. ``out``
    is then a ``.webm`` or ``.mov``, written by :class:`~framegraph.stream.media.AlphaVideoSink`. ``background``: the
    person over a colour ``(r, g, b)`` or a picture, to MP4. That is done by
    :class:`~framegraph.models.composite.OverBackground`."""
    settings = replace(settings if settings is not None else RunSettings(device=default_device()), video_device="cpu")
    avatar = load_avatar(avatar_dir)
    total = math.ceil(len(decode_audio(audio_path)) * avatar.fps / SAMPLE_RATE)
    source = AudioFileSource(audio_path)
    if alpha or background is not None:
        return _render_matted(avatar, source, out, alpha, background, preset, settings) + (total,)
    if size is None or tuple(size) == (avatar.width, avatar.height):
        ag = build_avatar_graph(avatar, source, out=out, preset=preset, settings=settings)
        return ag.graph, ag.sink, total
    width, height = size
    sink = MP4Sink(out, width=width, height=height, fps=avatar.fps, audio_rate=SAMPLE_RATE, preset=preset)
    ag = build_avatar_graph(avatar, source, audio_sink=sink, settings=settings)
    scale = ag.graph.add(ScaleVideo(src_size=(avatar.width, avatar.height), size=(width, height)))
    ag.graph.connect(ag.video, scale, "video", capacity=4)
    ag.graph.connect(scale, sink, "video")
    return ag.graph, sink, total


def _render_matted(avatar: AvatarBundle, source: Stage, out: str, alpha: bool, background, preset: str,
                   settings: RunSettings) -> tuple[Graph, Stage]:
    """The avatar's picture and matte → a file with alpha (``alpha``) or the picture over ``background`` → MP4."""
    W, H = avatar.width, avatar.height
    if alpha:
        alpha_format(out)  # a .webm or .mov, or a sentence naming the suffix
        sink = AlphaVideoSink(out, width=W, height=H, fps=avatar.fps, audio_rate=SAMPLE_RATE)
        join, port = JoinAlpha(width=W, height=H), "rgba"
    else:
        sink = MP4Sink(out, width=W, height=H, fps=avatar.fps, audio_rate=SAMPLE_RATE, preset=preset)
        join, port = OverBackground(background, width=W, height=H), "video"
    ag = build_avatar_graph(avatar, source, audio_sink=sink, settings=replace(settings, alpha=True))
    ag.graph.add(join)
    ag.graph.connect(ag.video, join, "video", "video", capacity=4)
    ag.graph.connect(ag.video, join, "alpha", "alpha", capacity=4)
    ag.graph.connect(join, sink, port, "video")
    return ag.graph, sink


__all__ = ["StateOverride", "AvatarGraph", "build_avatar_graph", "render_avatar_graph", "warm_avatar", "STATE_MODES"]
