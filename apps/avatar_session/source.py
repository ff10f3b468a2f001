"""``SpeechSource``: the avatar session's audio source — speech segments when there are any, silence between.

    push(segment, samples16k, original) ─▶ [segments, in order] ─▶ 20 ms chunk every 20 ms of the clock ─▶ "audio"

A segment is one utterance, a TTS response. It holds its 16 kHz mono samples for the graph. It holds the same
audio at its original rate for the listener.

Every 20 ms of the session clock the source emits one 320-sample chunk. The graph paces it in real time; the
pts are counted from samples. The chunk is the next 20 ms of the current segment. When no segment is playing it
is silence. So the graph keeps drawing the idle or listening face between utterances. It never shows a frozen picture.

A segment starts playing once ``start_buffer`` samples are in, or once it ended. So a TTS delivering at real time does
not stall mid-word. The first jitter does not stop it. A segment may run dry mid-way when its TTS is slower than real
time. It then gets silence until more arrives.

What each chunk was is logged as a :class:`ChunkInfo`. The entry holds the original-rate audio it stands for. The output
stage takes the entries in pts order when the chunk's echo reaches it. See :meth:`SpeechSource.take_info`.
The barge-in, :meth:`clear`, drops every queued segment. It returns the pts from which chunks are post-clear.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from framegraph.stream import EndOfStream, PortSpec, Pushed
from framegraph.stream.media import SAMPLE_RATE, chunk_samples

CHUNK = chunk_samples()  # 320 samples: 20 ms at 16 kHz


@dataclass
class ChunkInfo:
    """One emitted chunk.

    - ``pts``: in ticks.
    - ``segment``: None for silence between segments.
    - ``speech``: 16 kHz samples of speech in it. It is 0 for silence, and for a segment that ran dry.
    - ``first`` / ``last``: the segment's first / last chunk.
    - ``audio``: ``int16 [N]``, the original-rate samples it stands for, at ``rate`` Hz.
    - ``arrival_ns``: when its first speech sample was pushed, monotonic. 0 for silence."""

    pts: int
    segment: object = None
    speech: int = 0
    first: bool = False
    last: bool = False
    audio: np.ndarray | None = None
    rate: int = SAMPLE_RATE
    arrival_ns: int = 0


@dataclass
class _Segment:
    key: object
    rate: int
    pcm16: collections.deque = field(default_factory=collections.deque)  # int16 arrays at 16 kHz
    original: collections.deque = field(default_factory=collections.deque)  # int16 arrays at ``rate``
    arrivals: collections.deque = field(default_factory=collections.deque)  # (16 kHz end offset, arrival ns)
    buffered: int = 0  # 16 kHz samples not yet emitted
    pushed: int = 0  # 16 kHz samples pushed in all
    emitted: int = 0  # 16 kHz samples emitted
    original_buffered: int = 0
    original_emitted: int = 0
    ended: bool = False
    playing: bool = False


def _take(parts: collections.deque, n: int) -> np.ndarray:
    """The first ``n`` samples of a deque of int16 arrays, removed from it."""
    out, got = [], 0
    while got < n and parts:
        head = parts[0]
        if len(head) <= n - got:
            out.append(parts.popleft())
            got += len(head)
        else:
            out.append(head[:n - got])
            parts[0] = head[n - got:]
            got = n
    return np.concatenate(out) if out else np.zeros(0, np.int16)


class SpeechSource(Pushed):
    """Source of the avatar session; see the module docstring.

    ``push`` / ``end_segment`` / ``clear`` may be called from any thread.

    Args:
        start_buffer_ms: a segment starts playing once this much of it is buffered, or once it ended.
        max_buffer_s: at most this much speech, at 16 kHz, waits. A push beyond it raises ``ValueError``.
        log_capacity: chunks logged for the output stage. It is bounded; older entries are dropped.
    """

    def __init__(self, *, start_buffer_ms: float = 40.0, max_buffer_s: float = 120.0, log_capacity: int = 4096,
                 name: str = "speech"):
        super().__init__(name)
        if start_buffer_ms < 0 or max_buffer_s <= 0:
            raise ValueError(f"SpeechSource: start_buffer_ms={start_buffer_ms} must be >= 0 and "
                             f"max_buffer_s={max_buffer_s} > 0")
        self.outputs = {"audio": PortSpec((CHUNK,), torch.int16)}
        self.start_buffer = max(1, round(start_buffer_ms * SAMPLE_RATE / 1000))
        self.max_buffer = round(max_buffer_s * SAMPLE_RATE)
        self._segments: collections.deque[_Segment] = collections.deque()
        self._log: collections.deque[ChunkInfo] = collections.deque(maxlen=log_capacity)
        self._chunk = torch.zeros(CHUNK, dtype=torch.int16)
        self._sent = 0  # samples emitted (pts), speech and silence
        self.underrun_chunks = 0

    # ---- the feeding side (any thread) ---------------------------------------------------------------------
    def push(self, key, pcm16: np.ndarray, original: np.ndarray, rate: int) -> int:
        """Append audio to segment ``key``. Returns the 16 kHz samples buffered in all.

        A new key opens a new segment after the others. It ends those still open. A TTS speaks one
        response at a time. ``pcm16`` is int16 [S] at 16 kHz, for the graph. ``original`` is int16 [N] at
        ``rate`` Hz, what the listener hears."""
        with self._cv:
            self._accepting()
            buffered = sum(s.buffered for s in self._segments)
            if buffered + len(pcm16) > self.max_buffer:
                raise ValueError(f"{self.name}: {(buffered + len(pcm16)) / SAMPLE_RATE:.1f} s of speech would wait "
                                 f"to be spoken; at most {self.max_buffer / SAMPLE_RATE:.0f} s may be queued")
            seg = self._segments[-1] if self._segments and self._segments[-1].key == key else None
            if seg is None or seg.ended:
                for s in self._segments:
                    s.ended = True
                seg = _Segment(key, int(rate))
                self._segments.append(seg)
            elif seg.rate != rate:
                raise ValueError(f"{self.name}: segment {key!r} changed its sample rate from {seg.rate} to {rate} Hz; "
                                 f"expected one rate per segment")
            if len(pcm16):
                seg.pcm16.append(pcm16)
                seg.buffered += len(pcm16)
                seg.pushed += len(pcm16)
                seg.arrivals.append((seg.pushed, time.monotonic_ns()))
            if len(original):
                seg.original.append(original)
                seg.original_buffered += len(original)
            self._cv.notify_all()
            return buffered + len(pcm16)

    def end_segment(self, key) -> bool:
        """No more audio for segment ``key``: it plays out what it has. False when no such segment is queued."""
        with self._cv:
            for s in self._segments:
                if s.key == key:
                    s.ended = True
                    return True
            return False

    def close(self) -> None:
        """No more input: every queued segment is complete. The source ends once they have played out."""
        with self._cv:
            for s in self._segments:
                s.ended = True
        super().close()

    def clear(self) -> tuple[int, list]:
        """Barge-in: drop every queued segment.

        Returns the pts of the next chunk and the keys dropped. Every chunk from that pts on is post-clear."""
        with self._cv:
            keys = [s.key for s in self._segments]
            self._segments.clear()
            return self.ctx.clock.ticks_from_samples(self._sent, SAMPLE_RATE) if self.ctx else 0, keys

    @property
    def queued_samples(self) -> int:
        """16 kHz speech samples waiting to be spoken."""
        with self._cv:
            return sum(s.buffered for s in self._segments)

    def take_info(self, pts: int) -> ChunkInfo | None:
        """The log entry of the chunk at ``pts``. Entries before it, never delivered, are discarded."""
        with self._cv:
            while self._log and self._log[0].pts < pts:
                self._log.popleft()
            if self._log and self._log[0].pts == pts:
                return self._log.popleft()
            return None

    # ---- the graph side ----------------------------------------------------------------------------------
    def setup(self, ctx):
        super().setup(ctx)
        self._sent = 0
        self._log.clear()

    def process(self, inputs, out):
        with self._cv:
            if self._interrupted or (self._closed and not self._segments):
                raise EndOfStream
            info = self._next_chunk()
            self._log.append(info)
            self._sent += CHUNK  # under the lock: a barge-in from now on clears from the next chunk, not this one
        frame = out.write("audio")  # outside the lock: it may wait on backpressure
        frame.data.copy_(self._chunk)
        frame.length = CHUNK  # a short last chunk is padded: the graph's timeline stays on whole chunks
        frame.capture_ns = time.monotonic_ns()  # live from now: a queued segment is not "late" audio
        frame.pts = info.pts

    def _next_chunk(self) -> ChunkInfo:
        """Under the lock: fill ``self._chunk`` with the next 20 ms and describe it."""
        info = ChunkInfo(self.ctx.clock.ticks_from_samples(self._sent, SAMPLE_RATE))
        self._chunk.zero_()
        seg = self._segments[0] if self._segments else None
        if seg is not None and not seg.playing and (seg.buffered >= self.start_buffer or seg.ended):
            seg.playing, info.first = True, True
        if seg is None or not seg.playing:
            return info
        info.segment, info.rate = seg.key, seg.rate
        if seg.buffered < CHUNK and not seg.ended:
            self.underrun_chunks += 1  # the segment ran dry: silence until more of it arrives
            return info
        n = min(CHUNK, seg.buffered)
        self._chunk[:n] = torch.from_numpy(_take(seg.pcm16, n))
        while seg.arrivals and seg.arrivals[0][0] <= seg.emitted:
            seg.arrivals.popleft()
        info.arrival_ns = seg.arrivals[0][1] if seg.arrivals else 0
        seg.buffered -= n
        seg.emitted += n
        info.speech = n
        info.last = seg.ended and seg.buffered == 0
        # the original-rate audio these samples stand for (all of what is left with the last chunk)
        due = seg.original_buffered if info.last else min(
            seg.original_buffered, round(seg.emitted * seg.rate / SAMPLE_RATE) - seg.original_emitted)
        info.audio = _take(seg.original, max(0, due))
        seg.original_buffered -= len(info.audio)
        seg.original_emitted += len(info.audio)
        if info.last:
            self._segments.popleft()
        return info
