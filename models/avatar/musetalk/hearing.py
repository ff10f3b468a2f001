"""MuseTalk's audio context, live: each video frame's window of Whisper's every-layer features as the audio arrives.

    audio int16 [320] ──▶ MuseTalkAudio ──context float32 [ROWS·(L + 1), D]──▶ (the UNet's cross-attention)

Offline, MuseTalk encodes 30-s segments (:func:`~.audio.every_layer_features`): a row then hears up to 30 s of
audio on both sides, which a live stream cannot wait for. Live, Whisper runs on a sliding window
(:class:`~framegraph.models.audio.whisper_stream.WhisperWindows`: ``context_ms`` of audio per window, one every
``hop_ms``, reaching ``lookahead_ms`` past it, its rows at their positions in the 30-s segment), each window's
every-layer states kept for its hop; frame ``k``
takes rows ``2k - 4 .. 2k + 5`` of those (at 25 fps; zeros before the stream's start and after its end), as
:func:`~.audio.frame_windows` takes them. So a frame leaves once the audio reaches 80 ms past its end, plus the
window's look-ahead, plus up to one hop. :func:`live_context` gives the same windows for a whole recording.
"""
from __future__ import annotations

import math

import torch

from framegraph.models.audio.joined import JoinedFeatures
from framegraph.models.audio.whisper import torch_encode
from framegraph.models.audio.whisper_stage import WhisperFeatures, WhisperFrames
from framegraph.models.audio.whisper_stream import WhisperWindows, whisper_features

from .audio import AUDIO_FPS, LEFT, ROWS, frame_windows

LIVE_WINDOWS = WhisperWindows(context_ms=1500, hop_ms=80, lookahead_ms=80)


