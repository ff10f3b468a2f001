"""MuseTalk's audio context, live: each video frame's window of Whisper's every-layer features as the audio arrives.

    audio int16 [320] ──▶ MuseTalkAudio ──context float32 [ROWS·(L + 1), D]──▶ (the UNet's cross-attention)

Offline, MuseTalk encodes 30-s segments; see :func:`~.audio.every_layer_features`. A row then hears up to 30 s of
audio on both sides. A live stream cannot wait for that.

Live, Whisper runs on a sliding window, a :class:`~framegraph.models.audio.whisper_stream.WhisperWindows`. A window
holds ``context_ms`` of audio. One starts every ``hop_ms`` and reaches ``lookahead_ms`` past its hop. Its rows take
their positions in the 30-s segment. Each window's every-layer states are kept for its hop.

At 25 fps, frame ``k`` takes rows ``2k - 4 .. 2k + 5`` of those, as :func:`~.audio.frame_windows` takes them. Rows
before the stream's start and after its end are zeros. So a frame leaves once the audio is 80 ms past its end. Add
the window's look-ahead and up to one hop to that. For a whole recording, :func:`live_context` gives the same
windows.
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
    """Whisper's encoder returning every layer's states, flattened per row. The sliding windows run it.

    ``engine(log_mel [B, 80, 2N])`` returns ``float32 [B, N, (L + 1) · D]``. ``layers`` is L + 1 and ``width`` is D.

    Its :meth:`encode_at` places each window where its rows fall in MuseTalk's 30-s segments. Whisper's position
    code is absolute. The UNet learned the rows with theirs; see ``docs/musetalk.md``."""

    def __init__(self, encoder):
        self.encoder = encoder
        self.layers, self.width = len(encoder.layers) + 1, encoder.config.d_model
        self.dim = self.layers * self.width
        self.positions = encoder.embed_positions.weight.shape[0]  # rows of a 30-s segment (1500)

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        return self._encode(log_mel, None)

    def encode_at(self, log_mel: torch.Tensor, starts: list[int] | None) -> torch.Tensor:
        """As a call, with window ``b`` starting at sample ``starts[b]`` of the stream.

        Its rows take the positions they have in their 30-s segment. A window reaching past its segment's end takes
        the segment's last ``N`` positions. A window reaching before the stream's start is encoded from the start
        on. The offline segment has nothing before it either. Its rows before the start are zeros."""
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
    """``[N, ROWS · (L + 1), D]``: every frame's window of a whole recording, as :class:`MuseTalkAudio` streams them.

    It runs offline. ``audio`` is int16 or float at 16 kHz. N is ``frames`` if given. Otherwise it is every frame
    the audio reaches into."""
    rows = whisper_features(engine, audio, windows)
    if frames is None:
        frames = math.ceil(len(audio) * fps / 16000)  # every frame the audio reaches into, as the stream ends
    return frame_windows(rows.reshape(len(rows), engine.layers, engine.width), fps, frames)


class ContextFrames(WhisperFrames):
    """A :class:`~framegraph.models.audio.whisper_stage.WhisperFrames` whose frames are MuseTalk's windows.

    Frame ``k`` is MuseTalk's window of the rows; see the module docstring. It comes out as
    ``(k, window [ROWS · (L + 1), D])`` once its last row has come. Raises :class:`ValueError` when ``fps`` does
    not divide 50."""

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
        """The frames whose window is whole. With ``final``, every frame the samples cover, zeros after the end.

        The rows no later frame reads are dropped."""
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
    """The context of :class:`MuseTalkAudio`, with the avatars' speaking state beside it.

    The state comes from the audio front's voice detector, :class:`~framegraph.models.audio.AudioFeatures`. That
    front's own features are not sent.

    Ports: in ``"audio"`` ``int16 [320]``. Out ``"features"`` ``float32 [ROWS · (L + 1), D]``, the frame's
    context, and ``"state"`` ``float32 [4]``. A frame's two leave together. ``reset()`` starts both afresh, as on
    a barge-in.
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
    """Audio in as 16 kHz mono PCM16 chunks, each video frame's MuseTalk context out. See the module docstring.

    Args:
        engine: an :class:`EveryLayerEngine`.
        windows: the sliding window, as :class:`~framegraph.models.audio.whisper_stage.WhisperFeatures` takes it.
        fps: video frames per second, dividing 50.
        chunk: samples per input chunk.
        device: where the context goes.

    Ports: in ``"audio"`` ``int16 [chunk]``. Out ``"context"`` ``float32 [ROWS · (L + 1), D]``, without the position
    code, at its video frame's ``pts``. ``reset()`` is for barge-in. The windows start afresh, with a silent past.
    """

    port = "context"

    def __init__(self, engine: EveryLayerEngine, *, windows: WhisperWindows = LIVE_WINDOWS, fps: float = 25.0,
                 chunk: int = 320, device: str = "cpu", name: str = "musetalk_audio"):
        super().__init__(engine, windows=windows, fps=fps, chunk=chunk, device=device, name=name)
        self.frames = ContextFrames(engine, windows, fps)
        self.outputs = {"context": type(self.outputs["features"])((ROWS * engine.layers, engine.width),
                                                                  torch.float32, device)}


__all__ = ["ContextFrames", "EveryLayerEngine", "LIVE_WINDOWS", "MuseTalkAudio", "MuseTalkHearing", "live_context"]
