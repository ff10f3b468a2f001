"""What an avatar session hands out, in presentation order, and the sink stage that puts it in that order.

    SpeechSource ──audio (echo, same pts)──────────────────────────▶ SessionOutput ──▶ [VideoOut, AudioOut, ...]
        └──▶ AudioFeatures ─▶ ... ─▶ composite ──video (pts of its audio)──▶      (by pts, at the output fps)

The echo of a chunk reaches the sink at once; its picture one graph latency later. The sink holds the audio
until the picture of the same time is out, then releases both — an image, then the audio of its frame
period — so the two leave stamped from the one session clock and in sync, however long the models take.
Pictures are re-timed to the output frame rate (each output frame shows the newest picture of its time: a
picture the models skipped as stale is covered by the one before, so the cadence holds). After a barge-in
(:meth:`SessionOutput.clear_before`) the audio from before it is dropped and its pictures still in flight
are replaced by the last picture of the face at rest.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from framegraph.stream import PortSpec, Stage

from .source import CHUNK, SpeechSource

REST_BEFORE_S = 0.3  # a picture with no speech this long before it ...
REST_AFTER_S = 0.12  # ... nor this long after (the audio encoder's look-ahead) shows the face at rest
MAX_AUDIO_HOLD_S = 0.5  # audio waits at most this long (of its own time) for the pictures of its time


@dataclass
class VideoOut:
    """One output frame: ``picture`` ``uint8 [H, W, 3]`` at session time ``pts`` (clock ticks); ``speech``:
    speech audio falls in its frame period; ``source_pts``: the pts of the generated picture it shows
    (< ``pts`` when repeated); ``rest``: the face-at-rest picture put in for one generated before a barge-in;
    ``capture_ns``: when its audio entered the graph; ``arrival_ns``: when that speech was pushed (0: silence)."""

    pts: int
    picture: np.ndarray
    speech: bool
    source_pts: int
    rest: bool = False
    capture_ns: int = 0
    arrival_ns: int = 0


@dataclass
class AudioOut:
    """The speech of one 20 ms chunk at its original rate: ``samples`` ``int16 [N]`` mono at ``sample_rate``
    Hz, heard from session time ``pts``; ``segment`` its utterance; ``arrival_ns`` when it was pushed."""

    pts: int
    samples: np.ndarray
    sample_rate: int
    segment: object
    arrival_ns: int = 0


@dataclass
class SegmentEvent:
    """``kind`` ``"started"`` (before the segment's first audio) or ``"ended"`` (after its last)."""

    kind: str
    segment: object
    pts: int


class SessionOutput(Stage):
    """The session's sink: pictures and the echoed audio in, :class:`VideoOut` / :class:`AudioOut` /
    :class:`SegmentEvent` out through ``emit(list)`` in presentation order (see the module docstring).

    Args:
        source: the session's :class:`SpeechSource` (its log says what each echoed chunk was).
        size: ``(width, height)`` of the pictures.
        fps: the avatar's frame rate; ``out_fps``: the output frame rate (pictures re-timed to it).
        emit: called from the graph's thread with each batch of items, in order.
    """

    trigger = "any"

    def __init__(self, source: SpeechSource, *, size: tuple[int, int], fps: float, out_fps: float,
                 emit: Callable[[list], None], name: str = "session_out"):
        super().__init__(name)
        w, h = size
        self.inputs = {"video": PortSpec((h, w, 3), torch.uint8), "audio": PortSpec((CHUNK,), torch.int16)}
        self.source, self.fps, self.out_fps, self.emit = source, float(fps), float(out_fps), emit
        self._lock = threading.Lock()
        self._cleared_pts = -1  # audio and pictures before this pts are from before the last barge-in
        self.rest_picture: np.ndarray | None = None
        self.frames_out = self.repeated = self.replaced = self.generated = self.audio_dropped = 0

    def setup(self, ctx):
        super().setup(ctx)
        clock = ctx.clock
        self._slot = 0  # the next output frame's index
        self._prev: tuple[int, np.ndarray, int, int] | None = None  # (pts, picture, capture_ns, arrival_ns)
        self._audio: collections.deque = collections.deque()  # (ChunkInfo) held until their pictures are out
        self._speech: collections.deque = collections.deque()  # (start, end) pts of recent speech chunks
        self._chunk_ticks = clock.ticks_from_samples(CHUNK, 16_000)
        self._rest_before, self._rest_after = clock.ticks(REST_BEFORE_S), clock.ticks(REST_AFTER_S)
        self._hold = clock.ticks(MAX_AUDIO_HOLD_S)

    # ---- barge-in (any thread) ---------------------------------------------------------------------------
    def clear_before(self, pts: int) -> None:
        """Everything before ``pts`` is from before a barge-in: its audio is dropped, its pictures replaced."""
        with self._lock:
            self._cleared_pts = max(self._cleared_pts, pts)

    # ---- the graph side ----------------------------------------------------------------------------------
    def process(self, inputs, out):
        items: list = []
        with self._lock:
            cleared = self._cleared_pts
            self._audio = collections.deque(i for i in self._audio if i.pts >= cleared)
            if "audio" in inputs:
                self._on_audio(inputs["audio"].pts, cleared, items)
            if "video" in inputs:
                self._on_video(inputs["video"], cleared, items)
        if items:
            self.emit(items)

    def flush(self, out):
        items: list = []
        with self._lock:
            self._release_audio(None, items)
        if items:
            self.emit(items)

    def _on_audio(self, pts: int, cleared: int, items: list) -> None:
        info = self.source.take_info(pts)
        if info is None or pts < cleared:
            self.audio_dropped += info is not None and info.segment is not None
            return
        if info.speech:
            self._speech.append((pts, pts + self._chunk_ticks))
        if info.segment is not None:
            self._audio.append(info)
        while self._audio and self._audio[-1].pts - self._audio[0].pts > self._hold:  # no pictures for a while
            self._release_one(items)

    def _on_video(self, frame, cleared: int, items: list) -> None:
        self.generated += 1
        pts = frame.pts
        picture = frame.data.numpy().copy()
        rest = False
        if pts < cleared:  # generated from speech dropped by a barge-in: show the face at rest instead
            if self.rest_picture is None:
                return
            picture, rest = self.rest_picture, True
            self.replaced += 1
        elif self._at_rest(pts):
            self.rest_picture = picture
        current = (pts, picture, frame.capture_ns, 0)
        clock = self.ctx.clock
        while (slot_pts := clock.ticks_from_frame(self._slot, self.out_fps)) <= pts:
            shown = current if slot_pts == pts or self._prev is None else self._prev
            self.repeated += shown is not current
            self._emit_frame(slot_pts, shown, rest and shown is current, items)
            self._slot += 1
            self._release_audio(clock.ticks_from_frame(self._slot, self.out_fps), items)
        self._prev = current

    def _emit_frame(self, slot_pts: int, shown, rest: bool, items: list) -> None:
        src_pts, picture, capture_ns, _ = shown
        end = slot_pts + self.ctx.clock.ticks_from_frame(1, self.out_fps)
        speech = not rest and any(a < end and b > slot_pts for a, b in self._speech)
        arrival = next((i.arrival_ns for i in self._audio if i.speech and slot_pts <= i.pts < end), 0)
        items.append(VideoOut(slot_pts, picture, speech, src_pts, rest, capture_ns, arrival))
        self.frames_out += 1

    def _at_rest(self, pts: int) -> bool:
        while self._speech and self._speech[0][1] < pts - 2 * self._rest_before:
            self._speech.popleft()
        lo, hi = pts - self._rest_before, pts + self._rest_after
        return not any(a < hi and b > lo for a, b in self._speech)

    def _release_audio(self, before: int | None, items: list) -> None:
        while self._audio and (before is None or self._audio[0].pts < before):
            self._release_one(items)

    def _release_one(self, items: list) -> None:
        info = self._audio.popleft()
        if info.first:
            items.append(SegmentEvent("started", info.segment, info.pts))
        if info.audio is not None and len(info.audio):
            items.append(AudioOut(info.pts, info.audio, info.rate, info.segment, info.arrival_ns))
        if info.last:
            items.append(SegmentEvent("ended", info.segment, info.pts))
