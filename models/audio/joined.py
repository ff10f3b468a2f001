"""Joined features: the small audio encoder's per-frame features with Whisper's encoder rows beside them.

    audio int16 [320] ──▶ JoinedFeatures ──features float32 [D + W] (the encoder's D, then Whisper's W)──▶
                                        └─state float32 [4]─▶

The small :class:`~.encoder.AudioEncoder` hears sound: loudness and its spectrum. It was trained on eSpeak NG voices.
Whisper's encoder hears speech; it was trained on many hours of it.
A head fitted on both takes from each what fits the person.
Frame ``k`` leaves once both sides have it.
Whisper's window reaches ``lookahead_ms`` past the frame and comes every ``hop_ms``.
So the joined frame comes up to ``lookahead + hop`` later than the encoder's alone.
Offline with :func:`joined_features` and streamed, the same audio gives the same numbers.
"""
from __future__ import annotations

import torch

from .encoder import AudioEncoder
from .features import extract_features
from .frontend import FrameOutput
from .stage import AudioFeatures
from .whisper import WhisperEncoderEngine
from .whisper_stage import WhisperFrames
from .whisper_stream import WhisperWindows, per_video_frame, whisper_features

# Whisper's window in joined features: 1 s of context, a window every 80 ms reaching 80 ms ahead
# (docs/whisper_features.md)
JOINED_WINDOWS = WhisperWindows(context_ms=1000, hop_ms=80, lookahead_ms=80)


def joined_features(encoder: AudioEncoder, engine: WhisperEncoderEngine, audio, fps: float,
                    windows: WhisperWindows = JOINED_WINDOWS) -> torch.Tensor:
    """Offline: ``float32 [K, D + W]`` for a whole recording, with ``K = ceil(S · fps / 16000)``.

    The encoder's :func:`~.features.extract_features` come first, then Whisper's rows averaged per video frame.
    """
    ours = extract_features(encoder, audio, fps)
    rows = whisper_features(engine, audio, windows)
    return torch.cat([ours, per_video_frame(rows, len(ours), fps)], 1)


class JoinedFeatures(AudioFeatures):
    """:class:`~.stage.AudioFeatures` with Whisper's rows beside its features; see the module docstring.

    Args: those of :class:`~.stage.AudioFeatures`, and ``whisper``, a :class:`~.whisper.WhisperEncoderEngine`, with
    its ``windows``.

    Ports: in ``"audio"`` ``int16 [chunk]``. Out ``"features"`` ``float32 [D + W]`` and ``"state"`` ``float32 [4]``.
    A frame's state leaves with its features. Both wait for Whisper's window.
    ``reset()`` is for barge-in. It starts both sides afresh.
    The frame numbers go on, so the two stay paired.
    """

    def __init__(self, model: AudioEncoder | str | None = None, *, whisper: WhisperEncoderEngine,
                 windows: WhisperWindows = JOINED_WINDOWS, name: str = "joined_features", **kwargs):
        super().__init__(model, name=name, **kwargs)
        self.whisper = WhisperFrames(whisper, windows, self.fps)
        self.encoder_dim = self.model.feature_dim
        spec = self.outputs["features"]
        self.outputs = {**self.outputs, "features": type(spec)((self.encoder_dim + whisper.dim,), spec.dtype,
                                                               spec.device)}
        self._waiting: list[FrameOutput] = []  # the encoder's frames, in order, until Whisper's row comes
        self._rows: dict[int, torch.Tensor] = {}
        self._last_row: torch.Tensor | None = None

    def setup(self, ctx):
        super().setup(ctx)
        self.whisper.restart()
        self._waiting, self._rows, self._last_row = [], {}, None

    def reset(self) -> None:
        super().reset()
        self.whisper.reset()

    def process(self, inputs, out):
        frame = inputs["audio"]
        self._take(self.whisper.push(frame.pts * self.sample_rate // self.ctx.clock.ticks_per_second, frame.valid))
        if frame.length < self.chunk:
            self._take(self.whisper.finish())
        super().process(inputs, out)  # the encoder's frames: _emit, below, pairs them
        self._pair(out)

    def flush(self, out):
        super().flush(out)
        if self.whisper.pending:
            self._take(self.whisper.finish())
        self._pair(out, final=True)

    def _take(self, rows) -> None:
        for k, row in rows:
            self._rows[k] = row

    def _emit(self, out, r: FrameOutput) -> None:
        self._waiting.append(r)

    def _pair(self, out, final: bool = False) -> None:
        """Send each waiting frame whose Whisper row has come.

        A frame Whisper has already passed without making takes the nearest earlier row.
        At the end every frame leaves, with the last row.
        """
        while self._waiting:
            r = self._waiting[0]
            row = self._rows.pop(r.index, None)
            if row is None:
                earlier = [k for k in self._rows if k < r.index]
                later = any(k > r.index for k in self._rows) or self.whisper.frames_out > r.index
                if not (later or final):
                    return
                row = self._rows[max(earlier)] if earlier else self._last_row
            self._waiting.pop(0)
            for k in [k for k in self._rows if k < r.index]:
                del self._rows[k]
            self._last_row = row
            self._send_joined(out, r, row)

    def _send_joined(self, out, r: FrameOutput, row: torch.Tensor | None) -> None:
        if row is None:
            row = torch.zeros(self.whisper.engine.dim)
        self._send(out, r, torch.cat([r.features, row]))


__all__ = ["JOINED_WINDOWS", "joined_features", "JoinedFeatures"]
