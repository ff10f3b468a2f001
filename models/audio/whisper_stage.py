"""``WhisperFeatures``: Whisper encoder features per video frame, as a stage of the graph.

    AudioFileSource / PushAudioSource ──audio int16 [320]──▶ WhisperFeatures ──features float32 [D]──▶ ...

Per 20 ms chunk in, zero or more video frames out: frame ``k`` is the mean of its ``50 / fps`` Whisper rows
(:func:`~.whisper_stream.per_video_frame`), out as soon as their windows have arrived
(:class:`~.whisper_stream.StreamingWhisperFeatures`), with ``pts = clock.ticks_from_frame(k, fps)``. The same
numbers as :func:`~.whisper_stream.whisper_features` then :func:`~.whisper_stream.per_video_frame` offline. Chunks
dropped upstream are filled with silence (the pts say where each chunk belongs); the stream's end (a short chunk,
or the runtime's ``flush``) emits the frames still waiting, their look-ahead silent.
"""
from __future__ import annotations

import math

import torch

from framegraph.stream import Flag, PortSpec, Stage

from .whisper import WhisperEncoderEngine
from .whisper_stream import StreamingWhisperFeatures, WhisperWindows, per_video_frame


class WhisperFeatures(Stage):
    """Audio in (16 kHz mono PCM16 chunks), per-video-frame Whisper features out.

    Args:
        engine: a :class:`~.whisper.WhisperEncoderEngine` (None: the default model and engine).
        windows: the sliding window (:class:`~.whisper_stream.WhisperWindows`). fps: video frames per second
            (dividing 50). chunk: samples per input chunk.

    Ports: in ``"audio"`` ``int16 [chunk]``; out ``"features"`` ``float32 [D]`` on ``device``. ``reset()``
    (barge-in) starts the windows afresh; the next frame out carries ``Flag.INTERRUPTED``.
    """

    def __init__(self, engine: WhisperEncoderEngine | None = None, *, windows: WhisperWindows = WhisperWindows(),
                 fps: float = 25.0, chunk: int = 320, device: str = "cpu", name: str = "whisper_features"):
        super().__init__(name)
        per_video_frame(torch.zeros(1, 1), 1, fps)  # the frame rate checked now, not in the worker
        self.engine = engine if engine is not None else WhisperEncoderEngine()
        self.windows, self.fps, self.chunk = windows, fps, chunk
        self.rows_per_frame = int(50 / fps)
        self.inputs = {"audio": PortSpec((chunk,), torch.int16, "cpu")}
        self.outputs = {"features": PortSpec((self.engine.dim,), torch.float32, device)}
        self.samples_per_frame = 16000 * self.rows_per_frame // 50
        self.stream = StreamingWhisperFeatures(self.engine, windows)
        self.frames_out = self.gap_samples = 0
        self._start(0)

    def _start(self, frame: int) -> None:
        """A fresh stream of windows from video frame ``frame``'s first sample on."""
        self.stream.reset()
        self.rows = torch.zeros(0, self.engine.dim)  # rows not yet in a frame out
        self.base_frame, self.samples = frame, 0  # samples: pushed into this stream

    def reset(self) -> None:
        self._start(self.frames_out)  # what arrives later is placed by its pts: the timeline is kept
        self.interrupted = True

    def setup(self, ctx):
        super().setup(ctx)
        self.frames_out = self.gap_samples = 0
        self.interrupted = False
        self._start(0)

    def _emit(self, out, frames: torch.Tensor) -> None:
        for row in frames:
            f = out.write("features")
            f.data.copy_(row)
            f.pts = self.ctx.clock.ticks_from_frame(self.frames_out, self.fps)
            if self.interrupted:
                f.flags |= Flag.INTERRUPTED
                self.interrupted = False
            self.frames_out += 1

    def _push(self, out, samples) -> None:
        self.rows = torch.cat([self.rows, self.stream.push(samples)])
        whole = len(self.rows) // self.rows_per_frame
        if whole:
            self._emit(out, per_video_frame(self.rows[:whole * self.rows_per_frame], whole, self.fps))
            self.rows = self.rows[whole * self.rows_per_frame:]
        self.samples += len(samples)

    def _finish(self, out) -> None:
        rows = torch.cat([self.rows, self.stream.flush()])
        left = self.base_frame + math.ceil(self.samples / self.samples_per_frame) - self.frames_out
        if left > 0 and len(rows):
            self._emit(out, per_video_frame(rows, left, self.fps))
        self._start(self.frames_out)

    def process(self, inputs, out):
        frame = inputs["audio"]
        position = frame.pts * 16000 // self.ctx.clock.ticks_per_second - self.base_frame * self.samples_per_frame
        if position > self.samples:  # chunks were dropped upstream (or a reset): keep the timeline with silence
            self.gap_samples += position - self.samples
            self._push(out, torch.zeros(position - self.samples, dtype=torch.int16))
        self._push(out, frame.valid)
        if frame.length < self.chunk:
            self._finish(out)

    def flush(self, out):
        if self.samples:
            self._finish(out)


__all__ = ["WhisperFeatures"]
