"""What every pipeline builds and hands to the session.

- :class:`Pipeline`: its graph and the handles the session feeds and reads.
- :func:`add_video_out`: the video out every pipeline ends with.
- :func:`model_service`: the process's one model service.
  Sessions of one model are batched together on a server whose config has ``batching`` on.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from framegraph.stream import Graph, Stage
from framegraph.stream.batching import ModelService
from framegraph.stream.media import H264Encoder, JpegEncoder, PushAudioSource, RGBAImageEncoder, chunk_samples
from framegraph.stream.telemetry import prometheus_family

from ..protocol import AUDIO_SAMPLE_RATE, Kind
from ..stages import OutboxSink
from .options import Options, VideoOptions

if TYPE_CHECKING:  # pragma: no cover - the camera checks pictures with the session's rate limiter
    from ..camera import CameraInput

AUDIO_CHUNK = chunk_samples(AUDIO_SAMPLE_RATE, 20)  # 320 samples = 20 ms
_SERVICE = ModelService(admit=True)  # no thread until a session opens a client; refuses one that would not fit
FULL_RETRY_S = 5.0  # what a session refused for a full model is told to wait (``retry_after_s``)


def model_service(opts: Options) -> ModelService | None:
    """The process's model service for a session of a server with ``batching`` on, else None."""
    return _SERVICE if opts.batching else None


def batching_metrics_text() -> str:
    """The model service's lanes as Prometheus text, with label ``lane``. Empty before any lane exists.

    Per lane it gives:

    - batches by size;
    - requests served, missed, late, failed and cancelled;
    - queue wait p50 and p95, in ms;
    - the measured ms per batch size;
    - the sessions on the lane, and how many it holds at 25 fps.
    """
    lanes = list(_SERVICE.lanes().values())
    if not lanes:
        return ""
    lines = []

    def family(name: str, kind: str, help_: str, series):
        lines.extend(prometheus_family(f"framegraph_{name}", kind, help_, series))

    def lane_(lane, **more) -> dict:
        return {"lane": lane.name, **more}

    family("batches_total", "counter", "Batches a lane ran, by size.",
           [(lane_(ln, size=b), n) for ln in lanes for b, n in sorted(ln.stats.batches.items())])
    for what, help_ in (("served", "served"), ("missed", "dropped for their deadline"),
                        ("late", "started after their deadline"), ("failed", "failed"),
                        ("cancelled", "cancelled by their session")):
        family(f"batch_requests_{what}_total", "counter", f"Requests to a lane {help_}.",
               [(lane_(ln), getattr(ln.stats, what)) for ln in lanes])
    family("batch_queue_wait_ms", "gauge", "Wait from a request's submit to the start of its batch, ms.",
           [(lane_(ln, quantile=f"{q:g}"), f"{w:.3f}") for ln in lanes for q in (0.5, 0.95)
            if (w := ln.stats.wait_ms(q)) is not None])
    family("batch_cost_ms", "gauge", "Measured time of one batch, by size, ms.",
           [(lane_(ln, size=b), f"{ns / 1e6:.3f}") for ln in lanes for b, ns in sorted(ln.cost_ns.items())])
    family("batch_sessions", "gauge", "Sessions a lane serves now.", [(lane_(ln), ln.sessions) for ln in lanes])
    family("batch_capacity_sessions", "gauge", "Sessions a lane holds at 25 fps (its measured cost).",
           [(lane_(ln, fps=25), ln.capacity(25.0)) for ln in lanes])
    return "".join(line + "\n" for line in lines)


PCM16_FORMAT = {"format": "pcm16", "sample_rate": AUDIO_SAMPLE_RATE, "channels": 1, "chunk_ms": 20}