class EveryLayerEngine:
    """Whisper's encoder returning every layer's states, flattened per row: ``engine(log_mel [B, 80, 2N])`` →
    ``float32 [B, N, (L + 1) · D]`` (the engine the sliding windows run). ``layers`` = L + 1, ``width`` = D.

    :meth:`encode_at` places each window where its rows fall in MuseTalk's 30-s segments: Whisper's position code is
    absolute, and the UNet learned the rows with theirs (``docs/musetalk.md``)."""

    def __init__(self, encoder):
        self.encoder = encoder
        self.layers, self.width = len(encoder.layers) + 1, encoder.config.d_model
        self.dim = self.layers * self.width
        self.positions = encoder.embed_positions.weight.shape[0]  # rows of a 30-s segment (1500)

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        return self._encode(log_mel, None)

    def encode_at(self, log_mel: torch.Tensor, starts: list[int] | None) -> torch.Tensor:
        """As a call, window ``b`` starting at sample ``starts[b]`` of the stream: its rows take the positions they
        have in their 30-s segment (one reaching past its segment's end, the segment's last ``N``). A window
        reaching before the stream's start is encoded from the start on (the offline segment has nothing before
        it either); its rows before the start are zeros."""
        if starts is None:
            return self._encode(log_mel, None)
        n = log_mel.shape[-1] // 2
        early = [b for b, s in enumerate(starts) if s < 0]
        whole = [b for b in range(len(starts)) if starts[b] >= 0]
        out = log_mel.new_zeros(len(starts), n, self.dim)
        if whole:
            out[whole] = self._encode(log_mel[whole], [min(starts[b] // 320 % self.positions, self.positions - n)
                                                       for b in whole])
        for b in early:
            skip = min(-starts[b] // 320, n - 1)  # rows before the stream's start
            out[b, skip:] = self._encode(log_mel[b:b + 1, :, 2 * skip:], [0])[0]
        return out

    def _encode(self, log_mel: torch.Tensor, positions: list[int] | None) -> torch.Tensor:
        with torch.inference_mode():
            return torch_encode(self.encoder, log_mel, every_layer=True, positions=positions).flatten(2)


def live_context(engine: EveryLayerEngine, audio, fps: float = 25.0, windows: WhisperWindows = LIVE_WINDOWS,
                 frames: int | None = None) -> torch.Tensor:
    """Offline: ``[N, ROWS · (L + 1), D]``, every frame's window of a whole recording (``audio`` int16 or float, 16
    kHz; N the frames it reaches into unless ``frames``) as :class:`MuseTalkAudio` streams them."""
    rows = whisper_features(engine, audio, windows)
    if frames is None:
        frames = math.ceil(len(audio) * fps / 16000)  # every frame the audio reaches into, as the stream ends
    return frame_windows(rows.reshape(len(rows), engine.layers, engine.width), fps, frames)


class ContextFrames(WhisperFrames):
    """:class:`~framegraph.models.audio.whisper_stage.WhisperFrames` whose frame ``k`` is MuseTalk's window of the
    rows (see the module docstring): ``[(k, window [ROWS · (L + 1), D])]`` once its last row has come."""

    def __init__(self, engine: EveryLayerEngine, windows: WhisperWindows, fps: float):
        per = AUDIO_FPS / fps
        if per != int(per):
            raise ValueError(f"fps={fps:g}: MuseTalk's windows step whole 50-Hz rows; the frame rate must divide 50")
        self.per, self.lead = int(per), int(per) * LEFT  # rows a frame steps, zero rows before the stream
        super().__init__(engine, windows, fps)

    def _start(self, frame: int) -> None:
        super()._start(frame)
        self.rows = torch.zeros(self.lead, self.engine.dim)  # the stream's past is silence

    def _window(self, i: int) -> torch.Tensor:
        rows = self.rows[i * self.per:i * self.per + ROWS]
        return rows.reshape(ROWS * self.engine.layers, self.engine.width)

    def _ready(self, final: bool) -> list[tuple[int, torch.Tensor]]:
        """The frames whose window is whole (``final``: every frame the samples cover, zeros after the end); the
        rows no later frame reads are dropped."""
        if final:
            left = self.base_frame + math.ceil(self.samples / self.samples_per_frame) - self.frames_out
            need = (left - 1) * self.per + ROWS if left > 0 else 0
            if need > len(self.rows):
                self.rows = torch.cat([self.rows, self.rows.new_zeros(need - len(self.rows), self.engine.dim)])
        else:
            left = (len(self.rows) - ROWS) // self.per + 1 if len(self.rows) >= ROWS else 0
        out = self._numbered(torch.stack([self._window(i) for i in range(left)])) if left > 0 else []
        self.rows = self.rows[left * self.per:]
        return out

    def _push(self, samples) -> list[tuple[int, torch.Tensor]]:
        self.rows = torch.cat([self.rows, self.stream.push(samples)])
        self.samples += len(samples)
        return self._ready(final=False)

    def finish(self) -> list[tuple[int, torch.Tensor]]:
        self.rows = torch.cat([self.rows, self.stream.flush()])
        out = self._ready(final=True) if self.samples else []
        self._start(self.frames_out)
        return out


class MuseTalkHearing(JoinedFeatures):
    """:class:`MuseTalkAudio`'s context with the avatars' speaking state beside it (the audio front's voice
    detector, :class:`~framegraph.models.audio.AudioFeatures`; its own features are not sent).

    Ports: in ``"audio"`` ``int16 [320]``; out ``"features"`` ``float32 [ROWS · (L + 1), D]`` (the frame's context)
    and ``"state"`` ``float32 [4]``, a frame's two together. ``reset()`` (barge-in) starts both afresh.
    """

    def __init__(self, engine: EveryLayerEngine, *, windows: WhisperWindows = LIVE_WINDOWS, fps: float = 25.0,
                 vad: bool = True, device: str = "cpu", name: str = "musetalk_hearing"):
        super().__init__(None, whisper=engine, windows=windows, fps=fps, vad=vad, device=device, name=name)
        self.whisper = ContextFrames(engine, windows, fps)
        spec = self.outputs["features"]
        self.outputs["features"] = type(spec)((ROWS * engine.layers, engine.width), spec.dtype, spec.device)
        self.context_shape = (ROWS * engine.layers, engine.width)

    def _send_joined(self, out, r, row: torch.Tensor | None) -> None:
        self._send(out, r, torch.zeros(self.context_shape) if row is None else row)


class MuseTalkAudio(WhisperFeatures):
    """Audio in (16 kHz mono PCM16 chunks), each video frame's MuseTalk context out (see the module docstring).

    Args: ``engine`` an :class:`EveryLayerEngine`; ``windows`` / ``fps`` / ``chunk`` / ``device`` as
    :class:`~framegraph.models.audio.whisper_stage.WhisperFeatures` takes them.

    Ports: in ``"audio"`` ``int16 [chunk]``; out ``"context"`` ``float32 [ROWS · (L + 1), D]`` (no position code),
    ``pts`` its video frame's. ``reset()`` (barge-in): the windows start afresh, the past silent.
    """

    port = "context"

    def __init__(self, engine: EveryLayerEngine, *, windows: WhisperWindows = LIVE_WINDOWS, fps: float = 25.0,
                 chunk: int = 320, device: str = "cpu", name: str = "musetalk_audio"):
        super().__init__(engine, windows=windows, fps=fps, chunk=chunk, device=device, name=name)
        self.frames = ContextFrames(engine, windows, fps)
        self.outputs = {"context": type(self.outputs["features"])((ROWS * engine.layers, engine.width),
                                                                  torch.float32, device)}


__all__ = ["ContextFrames", "EveryLayerEngine", "LIVE_WINDOWS", "MuseTalkAudio", "MuseTalkHearing", "live_context"]
