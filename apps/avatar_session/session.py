"""``AvatarSession``: a live talking avatar for any framework — audio in, synced video + audio out.

    session = AvatarSession("assets/avatars/astronaut", runtime="onnx", on_ready=wake)
    session.start()                                   # the graph runs; the idle face streams at once
    session.push_audio(pcm, sample_rate=24000, segment="reply-1")   # any rate, mono or stereo PCM16
    session.end_segment("reply-1")                    # it plays out, then SegmentEvent("ended")
    session.clear()                                   # barge-in: queued speech dropped, the mouth rests
    items = session.take()                            # VideoOut / AudioOut / SegmentEvent, in order
    session.close(); session.join()                   # or cancel()

The graph is the avatar's own, ``models.avatar.build_avatar_graph``. It takes either bundle kind, on torch or
ONNX Runtime. It sits between a :class:`~.source.SpeechSource` and a :class:`~.output.SessionOutput`. The source
plays speech segments, with silence between them. The session's realtime clock paces it. The output releases
pictures and audio together by pts.

A framework adapter is thin. ``apps/pipecat`` is one; a LiveKit Agents video generator would be the same. It
turns its frames into ``push_audio`` / ``end_segment`` / ``clear`` calls. It turns the items back into its
frames. ``on_ready`` is called from the graph's thread whenever items wait in :meth:`take`.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

import av
import numpy as np

from framegraph.apps.bundles import load_bundle_at
from framegraph.models import runtime as models_runtime
from framegraph.models.avatar import RunSettings, build_avatar_graph
from framegraph.stream import Clock, Graph
from framegraph.stream.media import SAMPLE_RATE

from .output import SessionOutput, VideoOut
from .source import SpeechSource

MIN_RATE, MAX_RATE = 8_000, 192_000  # input sample rates the session resamples to 16 kHz
MAX_PENDING_S = 2.0  # items waiting for take() beyond this much video are dropped, oldest first


def to_mono16(pcm, channels: int) -> np.ndarray:
    """``bytes`` of little-endian PCM16, or an int16 array, with ``channels`` interleaved → int16 [N] mono."""
    if channels not in (1, 2):
        raise ValueError(f"{channels} audio channels; expected 1 (mono) or 2 (stereo)")
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % (2 * channels):
            raise ValueError(f"{len(pcm)} bytes of PCM16 is not a whole number of {channels}-channel samples")
        samples = np.frombuffer(pcm, dtype="<i2")
    else:
        samples = np.asarray(pcm)
        if samples.dtype != np.int16:
            raise ValueError(f"audio samples of dtype {samples.dtype}; expected int16 PCM")
        samples = samples.reshape(-1)
    if channels == 2:
        samples = samples.reshape(-1, 2).astype(np.int32).mean(axis=1).astype(np.int16)
    return samples


class _Resampler:
    """One segment's streaming resampler to 16 kHz mono, with PyAV / FFmpeg's swresample.

    Its state carries across pushes. So the 16 kHz stream is the same whatever the frame sizes."""

    def __init__(self, rate: int):
        self.rate = rate
        self._r = None if rate == SAMPLE_RATE else av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)

    def __call__(self, mono: np.ndarray | None) -> np.ndarray:
        if self._r is None:
            return np.zeros(0, np.int16) if mono is None else mono
        if mono is None:
            frames = self._r.resample(None)
        else:
            frame = av.AudioFrame.from_ndarray(mono.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = self.rate
            frames = self._r.resample(frame)
        parts = [f.to_ndarray().reshape(-1) for f in frames]
        return np.concatenate(parts).astype(np.int16, copy=False) if parts else np.zeros(0, np.int16)


class AvatarSession:
    """A live avatar graph fed with speech, handing out its pictures and audio in presentation order.

    Args:
        bundle: an avatar bundle folder, or a loaded bundle, either kind. A folder is loaded once per process,
            by :func:`~framegraph.apps.bundles.load_bundle_at`.
        runtime: ``"torch"``, ``"onnx"`` or ``"onnx-int8"``. The ONNX ones are for portrait bundles. They use the
            export made by ``framegraph export --avatar``, in ``onnx_dir`` or ``<bundle>/onnx``.
        fps: output frames per second. The default is the avatar's; others re-time its pictures.
        steps: sampler steps of a portrait bundle. The default is the bundle's.
        start_buffer_ms / max_speech_s: see :class:`~.source.SpeechSource`.
        video_delay_ms: each picture leaves this long after the audio of its time. With 0 they leave together. It is for
            a transport whose audio reaches the viewer later than its video. See :class:`~.output.SessionOutput`.
        on_ready: called from the graph's thread when items wait in :meth:`take`.
    """

    def __init__(self, bundle, *, runtime: str = "torch", onnx_dir: str | None = None, fps: float | None = None,
                 steps: int | None = None, start_buffer_ms: float = 40.0, max_speech_s: float = 120.0,
                 video_delay_ms: float = 0.0, on_ready: Callable[[], None] | None = None, name: str = "avatar"):
        self.avatar = load_bundle_at(bundle) if isinstance(bundle, (str, os.PathLike)) else bundle
        # the runtime's engines made once now: an unknown runtime, one the bundle's kind lacks, or a missing or stale
        # export is refused here, naming what is expected (the export command)
        self.settings = RunSettings(runtime=runtime, device="cpu", steps=steps, live=True, torch_threads=1,
                                    onnx_dir=onnx_dir)
        models_runtime.engines(f"avatar-{self.avatar.kind}", runtime, self.avatar, self.settings)
        if fps is not None and not 1 <= fps <= 120:
            raise ValueError(f"fps={fps}; expected 1..120 frames per second")
        self.fps = float(fps or self.avatar.fps)
        self.width, self.height = self.avatar.width, self.avatar.height
        self.name = name
        self.video_delay_ms = float(video_delay_ms)
        self.on_ready = on_ready
        self._source_args = dict(start_buffer_ms=start_buffer_ms, max_buffer_s=max_speech_s)
        self._lock = threading.Lock()
        self._pending: list = []
        self._cleared = -1  # items before this pts are from before the last barge-in
        self._pending_video = 0
        self._video_pts = -1  # the last picture queued: one older than it comes too late to be shown
        self.dropped_items = 0
        self._resamplers: dict = {}
        self.graph: Graph | None = None

    # ---- life cycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Build and start the graph, with its stages' setup. The idle face streams from now on.

        Raises the graph's error. A missing ONNX export names the command that makes it."""
        a = self.avatar
        g = Graph(Clock("realtime"), name=self.name)
        self.source = g.add(SpeechSource(**self._source_args))
        self.output = SessionOutput(self.source, size=(self.width, self.height), fps=a.fps, out_fps=self.fps,
                                    video_delay_s=self.video_delay_ms / 1000, emit=self._emit)
        self.avatar_graph = build_avatar_graph(
            a, self.source, sink=self.output, audio_sink=self.output, graph=g, settings=self.settings,
            max_in_flight=None, video_policy="drop_oldest", name=self.name)
        for edge in g.edges:  # the audio is the session's clock: models that fall behind never hold it back
            if edge.src is self.source and edge.dst is not self.output:
                edge.policy = "drop_oldest"  # the chunks they missed are silence to them (AudioFeatures)
        self.graph = g
        g.start()

    def close(self) -> None:
        """No more speech: what is queued plays out, then the graph ends. Use :meth:`join` to wait for it."""
        with self._lock:
            rest = [(k, r.rate, r(None)) for k, r in self._resamplers.items()]
            self._resamplers.clear()
        if self.graph is None:
            return
        for key, rate, tail in rest:
            if len(tail):
                self.source.push(key, tail, np.zeros(0, np.int16), rate)
        self.source.close()

    def cancel(self) -> None:
        """Stop now, dropping what is queued and in flight."""
        if self.graph is not None:
            self.graph.cancel()

    def join(self, timeout: float | None = None) -> dict:
        """Wait for the graph's threads to end. Returns its report.

        Raises its error, or ``TimeoutError``."""
        return self.graph.join(timeout) if self.graph is not None else {}

    @property
    def running(self) -> bool:
        return self.graph is not None and self.graph.running

    @property
    def failure(self) -> str | None:
        """Why the graph stopped, when one of its stages failed. None otherwise."""
        return self.graph.report().get("error") if self.graph is not None else None

    # ---- input (any thread) ------------------------------------------------------------------------------
    def push_audio(self, pcm, sample_rate: int, *, channels: int = 1, segment=None) -> int:
        """Queue speech of segment ``segment``. Returns the 16 kHz samples queued.

        A segment is an utterance; ``None`` is a segment too. ``pcm`` is little-endian PCM16 bytes or an int16 array,
        with ``channels`` interleaved. It is at ``sample_rate`` Hz, from 8 000 to 192 000. It is resampled to 16 kHz for
        the models. The listener hears it at its own rate. Raises ``ValueError`` for a rate, channel count or size it
        cannot take. Also for too much queued speech."""
        if not isinstance(sample_rate, (int, np.integer)) or not MIN_RATE <= sample_rate <= MAX_RATE:
            raise ValueError(f"sample rate {sample_rate!r} Hz: the avatar resamples {MIN_RATE}-{MAX_RATE} Hz audio to "
                             f"16 kHz; expected an integer rate in that range")
        mono = to_mono16(pcm, channels)
        with self._lock:
            r = self._resamplers.get(segment)
            if r is None or r.rate != sample_rate:
                r = self._resamplers[segment] = _Resampler(int(sample_rate))
            pcm16 = r(mono)
        return self._push16(segment, pcm16, mono, int(sample_rate))

    def _push16(self, segment, pcm16: np.ndarray, original: np.ndarray, rate: int) -> int:
        if self.graph is None:
            raise RuntimeError(f"{self.name}: push_audio before start()")
        return self.source.push(segment, pcm16, original, rate)

    def end_segment(self, segment) -> bool:
        """Segment ``segment`` is complete: it plays out, then ``SegmentEvent("ended")``.

        False when nothing of it is queued: never pushed, already spoken, or cleared."""
        with self._lock:
            r = self._resamplers.pop(segment, None)
        if r is not None and self.graph is not None:
            tail = r(None)
            if len(tail):
                self.source.push(segment, tail, np.zeros(0, np.int16), r.rate)
        return self.graph is not None and self.source.end_segment(segment)

    def clear(self) -> int:
        """Barge-in. Returns the pts, in clock ticks, from which everything is post-clear.

        Queued speech is dropped, and the models forget the stream. Waiting audio items are dropped. The next
        output frame shows the face at rest at once. Pictures still in flight from the dropped speech give way
        to it."""
        if self.graph is None:
            return 0
        with self._lock:
            self._resamplers.clear()
        pts, _ = self.source.clear()
        self.output.clear_before(pts)
        self.graph.reset()
        with self._lock:
            self._cleared = max(self._cleared, pts)
            self._pending = self._post_clear(self._pending)
        self._emit(self.output.rest_now())
        return pts

    def _post_clear(self, items: list) -> list:
        """Under the lock: ``items`` less what came before the last barge-in.

        That drops the audio and segment events from before it.

        Its pictures become the face at rest. The graph's thread may hand over a batch it made just before the
        barge-in."""
        cleared, rest, kept = self._cleared, self.output.rest_picture, []
        for item in items:
            if item.pts >= cleared:
                kept.append(item)
            elif isinstance(item, VideoOut) and item.rest:
                kept.append(item)
            elif isinstance(item, VideoOut) and rest is not None:
                kept.append(VideoOut(item.pts, rest, False, item.source_pts, True, item.capture_ns))
        return kept

    def _in_order(self, items: list) -> list:
        """Under the lock: ``items`` less the pictures older than one already queued.

        A barge-in queues the face at rest at once, from the caller's thread. The graph's thread may then hand over
        a picture it made for an earlier frame. That picture gives way: the viewer never sees time run back."""
        kept = []
        for item in items:
            if isinstance(item, VideoOut):
                if item.pts <= self._video_pts:
                    continue
                self._video_pts = item.pts
            kept.append(item)
        return kept

    def set_listening(self, listening: bool) -> None:
        """The user is speaking. Between utterances the avatar shows its listening face, else its idle face."""
        if self.graph is not None:
            self.avatar_graph.features.set_listening(listening)

    # ---- output ------------------------------------------------------------------------------------------
    def take(self) -> list:
        """The items ready since the last call, in presentation order.

        They are :class:`~.output.VideoOut`, :class:`~.output.AudioOut` and :class:`~.output.SegmentEvent`."""
        with self._lock:
            items, self._pending, self._pending_video = self._pending, [], 0
        return items

    def _emit(self, items: list) -> None:
        """From the graph's thread: queue ``items``.

        The queue is bounded. A consumer that stopped taking loses the oldest."""
        limit = MAX_PENDING_S * self.fps
        with self._lock:
            items = self._in_order(self._post_clear(items) if self._cleared >= 0 else items)
            self._pending.extend(items)
            self._pending_video += sum(isinstance(i, VideoOut) for i in items)
            while self._pending_video > limit:
                drop = self._pending.pop(0)
                self.dropped_items += 1
                self._pending_video -= isinstance(drop, VideoOut)
        if self.on_ready is not None:
            self.on_ready()

    @property
    def queued_speech_s(self) -> float:
        """Seconds of speech waiting to be spoken."""
        return self.source.queued_samples / SAMPLE_RATE if self.graph is not None else 0.0

    def stats(self) -> dict:
        """Counters of the session.

        - frames out;
        - repeated: re-timed, skipped as stale, or standing in for a late one;
        - late: pictures that came after their frame had left;
        - replaced after a barge-in;
        - generated;
        - source chunks that ran dry;
        - items dropped for a consumer that did not take them."""
        o = self.output if self.graph is not None else None
        return {"frames_out": o.frames_out if o else 0, "repeated": o.repeated if o else 0, "late": o.late if o else 0,
                "replaced_after_clear": o.replaced if o else 0, "generated": o.generated if o else 0,
                "underrun_chunks": self.source.underrun_chunks if o else 0, "dropped_items": self.dropped_items}