def add_video_out(graph: Graph, v: VideoOptions, audio_chunk: int | None = None) -> tuple[Stage, OutboxSink]:
    """Add the encoder for ``v.codec`` and the session's sink to ``graph``, encoder → sink connected.

    The caller connects its picture to ``encoder`` on port ``"video"``.
    For ``png`` and ``webp``, pictures with alpha, the port is ``"rgba"``.
    With ``audio_chunk``, the caller connects its audio to ``sink`` on port ``"audio"``.
    """
    if v.codec in ("png", "webp"):
        enc = RGBAImageEncoder(width=v.width, height=v.height, codec=v.codec, quality=v.quality, name="encode")
        kind, port = (Kind.PNG if v.codec == "png" else Kind.WEBP), v.codec
    elif v.codec == "jpeg":
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
    """Where a session pushes the client's ``pose`` messages.

    It is a :class:`~framegraph.stream.PushSource` of ``float32 [4, 4]``.
    Or it is an adapter, such as the scene pipeline's ``CameraPoses``.
    """

    def push(self, matrix) -> None:
        """A world-to-camera ``[4, 4]`` matrix, OpenCV convention. Raises ``ValueError`` for a bad one."""

    def close(self) -> None:
        """The client's poses end."""


@dataclass
class Pipeline:
    """A session's graph and its handles.

    Attributes:
        graph: built, not started.
        sink: where encoded media leaves the graph.
        encoder: the video encoder, for key-frame requests and live ``quality``.
        audio_in: client PCM goes here. None: the pipeline takes no audio.
        pose_in: client camera poses go here. None: no pose input.
        video_in: client camera JPEG pictures go here. None: no camera input.
            The session adds ``video_in`` to ``ready``.
        format: the negotiated format, sent in ``ready``.
        configure: ``configure(changes) -> applied`` for the pipeline's own live options.
            ``changes`` is ``{name: value}`` of the ``live`` fields a ``config`` message sent, checked.
        video_burst: the most video frames the graph hands the sink at once. For ``generate``, a chunk's frames.
            The session's video outbox holds at least that many.
            So a client that keeps up loses none of them.
            The outbox drops only for a reader that falls behind.
        options: the pipeline's options class. :meth:`apply_config` checks ``config`` against its ``live`` fields.
        on_close: gives back what the pipeline borrowed for the session, such as ``generate``'s loaded model.
            It is called once by :meth:`closed`, when the graph has stopped or will never start.
    """

    graph: Graph
    sink: OutboxSink
    encoder: Stage | None = None
    audio_in: PushAudioSource | None = None
    pose_in: PoseInput | None = None
    video_in: CameraInput | None = None
    format: dict = field(default_factory=dict)
    configure: Callable[[dict], dict] | None = None
    video_burst: int = 1
    options: type[Options] = VideoOptions
    on_close: Callable[[], None] | None = None

    def closed(self) -> None:
        """The graph has stopped, or never started: give back what the pipeline borrowed, once."""
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()

    def timing_indices(self) -> None:
        """Tell the sink which stages count as encode and compute in the media headers."""
        stages = self.graph.stages
        self.sink.timing = {
            "encode": [stages.index(self.encoder)] if self.encoder in stages else [],
            "compute": [i for i, s in enumerate(stages)
                        if not s.is_source and s is not self.encoder and s is not self.sink]}

    def stop(self) -> None:
        """The client is done: close its inputs, or drain the graph when it has none.

        Buffered audio still flows.
        The session ends when the sink has sent everything.
        """
        inputs = [src for src in (self.audio_in, self.pose_in, self.video_in) if src is not None]
        if not inputs:
            self.graph.drain()
            return
        for src in inputs:
            src.close()
        if self.audio_in is None and self.video_in is None:  # pose-driven: nothing else would end the frame clock
            self.graph.drain()

    def apply_config(self, values: dict | None) -> dict:
        """Check and apply a ``config`` message's options. Returns what took effect.

        All are checked before anything changes. An unknown or bad one is ``bad_option``.
        Then ``quality`` applies to JPEG, ``keyframe`` to H.264, and the rest to the pipeline's own live options.
        ``stats_interval_ms`` is returned for the session to apply.
        """
        changes = self.options.parse_live(values, self.format.get("pipeline", "pipeline"))
        applied: dict[str, Any] = {}
        quality = changes.pop("quality", None)
        if quality is not None and isinstance(self.encoder, JpegEncoder):
            self.encoder.quality = applied["quality"] = quality
        if changes.pop("keyframe", None) and isinstance(self.encoder, H264Encoder):
            self.encoder.request_keyframe()
            applied["keyframe"] = True
        if "stats_interval_ms" in changes:
            applied["stats_interval_ms"] = changes.pop("stats_interval_ms")
        if changes and self.configure is not None:
            applied.update(self.configure(changes))
        return applied


