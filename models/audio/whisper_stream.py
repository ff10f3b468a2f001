"""Whisper encoder features over a sliding window. Offline training and live streaming use the same windows.

Feature row ``f`` at 50 Hz stands for samples ``[320 f, 320 (f + 1))``.
Window ``w`` is the ``context`` samples that end ``lookahead`` samples after hop ``w``'s end.
That is ``[(w + 1) · hop + lookahead - context, (w + 1) · hop + lookahead)``.
It holds zeros before the stream's start and, at its end, after it.
Whisper's log-mel and encoder run on it. Its ``hop / 320`` rows for hop ``w`` are kept.
So a row depends only on its own window.
:func:`whisper_features` runs all windows at once.
:class:`StreamingWhisperFeatures` runs each window as soon as its audio has arrived.
Both give the same numbers. Live, a row adds its ``lookahead`` plus up to one hop of latency.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .features import as_float_audio
from .whisper import FRAME_SAMPLES, HOP, whisper_log_mel


@dataclass(frozen=True)
class WhisperWindows:
    """The sliding window: ``context_ms`` of audio per window, a new one every ``hop_ms``.

    Each window reaches ``lookahead_ms`` past its hop's end.
    All are multiples of 20 ms, and ``context_ms ≥ hop_ms + lookahead_ms``.
    """

    context_ms: int = 1500
    hop_ms: int = 80
    lookahead_ms: int = 80

    def __post_init__(self):
        for name in ("context_ms", "hop_ms", "lookahead_ms"):
            v = getattr(self, name)
            if v < 0 or v % 20:
                raise ValueError(f"WhisperWindows {name}={v}: expected a multiple of 20 ms (one encoder frame)")
        if self.hop_ms <= 0 or self.context_ms < self.hop_ms + self.lookahead_ms or self.context_ms > 30000:
            raise ValueError(f"WhisperWindows: need 0 < hop ({self.hop_ms}) and hop + lookahead "
                             f"({self.hop_ms + self.lookahead_ms}) <= context ({self.context_ms}) <= 30000 ms")

    @property
    def context(self) -> int:
        return self.context_ms * 16

    @property
    def hop(self) -> int:
        return self.hop_ms * 16

    @property
    def lookahead(self) -> int:
        return self.lookahead_ms * 16

    def end(self, w: int) -> int:
        """The sample at which window ``w`` ends, exclusive."""
        return (w + 1) * self.hop + self.lookahead

    def kept(self) -> slice:
        """The encoder rows of a window that are its hop's."""
        first = (self.context - self.hop - self.lookahead) // FRAME_SAMPLES
        return slice(first, first + self.hop // FRAME_SAMPLES)


def _window(audio: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """``audio[start:start + length]`` with zeros where it falls outside ``[0, len(audio))``."""
    lo, hi = max(start, 0), min(start + length, len(audio))
    out = torch.zeros(length)
    if hi > lo:
        out[lo - start:hi - start] = audio[lo:hi]
    return out


def encode_windows(engine, windows: list[torch.Tensor], spec: WhisperWindows,
                   starts: list[int] | None = None) -> torch.Tensor:
    """Each window ``[context]`` → its kept rows, ``[len(windows) · hop / 320, D]`` in all.

    ``starts`` holds each window's first sample in the stream.
    An engine with ``encode_at(log_mel, starts)`` uses it to place a window where it falls in the stream.
    Other engines see each window on its own.
    """
    mel = whisper_log_mel(torch.stack(windows))  # [W, 80, context / 160]
    assert mel.shape[-1] == spec.context // HOP
    encoded = engine.encode_at(mel, starts) if starts is not None and hasattr(engine, "encode_at") else engine(mel)
    return encoded[:, spec.kept()].flatten(0, 1)


def whisper_features(engine, audio, spec: WhisperWindows = WhisperWindows(), *, batch: int = 16) -> torch.Tensor:
    """``audio`` → ``float32 [ceil(S / 320), D]``: every window at once; see the module docstring.

    ``audio`` is int16 or float at 16 kHz. ``engine`` is a :class:`~.whisper.WhisperEncoderEngine`.
    """
    x = as_float_audio(audio)
    rows = math.ceil(len(x) / FRAME_SAMPLES)
    count = math.ceil(len(x) / spec.hop)
    starts = [spec.end(w) - spec.context for w in range(count)]
    wins = [_window(x, start, spec.context) for start in starts]
    parts = [encode_windows(engine, wins[i:i + batch], spec, starts[i:i + batch]) for i in range(0, count, batch)]
    return torch.cat(parts)[:rows] if parts else torch.zeros(0, engine.dim)


class StreamingWhisperFeatures:
    """Audio chunk by chunk in, feature rows out as soon as their window has arrived.

    ``push(samples)`` → ``float32 [k, D]`` with k ≥ 0.
    ``flush()`` → the rows still waiting, their look-ahead filled with silence.
    Rows equal :func:`whisper_features`' for the same stream.
    """

    def __init__(self, engine, spec: WhisperWindows = WhisperWindows()):
        self.engine, self.spec = engine, spec
        self.reset()

    def reset(self) -> None:
        self.buffer = torch.zeros(0)  # the stream's samples from sample ``self.offset`` on
        self.offset, self.total, self.next_window = 0, 0, 0

    def _take(self, last: int) -> torch.Tensor:
        """Windows ``next_window .. last - 1``, encoded. The buffer is trimmed to what later windows need."""
        wins, starts = [], []
        for w in range(self.next_window, last):
            start = self.spec.end(w) - self.spec.context
            wins.append(_window(self.buffer, start - self.offset, self.spec.context))  # zeros before 0
            starts.append(start)
        self.next_window = last
        keep_from = max(self.spec.end(last) - self.spec.context, 0)
        if keep_from > self.offset:
            self.buffer, self.offset = self.buffer[keep_from - self.offset:], keep_from
        return encode_windows(self.engine, wins, self.spec, starts) if wins else torch.zeros(0, self.engine.dim)

    def push(self, samples) -> torch.Tensor:
        x = as_float_audio(samples)
        self.buffer = torch.cat([self.buffer, x])
        self.total += len(x)
        ready = 0
        while self.spec.end(ready) <= self.total:
            ready += 1
        return self._take(max(ready, self.next_window))

    def flush(self) -> torch.Tensor:
        """The rows of the windows not yet complete, up to the stream's last sample, cut to its length."""
        rows_before = self.next_window * self.spec.hop // FRAME_SAMPLES
        out = self._take(max(math.ceil(self.total / self.spec.hop), self.next_window))
        return out[:max(math.ceil(self.total / FRAME_SAMPLES) - rows_before, 0)]




def per_video_frame(rows: torch.Tensor, frames: int, fps: float) -> torch.Tensor:
    """50-Hz rows ``[R, D]`` → ``[frames, D]``.

    Video frame ``k`` is the mean of those of its ``50 / fps`` rows that exist.
    A frame past the last row repeats it. ``fps`` must divide 50.
    """
    per = 50 / fps
    if per != int(per) or per < 1:
        raise ValueError(f"fps={fps:g}: Whisper's rows come at 50 Hz, so the video's frame rate must divide 50 "
                         "(25, 10, 50...)")
    per = int(per)
    need = frames * per
    rows = torch.cat([rows, rows[-1:].expand(max(need - len(rows), 0), -1)])[:need]
    return rows.reshape(frames, per, -1).mean(1)


__all__ = ["WhisperWindows", "encode_windows", "whisper_features", "StreamingWhisperFeatures", "per_video_frame"]
