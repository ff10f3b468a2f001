"""Audio in, as 16 kHz mono PCM16 chunks.

The audio comes from any file FFmpeg decodes, or as PCM pushed live by a server. Both sources have the same
output port, ``"audio"``: ``int16 [chunk_samples]``. At 16 kHz, 320 samples are 20 ms. The ``pts`` counts the
samples delivered. Audio is the master clock. The last chunk of a stream is zero-padded. Its ``length`` says
how many samples are real.
"""
from __future__ import annotations

import os
import time

import av
import numpy as np
import torch

from ..frame import PortSpec
from ..push import Pushed
from ..stage import EndOfStream, Stage
from .errors import MediaError, open_media

SAMPLE_RATE = 16_000
CHUNK_MS = 20


def chunk_samples(sample_rate: int = SAMPLE_RATE, chunk_ms: int = CHUNK_MS) -> int:
    n = sample_rate * chunk_ms
    if n % 1000:
        raise ValueError(f"{chunk_ms} ms at {sample_rate} Hz is not a whole number of samples")
    return n // 1000


def _audio_stream(container, path):
    if not container.streams.audio:
        kinds = sorted({s.type for s in container.streams}) or ["nothing"]
        raise MediaError(path, f"has no audio stream (it holds {', '.join(kinds)}); expected audio")
    return container.streams.audio[0]


def iter_pcm16(path, sample_rate: int = SAMPLE_RATE):
    """Decode ``path`` and yield int16 mono numpy blocks at ``sample_rate``.

    Raises :class:`MediaError` naming the file when it is missing, empty or not media. It also raises when the
    file has no audio or is truncated or corrupt.
    """
    container = open_media(path)
    try:
        stream = _audio_stream(container, path)
        resampler = av.AudioResampler(format="s16", layout="mono", rate=sample_rate)
        got = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    block = out.to_ndarray().reshape(-1)
                    got += len(block)
                    yield block
            for out in resampler.resample(None):
                block = out.to_ndarray().reshape(-1)
                got += len(block)
                yield block
        except av.error.FFmpegError as exc:
            raise MediaError(path, f"is truncated or corrupt after {got / sample_rate:.2f} s of audio "
                                   f"({exc})") from exc
        if got == 0:
            raise MediaError(path, "decodes to no audio samples (empty or truncated)")
    finally:
        container.close()