@dataclass(frozen=True)
class Unavailable:
    """Why a server cannot run a pipeline.

    ``reason`` is for its clients: what the server lacks, in the protocol's terms.
    ``fix`` is for its operator. It is logged and may name folders and commands.
    """

    reason: str
    fix: str


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    description: str
    options: type[Options]
    build: Callable[[Options], Pipeline]
    unavailable: Callable[[], Unavailable | None] | None = None


class ModelPool:
    """Loaded models lent to one session at a time, kept for the next session of the same model.

    It is for models whose stream state lives inside them.
    A video generator's attention processors hold its KV cache, for example.
    So two running graphs never share one.
    A session calls :meth:`take` for its whole run.
    It calls :meth:`give_back` once its graph has stopped, through :attr:`Pipeline.on_close`.
    A later session of the same model then gets it without loading it from disk.
    Its compiled code is already built.
    A new model object is compiled again, which takes seconds. Warming a known one takes tens of ms.

    A model is keyed by ``(place, version)``.
    The place is where it is loaded from and onto: a folder and a device.
    The version is what it was loaded from: its files as they were.
    At most ``max_idle`` models per place are kept idle, of its newest version only.
    A model given back beyond that is let go, and so is one older than the place's newest version.
    Its memory goes with it. A GPU holds one idle copy, not one per session that ever ran at once.
    ``loads`` counts how many models it loaded.
    """

    def __init__(self, max_idle: int = 1):
        self.max_idle = max_idle
        self._idle: dict[object, list] = {}  # place → idle models of its newest version
        self._newest: dict[object, object] = {}  # place → the newest version taken
        self._shared: dict[object, tuple] = {}  # place → (version, the model batched sessions share)
        self._lock = threading.Lock()
        self.loads = 0

    def take(self, place, version, load: Callable[[], object]):
        """An idle model of ``(place, version)``, or a new one from ``load()`` when none is idle."""
        with self._lock:
            if self._newest.get(place) != version:
                self._newest[place] = version
                self._idle.pop(place, None)  # an older version's: let go
            idle = self._idle.get(place)
            if idle:
                return idle.pop()
            self.loads += 1
        return load()

    def give_back(self, place, version, model) -> None:
        """``model``, taken for ``(place, version)``, is free again: its session's graph has stopped."""
        with self._lock:
            idle = self._idle.setdefault(place, [])
            if self._newest.get(place) == version and len(idle) < self.max_idle:
                idle.append(model)

    def shared(self, place, version, load: Callable[[], object]):
        """The one model of ``(place, version)`` that batched sessions share, loaded on first use.

        Their stream state lives in each session, not in the model, so it is never given back. A newer version
        of the place replaces it for the sessions after.
        """
        with self._lock:
            kept = self._shared.get(place)
            if kept is not None and kept[0] == version:
                return kept[1]
            self.loads += 1
            model = load()  # under the lock: two first sessions at once load it once
            self._shared[place] = (version, model)
            return model

    def idle(self, place) -> int:
        """How many models of ``place`` wait for a session."""
        with self._lock:
            return len(self._idle.get(place, ()))
