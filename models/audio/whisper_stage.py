"""``WhisperFeatures``: Whisper encoder features per video frame, as a stage of the graph.

    AudioFileSource / PushAudioSource ──audio int16 [320]──▶ WhisperFeatures ──features float32 [D]──▶ ...

Per 20 ms chunk in, zero or more video frames come out.
Frame ``k`` is the mean of its ``50 / fps`` Whisper rows; see :func:`~.whisper_stream.per_video_frame`.
It leaves as soon as their windows have arrived; see :class:`~.whisper_stream.StreamingWhisperFeatures`.
Its pts is ``clock.ticks_from_frame(k, fps)``.
The numbers equal :func:`~.whisper_stream.whisper_features` then :func:`~.whisper_stream.per_video_frame` offline.
Chunks dropped upstream are filled with silence; the pts say where each chunk belongs.
The stream's end is a short chunk or the runtime's ``flush``.
It emits the frames still waiting, their look-ahead silent.
"""
from __future__ import annotations

import math

import torch

from framegraph.stream import Flag, PortSpec, Stage

from .whisper import WhisperEncoderEngine
from .whisper_stream import StreamingWhisperFeatures, WhisperWindows, per_video_frame


class WhisperFrames:
    """Audio on the stream's timeline → Whisper features per video frame, numbered.

    It holds the windows and the frame bookkeeping.
    :class:`WhisperFeatures` and the joined features of :class:`~.joined.JoinedFeatures` share it.

    ``push(position, samples)`` takes int16 ``samples`` whose first sample is sample ``position`` of the stream.
    A gap since the last push is filled with silence.
    It returns ``[(k, row float32 [D])]``, the video frames whose windows are complete.
    ``finish()`` is for a paused stream: a short chunk, or the end.
    It returns the frames still waiting, their look-ahead silent. The next push starts fresh windows.
    ``reset()`` is for barge-in. It does the same from the next frame on.
    """

    def __init__(self, engine: WhisperEncoderEngine, windows: WhisperWindows, fps: float):
        per_video_frame(torch.zeros(1, 1), 1, fps)  # the frame rate checked now, not in a worker
        self.engine, self.windows, self.fps = engine, windows, fps
        self.rows_per_frame = int(50 / fps)
        self.samples_per_frame = 16000 * self.rows_per_frame // 50
        self.stream = StreamingWhisperFeatures(engine, windows)
        self.frames_out = self.gap_samples = 0
        self._start(0)

    def _start(self, frame: int) -> None:
        """A fresh stream of windows from video frame ``frame``'s first sample on."""
        self.stream.reset()
        self.rows = torch.zeros(0, self.engine.dim)  # rows not yet in a frame out
        self.base_frame, self.samples = frame, 0  # samples: pushed into this stream

    def restart(self) -> None:
        """A new stream from sample 0."""
        self.frames_out = self.gap_samples = 0
        self._start(0)

    def reset(self) -> None:
        self._start(self.frames_out)  # what arrives later is placed by its position: the timeline is kept

    def _numbered(self, frames: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        out = [(self.frames_out + i, row) for i, row in enumerate(frames)]
        self.frames_out += len(out)
        return out

    def _push(self, samples) -> list[tuple[int, torch.Tensor]]:
        self.rows = torch.cat([self.rows, self.stream.push(samples)])
        self.samples += len(samples)
        whole = len(self.rows) // self.rows_per_frame
        if not whole:
            return []
        frames = per_video_frame(self.rows[:whole * self.rows_per_frame], whole, self.fps)
        self.rows = self.rows[whole * self.rows_per_frame:]
        return self._numbered(frames)

    def push(self, position: int, samples) -> list[tuple[int, torch.Tensor]]:
        out = []
        position -= self.base_frame * self.samples_per_frame
        if position > self.samples:  # chunks were dropped upstream (or a reset): keep the timeline with silence
            self.gap_samples += position - self.samples
            out += self._push(torch.zeros(position - self.samples, dtype=torch.int16))
        return out + self._push(samples)

    def finish(self) -> list[tuple[int, torch.Tensor]]:
        rows = torch.cat([self.rows, self.stream.flush()])
        left = self.base_frame + math.ceil(self.samples / self.samples_per_frame) - self.frames_out
        out = self._numbered(per_video_frame(rows, left, self.fps)) if left > 0 and len(rows) else []
        self._start(self.frames_out)
        return out

    @property
    def pending(self) -> bool:
        """Samples pushed since the last :meth:`finish`."""
        return self.samples > 0


class WhisperFeatures(Stage):
    """Audio in as 16 kHz mono PCM16 chunks; per-video-frame Whisper features out.

    Args:
        engine: a :class:`~.whisper.WhisperEncoderEngine`. None: the default model and engine.
        windows: the sliding window, a :class:`~.whisper_stream.WhisperWindows`.
        fps: video frames per second, dividing 50.
        chunk: samples per input chunk.

    Ports: in ``"audio"`` ``int16 [chunk]``. Out ``"features"`` ``float32 [D]`` on ``device``.
    ``reset()`` is for barge-in. It starts the windows afresh.
    The next frame out carries ``Flag.INTERRUPTED``.
    """

    def __init__(self, engine: WhisperEncoderEngine | None = None, *, windows: WhisperWindows = WhisperWindows(),
                 fps: float = 25.0, chunk: int = 320, device: str = "cpu", name: str = "whisper_features"):
        super().__init__(name)
        self.engine = engine if engine is not None else WhisperEncoderEngine()
        self.frames = WhisperFrames(self.engine, windows, fps)
        self.windows, self.fps, self.chunk = windows, fps, chunk
        self.inputs = {"audio": PortSpec((chunk,), torch.int16, "cpu")}
        self.outputs = {"features": PortSpec((self.engine.dim,), torch.float32, device)}
        self.interrupted = False

    @property
    def frames_out(self) -> int:
        return self.frames.frames_out

    @property
    def gap_samples(self) -> int:
        return self.frames.gap_samples

    def reset(self) -> None:
        self.frames.reset()
        self.interrupted = True

    def setup(self, ctx):
        super().setup(ctx)
        self.frames.restart()
        self.interrupted = False

    port = "features"  # the output port's name

    def _emit(self, out, frames) -> None:
        for k, row in frames:
            f = out.write(self.port)
            f.data.copy_(row)
            f.pts = self.ctx.clock.ticks_from_frame(k, self.fps)
            if self.interrupted:
                f.flags |= Flag.INTERRUPTED
                self.interrupted = False

    def process(self, inputs, out):
        frame = inputs["audio"]
        self._emit(out, self.frames.push(frame.pts * 16000 // self.ctx.clock.ticks_per_second, frame.valid))
        if frame.length < self.chunk:
            self._emit(out, self.frames.finish())

    def flush(self, out):
        if self.frames.pending:
            self._emit(out, self.frames.finish())


__all__ = ["WhisperFrames", "WhisperFeatures"]