def decode_audio(path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The whole file as int16 mono samples at ``sample_rate``."""
    return np.concatenate(list(iter_pcm16(path, sample_rate)))


class AudioFileSource(Stage):
    """Source: decodes an audio or video file and emits 20 ms chunks of 16 kHz mono PCM16.

    Args:
        path: any file FFmpeg decodes: wav, mp3, flac, ogg, m4a, mp4 with audio and more.
        sample_rate: the output's sample rate, 16 kHz by default.
        chunk_ms: the output's chunk length, 20 ms by default. That makes 320 samples.
    The file is probed at construction, so a bad path fails before a graph is built.
    """

    def __init__(self, path, *, sample_rate: int = SAMPLE_RATE, chunk_ms: int = CHUNK_MS,
                 name: str = "audio_file", device: str = "cpu"):
        super().__init__(name)
        self.path = os.fspath(path)
        self.sample_rate = sample_rate
        self.chunk = chunk_samples(sample_rate, chunk_ms)
        self.outputs = {"audio": PortSpec((self.chunk,), torch.int16, device)}
        container = open_media(self.path)  # fail early on a bad file
        try:
            stream = _audio_stream(container, self.path)
            self.duration_s = float(stream.duration * stream.time_base) if stream.duration else (
                container.duration / 1e6 if container.duration else None)
        finally:
            container.close()
        self._blocks = None
        self._buf = np.zeros(0, np.int16)
        self._sent = 0

    def setup(self, ctx):
        super().setup(ctx)
        self._blocks = iter_pcm16(self.path, self.sample_rate)
        self._buf = np.zeros(0, np.int16)
        self._sent = 0

    def _fill(self) -> None:
        parts = [self._buf]
        have = len(self._buf)
        while have < self.chunk:
            block = next(self._blocks, None)
            if block is None:
                break
            parts.append(block)
            have += len(block)
        self._buf = np.concatenate(parts) if len(parts) > 1 else self._buf

    def process(self, inputs, out):
        if len(self._buf) < self.chunk:
            self._fill()
        n = min(self.chunk, len(self._buf))
        if n == 0:
            raise EndOfStream
        frame = out.write("audio")
        frame.data[:n] = torch.from_numpy(self._buf[:n])
        if n < self.chunk:
            frame.data[n:] = 0
        frame.length = n
        frame.pts = self.ctx.clock.ticks_from_samples(self._sent, self.sample_rate)
        self._sent += n
        self._buf = self._buf[n:]

    def teardown(self):
        if self._blocks is not None:
            self._blocks.close()
            self._blocks = None


class PushAudioSource(Pushed):
    """Source fed from outside the graph, such as a WebSocket session or a microphone callback.

    Another thread calls :meth:`push` with PCM16 mono samples at ``sample_rate``. It calls :meth:`close` at
    the end. Samples wait in a fixed buffer of ``max_buffer_ms``. If the graph falls that far behind, the
    oldest samples are dropped. ``overflow_samples`` counts them. The queue is never unbounded.
    ``capture_ns`` of each chunk is when its last sample arrived.
    """

    def __init__(self, *, sample_rate: int = SAMPLE_RATE, chunk_ms: int = CHUNK_MS,
                 max_buffer_ms: int = 2000, name: str = "audio_push", device: str = "cpu"):
        super().__init__(name)
        self.sample_rate = sample_rate
        self.chunk = chunk_samples(sample_rate, chunk_ms)
        self.outputs = {"audio": PortSpec((self.chunk,), torch.int16, device)}
        self._cap = max(self.chunk, sample_rate * max_buffer_ms // 1000)
        self._buf = np.zeros(self._cap, np.int16)
        self._chunk_buf = np.zeros(self.chunk, np.int16)
        self._chunk_tensor = torch.from_numpy(self._chunk_buf)  # shares memory with _chunk_buf
        self._start = 0  # index of the oldest buffered sample (monotonic counters, mod capacity)
        self._end = 0
        self._arrival_ns = 0
        self._sent = 0
        self.overflow_samples = 0

    def push(self, pcm) -> int:
        """Append samples: ``bytes`` of little-endian PCM16, or an int16 array.

        Returns how many samples were buffered. Raises ``ValueError`` on an odd byte count or after
        :meth:`close`.
        """
        if isinstance(pcm, (bytes, bytearray, memoryview)):
            if len(pcm) % 2:
                raise ValueError(f"PCM16 needs an even number of bytes, got {len(pcm)}")
            samples = np.frombuffer(pcm, dtype="<i2")
        else:
            samples = np.asarray(pcm)
            if samples.dtype != np.int16 or samples.ndim != 1:
                raise ValueError(f"expected a 1-D int16 array, got {samples.dtype} {samples.shape}")
        with self._cv:
            self._accepting()
            if len(samples) > self._cap:  # keep only what fits
                self.overflow_samples += len(samples) - self._cap
                samples = samples[-self._cap:]
            n = len(samples)
            overflow = (self._end - self._start) + n - self._cap
            if overflow > 0:
                self._start += overflow
                self.overflow_samples += overflow
            i = self._end % self._cap
            first = min(n, self._cap - i)
            self._buf[i:i + first] = samples[:first]
            self._buf[:n - first] = samples[first:]
            self._end += n
            self._arrival_ns = time.monotonic_ns()
            self._cv.notify_all()
        return n

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def process(self, inputs, out):
        chunk = self._chunk_buf
        with self._cv:  # after a close the rest is delivered, the last chunk zero-padded
            if not self._wait_until(lambda: self.buffered >= self.chunk) or self.buffered == 0:
                raise EndOfStream
            n = min(self.chunk, self.buffered)
            i = self._start % self._cap
            first = min(n, self._cap - i)
            chunk[:first] = self._buf[i:i + first]
            chunk[first:n] = self._buf[:n - first]
            chunk[n:] = 0
            self._start += n
            arrival_ns = self._arrival_ns
        frame = out.write("audio")  # outside the lock: it may wait on backpressure
        frame.data.copy_(self._chunk_tensor)
        frame.capture_ns = arrival_ns
        frame.length = n
        frame.pts = self.ctx.clock.ticks_from_samples(self._sent, self.sample_rate)
        self._sent += n
