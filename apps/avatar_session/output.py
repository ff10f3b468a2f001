"""What an avatar session hands out, in presentation order, and the sink stage that puts it in that order.

    SpeechSource ──audio (echo, same pts)──────────────────────────▶ SessionOutput ──▶ [VideoOut, AudioOut, ...]
        └──▶ AudioFeatures ─▶ ... ─▶ composite ──video (pts of its audio)──▶      (by pts, at the output fps)

The echo of a chunk reaches the sink at once. Its picture comes one graph latency later. The sink holds the audio
back. It waits until the picture of the same time is out. Then it releases both: an image, then the audio of its
frame period. So the two leave stamped from the one session clock. They stay in sync, however long the models
take.

Pictures are re-timed to the output frame rate. Each output frame shows the newest picture of its time. A
picture the models skipped as stale is covered by the one before.

The cadence never waits on the models. An output frame may lack its picture two frame periods after the frame
before it. It may lack it half a second after its time. Then it shows the picture before. The models' late
picture is shown at the next frame. So the audio is never ahead of its picture. The picture stream never pauses
longer than two frame periods.

After a barge-in, :meth:`SessionOutput.clear_before`, the audio from before it is dropped. Its pictures still in
flight are replaced. The last picture of the face at rest takes their place.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from framegraph.stream import PortSpec, Stage
from framegraph.stream.media import SAMPLE_RATE

from .source import CHUNK, SpeechSource

REST_BEFORE_S = 0.3  # a picture with no speech this long before it ...
REST_AFTER_S = 0.12  # ... nor this long after (the audio encoder's look-ahead) shows the face at rest
MAX_AUDIO_HOLD_S = 0.5  # an output frame waits at most this long after its time for its picture (and its audio)
GAP_FRAMES = 2  # ... nor longer than this many frame periods after the output frame before it


@dataclass
class VideoOut:
    """One output frame.

    - ``picture``: ``uint8 [H, W, 3]`` at session time ``pts``, in clock ticks.
    - ``speech``: speech audio falls in its frame period.
    - ``source_pts``: the pts of the generated picture it shows. Below ``pts`` when repeated.
    - ``rest``: the face-at-rest picture, put in for one generated before a barge-in.
    - ``capture_ns``: when its audio entered the graph.
    - ``arrival_ns``: when that speech was pushed. 0 for silence."""

    pts: int
    picture: np.ndarray
    speech: bool
    source_pts: int
    rest: bool = False
    capture_ns: int = 0
    arrival_ns: int = 0


@dataclass
class AudioOut:
    """The speech of one 20 ms chunk at its original rate.

    ``samples`` is ``int16 [N]`` mono at ``sample_rate`` Hz, heard from session time ``pts``. ``segment`` is its
    utterance. ``arrival_ns`` is when it was pushed."""

    pts: int
    samples: np.ndarray
    sample_rate: int
    segment: object
    arrival_ns: int = 0


@dataclass
class SegmentEvent:
    """``kind`` is ``"started"``, before the segment's first audio, or ``"ended"``, after its last."""

    kind: str
    segment: object
    pts: int


