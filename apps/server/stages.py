"""Stages the server's pipelines are built from.

- :class:`AudioScope`: pushed microphone PCM → a live waveform and level picture per video frame.
  The audio itself passes through, so it can be played back in sync.
  It is the glass-to-glass latency probe.
- :class:`OutboxSink`: encoded video and PCM audio → the session's :class:`~.outbox.Outbox`.
  Each message gets its media header. The timings come from the frame's per-stage enter and exit times.
- :class:`CaptureTimes`: maps an input sample index back to the client's capture time of that sample.
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import torch

from framegraph.stream import TICKS_PER_SECOND, Flag, PortSpec, Stage
from framegraph.stream.media import CHUNK_MS, SAMPLE_RATE, chunk_samples

from .outbox import AUDIO, VIDEO, Item, Outbox
from .protocol import Kind, MediaFlag, MediaHeader

TICKS_PER_SAMPLE = TICKS_PER_SECOND // SAMPLE_RATE  # 3


class AudioScope(Stage):
    """``int16 [chunk]`` audio in → a ``uint8 [H, W, 3]`` scope picture per video frame period.

    The same audio goes out too.

    The background brightens with the loudness of the newest chunk.
    So a clap is a bright frame, easy to time glass-to-glass with a camera.
    The waveform of the last ``window_ms`` is drawn as a yellow trace.
    A green strip at the bottom scrolls the level history.
    The first chunk of each video frame period at ``fps`` emits a video frame.
    It goes out as soon as that chunk arrives, without waiting for the rest of the period.
    Its pts is that chunk's, so it plays with that audio.
    """

    def __init__(self, *, width: int, height: int, fps: float, window_ms: float = 40.0, gain: float = 1.0,
                 sample_rate: int = SAMPLE_RATE, chunk_ms: int = CHUNK_MS, name: str = "scope"):
        super().__init__(name)
        self.width, self.height, self.fps = width, height, float(fps)
        self.gain = float(gain)
        self.sample_rate = sample_rate
        self.chunk = chunk_samples(sample_rate, chunk_ms)
        self.inputs = {"audio": PortSpec((self.chunk,), torch.int16)}
        self.outputs = {"video": PortSpec((height, width, 3), torch.uint8),
                        "audio": PortSpec((self.chunk,), torch.int16)}
        per_col = max(1, math.ceil(window_ms * sample_rate / 1000 / width))
        self.window = per_col * width  # samples on screen: a whole number per column
        self.strip = max(4, height // 6)  # level-history strip at the bottom
        self.frame_ticks = TICKS_PER_SECOND / self.fps

    def setup(self, ctx):
        super().setup(ctx)
        self._samples = torch.zeros(self.window, dtype=torch.float32)
        self._history = torch.zeros(self.width, dtype=torch.float32)
        self._rows = torch.arange(self.height - self.strip, dtype=torch.float32).view(-1, 1)
        self._strip_rows = torch.arange(self.strip, dtype=torch.float32).view(-1, 1)
        self._last_frame = -1

    def reset(self):
        """Barge-in: forget the waveform and the level history."""
        self._samples.zero_()
        self._history.zero_()

    def process(self, inputs, out):
        a = inputs["audio"]
        n = a.length
        echo = out.write("audio")
        echo.data.copy_(a.data)
        echo.length = n
        x = a.data[:n].to(torch.float32) * (self.gain / 32768.0)
        if n:
            self._samples[:-n] = self._samples[n:].clone()
            self._samples[-n:] = x
        index = int(a.pts // self.frame_ticks)  # the video frame whose period this chunk starts
        if index <= self._last_frame:
            return
        self._last_frame = index
        rms = float(x.pow(2).mean().sqrt()) if n else 0.0
        level = min(1.0, max(0.0, (20 * math.log10(rms + 1e-9) + 60) / 60))  # -60..0 dBFS → 0..1
        self._history[:-1] = self._history[1:].clone()
        self._history[-1] = level
        self._draw(out.write("video").data, level)

    def _draw(self, img: torch.Tensor, level: float) -> None:
        h, w, strip = self.height, self.width, self.strip
        img[..., 0].fill_(int(20 + 120 * level))
        img[..., 1].fill_(int(20 + 140 * level))
        img[..., 2].fill_(int(40 + 200 * level))
        wave_h = h - strip
        cols = self._samples.clamp(-1, 1).view(w, -1)
        half, mid = (wave_h - 1) / 2, (wave_h - 1) / 2
        prev = torch.cat([cols[:1, 0], cols[:-1, -1]])  # join each column to the one before it
        top = (mid - torch.maximum(cols.amax(1), prev) * half).floor()
        bottom = (mid - torch.minimum(cols.amin(1), prev) * half).ceil()
        trace = (self._rows >= top) & (self._rows <= bottom)  # [wave_h, w]
        img[:wave_h][trace] = torch.tensor([255, 230, 60], dtype=torch.uint8)
        bars = self._strip_rows >= (1 - self._history) * strip  # [strip, w]
        img[wave_h:] = torch.where(bars.unsqueeze(-1), torch.tensor([60, 220, 90], dtype=torch.uint8),
                                   torch.tensor([10, 10, 10], dtype=torch.uint8))


class CaptureTimes:
    """Client capture times of pushed audio.

    They stamp output with when the audio that produced it was captured, in the client's own clock.
    This gives glass-to-glass latency without synchronized clocks.

    Its :meth:`add` records each audio message: its sample count and the capture time of its last sample.
    Its :meth:`of_sample` returns the capture time of sample ``index``, interpolated at the sample rate.
    The index counts from the first pushed sample.
    It keeps the last ``capacity`` messages.
    """

    def __init__(self, capacity: int = 1024, sample_rate: int = SAMPLE_RATE):
        self._start = np.zeros(capacity, np.int64)  # first sample index of each message
        self._end = np.zeros(capacity, np.int64)  # sample index just past each message
        self._ns = np.zeros(capacity, np.int64)  # client capture ns of each message's last sample
        self._n = 0
        self._total = 0
        self._ns_per_sample = 1e9 / sample_rate
        self._lock = threading.Lock()

    def add(self, n_samples: int, capture_ns: int) -> None:
        with self._lock:
            i = self._n % len(self._end)
            self._start[i] = self._total
            self._total += int(n_samples)
            self._end[i], self._ns[i] = self._total, int(capture_ns)
            self._n += 1

    def of_sample(self, index: int) -> int | None:
        """Client capture ns of sample ``index``. None when unknown: too old, or not stamped."""
        with self._lock:
            cap = len(self._end)
            for k in range(min(self._n, cap)):  # newest first: output is usually about recent input
                i = (self._n - 1 - k) % cap
                if self._start[i] <= index < self._end[i]:
                    if self._ns[i] <= 0:
                        return None
                    return int(self._ns[i] - (self._end[i] - 1 - index) * self._ns_per_sample)
                if index >= self._end[i]:
                    return None  # not pushed yet
            return None


class OutboxSink(Stage):
    """Sink: encoded video and ``int16`` audio chunks → the session's outbox.

    The video is ``uint8`` and variable-length: JPEG, H.264, or PNG and WebP with alpha.
    Each message gets its :class:`~.protocol.MediaHeader`.
    It never blocks. The outbox drops and counts what a slow client cannot take.

    Set before the graph starts:

    - ``outbox``, through :meth:`attach`.
    - ``capture_times``, optional: the client capture-time mapping.
    - ``timing``, optional: the stage indices whose time counts as compute or encode.
    """

    trigger = "any"

    def __init__(self, *, video_capacity: int, video_kind: Kind, audio_chunk: int | None = None,
                 name: str = "send"):
        super().__init__(name)
        self.video_kind = Kind(video_kind)
        self.inputs = {"video": PortSpec((video_capacity,), torch.uint8, variable=True)}
        if audio_chunk:
            self.inputs["audio"] = PortSpec((audio_chunk,), torch.int16)
        self.outbox: Outbox | None = None
        self.capture_times: CaptureTimes | None = None
        self.timing: dict[str, list[int]] = {"compute": [], "encode": []}
        self.sent = {VIDEO: 0, AUDIO: 0}
        self._interrupted = {VIDEO: False, AUDIO: False}
        self._last_audio_end = None

    def attach(self, outbox: Outbox, capture_times: CaptureTimes | None = None) -> None:
        self.outbox, self.capture_times = outbox, capture_times

    def mark_interrupted(self) -> None:
        """Flag the next video and audio message as the first after a barge-in."""
        self._interrupted = {VIDEO: True, AUDIO: True}

    def setup(self, ctx):
        super().setup(ctx)
        if self.outbox is None:
            raise RuntimeError(f"{self.name}: attach(outbox) before the graph starts")
        self.sent = {VIDEO: 0, AUDIO: 0}

    def process(self, inputs, out):
        now = time.monotonic_ns()
        if "audio" in inputs:
            f = inputs["audio"]
            payload = f.valid.numpy().astype("<i2", copy=False).tobytes()
            self._offer(AUDIO, Kind.PCM16, f, payload, True, now, last_sample=f.pts // TICKS_PER_SAMPLE + f.length - 1)
            self._last_audio_end = f.pts + f.length * TICKS_PER_SAMPLE
        if "video" in inputs:
            f = inputs["video"]
            key = bool(f.flags & Flag.KEYFRAME) or self.video_kind in (Kind.JPEG, Kind.PNG, Kind.WEBP)
            # the chunk that produced this frame ends one chunk after its pts (audio-driven pipelines)
            chunk = self.inputs["audio"].shape[0] if "audio" in self.inputs else 0
            self._offer(VIDEO, self.video_kind, f, f.valid.numpy().tobytes(), key, now,
                        last_sample=f.pts // TICKS_PER_SAMPLE + chunk - 1)
            if self._last_audio_end is not None and self.ctx.telemetry is not None:
                self.ctx.telemetry.record_av_offset(1000.0 * (f.pts - self._last_audio_end) / TICKS_PER_SECOND)

    def _offer(self, kind, media_kind, f, payload, keyframe, now, last_sample) -> None:
        flags = MediaFlag.KEYFRAME if keyframe and kind == VIDEO else MediaFlag.NONE
        if f.flags & Flag.DISCONTINUITY:
            flags |= MediaFlag.DISCONTINUITY
        if self._interrupted[kind]:
            flags |= MediaFlag.INTERRUPTED
            self._interrupted[kind] = False
        capture = f.capture_ns
        if self.capture_times is not None:
            client_ns = self.capture_times.of_sample(last_sample)
            if client_ns is not None:
                capture, flags = client_ns, flags | MediaFlag.CLIENT_CLOCK
        header = MediaHeader(media_kind, int(flags), self.sent[kind], f.pts, capture,
                             graph_us=(now - f.capture_ns) // 1000 if f.capture_ns else 0,
                             compute_us=self._span_us(f, "compute"), encode_us=self._span_us(f, "encode"))
        self.sent[kind] += 1
        self.outbox.offer(Item(kind, payload, header, keyframe))

    def _span_us(self, f, what: str) -> int:
        ns = f.stage_ns
        return int(sum(max(0, ns[i, 1] - ns[i, 0]) for i in self.timing[what])) // 1000

    def teardown(self):
        if self.outbox is not None:
            self.outbox.end()