class SessionOutput(Stage):
    """The session's sink: pictures and the echoed audio in, items out in presentation order.

    The items are :class:`VideoOut`, :class:`AudioOut` and :class:`SegmentEvent`. They go out through
    ``emit(list)``. See the module docstring.

    Args:
        source: the session's :class:`SpeechSource`. Its log says what each echoed chunk was.
        size: ``(width, height)`` of the pictures.
        fps: the avatar's frame rate. ``out_fps``: the output frame rate; pictures are re-timed to it.
        video_delay_s: each picture leaves this long after the audio of its time. With 0 they leave together. It
            is for a transport whose audio path is slower than its video path. Otherwise the player shows lips
            before their sound.
        emit: called from the graph's thread with each batch of items, in order.
    """

    trigger = "any"

    def __init__(self, source: SpeechSource, *, size: tuple[int, int], fps: float, out_fps: float,
                 emit: Callable[[list], None], video_delay_s: float = 0.0, name: str = "session_out"):
        super().__init__(name)
        w, h = size
        self.inputs = {"video": PortSpec((h, w, 3), torch.uint8), "audio": PortSpec((CHUNK,), torch.int16)}
        self.source, self.fps, self.out_fps, self.emit = source, float(fps), float(out_fps), emit
        if not 0 <= video_delay_s <= MAX_AUDIO_HOLD_S:
            raise ValueError(f"video_delay_s={video_delay_s}; expected 0..{MAX_AUDIO_HOLD_S} s")
        self.video_delay_s = video_delay_s
        self._lock = threading.Lock()
        self._cleared_pts = -1  # audio and pictures before this pts are from before the last barge-in
        self.rest_picture: np.ndarray | None = None
        self.frames_out = self.repeated = self.replaced = self.generated = self.audio_dropped = self.late = 0

    def setup(self, ctx):
        super().setup(ctx)
        clock = ctx.clock
        self._slot = 0  # the next output frame's index
        self._prev: tuple[int, np.ndarray, int] | None = None  # (pts, picture, capture_ns) of the last picture
        self._audio: collections.deque = collections.deque()  # ChunkInfo held until the pictures before them leave
        self._video: collections.deque = collections.deque()  # VideoOut waiting for the audio before them
        self._heard_to = 0  # every chunk before this pts has been echoed
        self._speech: collections.deque = collections.deque()  # (start, end, arrival ns) of recent speech chunks
        self._chunk_ticks = clock.ticks_from_samples(CHUNK, SAMPLE_RATE)
        self._rest_before, self._rest_after = clock.ticks(REST_BEFORE_S), clock.ticks(REST_AFTER_S)
        self._hold = clock.ticks(MAX_AUDIO_HOLD_S)
        self._delay = clock.ticks(self.video_delay_s)
        self._period = clock.ticks_from_frame(1, self.out_fps)  # an overdue frame is made once its period was heard
        # an output frame is due this long after the one before (echoes come each chunk: it leaves by two periods)
        self._gap = max(self._chunk_ticks, clock.ticks_from_frame(GAP_FRAMES, self.out_fps) - self._chunk_ticks)
        self._filled_at: int | None = None  # ``_heard_to`` when the last output frame was made

    # ---- barge-in (any thread) ---------------------------------------------------------------------------
    def clear_before(self, pts: int) -> None:
        """Everything before ``pts`` is from before a barge-in. Its audio is dropped and its pictures replaced."""
        with self._lock:
            self._cleared_pts = max(self._cleared_pts, pts)

    def rest_now(self) -> list:
        """Right after a barge-in, the next output frame shows the face at rest, now. Returns the items due.

        The models take a few frames to pick up again after their reset."""
        items: list = []
        with self._lock:
            if self.rest_picture is None or self.ctx is None:
                return items
            self._drop_cleared()
            slot_pts = self.ctx.clock.ticks_from_frame(self._slot, self.out_fps)
            self._prev = (slot_pts, self.rest_picture, 0)
            self._video.append(VideoOut(slot_pts, self.rest_picture, False, slot_pts, True))
            self._slot += 1
            self._filled_at = self._heard_to
            self._release(items)
        return items

    # ---- the graph side ----------------------------------------------------------------------------------
    def process(self, inputs, out):
        items: list = []
        with self._lock:
            cleared = self._drop_cleared()
            if "audio" in inputs:
                self._on_audio(inputs["audio"].pts, cleared)
            if "video" in inputs:
                self._on_video(inputs["video"], cleared)
            self._fill_due()
            self._release(items)
        if items:
            self.emit(items)

    def flush(self, out):
        items: list = []
        with self._lock:
            self._release(items, final=True)
        if items:
            self.emit(items)

    def _drop_cleared(self) -> int:
        """Under the lock: drop held audio from before the last barge-in. Replace held pictures. Returns its pts."""
        cleared = self._cleared_pts
        if self._audio and self._audio[0].pts < cleared:
            self._audio = collections.deque(i for i in self._audio if i.pts >= cleared)
        if self._video and self._video[0].pts < cleared:
            self._video = collections.deque(self._rested(v, cleared) for v in self._video)
        return cleared

    def _rested(self, v: VideoOut, cleared: int) -> VideoOut:
        if v.pts >= cleared or v.rest or self.rest_picture is None:
            return v
        self.replaced += 1
        return VideoOut(v.pts, self.rest_picture, False, v.source_pts, True, v.capture_ns)

    def _on_audio(self, pts: int, cleared: int) -> None:
        info = self.source.take_info(pts)
        self._heard_to = max(self._heard_to, pts + self._chunk_ticks)
        if info is None or pts < cleared:
            self.audio_dropped += info is not None and info.segment is not None
            return
        if info.speech:
            self._speech.append((pts, pts + self._chunk_ticks, info.arrival_ns))
        if info.segment is not None:
            self._audio.append(info)

    def _on_video(self, frame, cleared: int) -> None:
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
        current = (pts, picture, frame.capture_ns)
        clock = self.ctx.clock
        if self._slot and pts <= clock.ticks_from_frame(self._slot - 1, self.out_fps):
            self.late += 1  # its output frame left without it (the picture before stood in): the next one shows it
        while (slot_pts := clock.ticks_from_frame(self._slot, self.out_fps)) <= pts:
            shown = current if slot_pts == pts or self._prev is None else self._prev
            self.repeated += shown is not current
            self._video.append(self._frame(slot_pts, shown, rest and shown is current))
            self._slot += 1
            self._filled_at = self._heard_to
        self._prev = current

    def _fill_due(self) -> None:
        """Under the lock: make the output frames whose picture is overdue. They show the picture before.

        A picture is overdue two frame periods after the frame before. It is also overdue ``MAX_AUDIO_HOLD_S``
        after its time.
        The frame is made once all of its period's audio has been heard. That audio leaves right after it."""
        if self._prev is None or self._filled_at is None:
            return
        clock = self.ctx.clock
        while True:
            slot_pts = clock.ticks_from_frame(self._slot, self.out_fps)
            heard = self._heard_to - slot_pts - self._delay  # how long ago its time was heard
            if heard < self._period or (heard < self._hold and self._heard_to - self._filled_at < self._gap):
                return
            self.repeated += 1
            self._video.append(self._frame(slot_pts, self._prev, False))
            self._slot += 1
            self._filled_at = self._heard_to

    def _frame(self, slot_pts: int, shown, rest: bool) -> VideoOut:
        src_pts, picture, capture_ns = shown
        end = slot_pts + self.ctx.clock.ticks_from_frame(1, self.out_fps)
        overlapping = [s for s in self._speech if s[0] < end and s[1] > slot_pts]
        speech = not rest and bool(overlapping)
        arrival = overlapping[0][2] if speech else 0
        return VideoOut(slot_pts, picture, speech, src_pts, rest, capture_ns, arrival)

    def _at_rest(self, pts: int) -> bool:
        while self._speech and self._speech[0][1] < pts - 2 * self._rest_before:
            self._speech.popleft()
        lo, hi = pts - self._rest_before, pts + self._rest_after
        return not any(a < hi and b > lo for a, b, _ in self._speech)

    def _release(self, items: list, final: bool = False) -> None:
        """Release what is due, in presentation order.

        A picture at pts ``v`` counts as at ``v + delay``. It leaves once every chunk before that has been echoed.
        Its audio must have left too. Audio at ``p`` leaves once every picture before ``p`` has. The pictures still to
        come start at the next output frame. So audio never leaves before its picture."""
        next_key = self.ctx.clock.ticks_from_frame(self._slot, self.out_fps) + self._delay
        while True:
            a = self._audio[0] if self._audio else None
            v = self._video[0] if self._video else None
            v_key = v.pts + self._delay if v is not None else None
            if v is not None and (a is None or v_key <= a.pts) and (final or self._heard_to >= v_key):
                items.append(self._video.popleft())
                self.frames_out += 1
            elif a is not None and (v is None or a.pts < v_key) and (final or a.pts < next_key):
                self._release_one(items)
            else:
                return

    def _release_one(self, items: list) -> None:
        info = self._audio.popleft()
        if info.first:
            items.append(SegmentEvent("started", info.segment, info.pts))
        if info.audio is not None and len(info.audio):
            items.append(AudioOut(info.pts, info.audio, info.rate, info.segment, info.arrival_ns))
        if info.last:
            items.append(SegmentEvent("ended", info.segment, info.pts))
