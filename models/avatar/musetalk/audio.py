"""MuseTalk's audio context: Whisper's every-layer features at 50 Hz, and the window each video frame attends to.

The 16 kHz audio is encoded in 30-s segments. Each segment's log-mel is padded to 30 s, as Whisper's feature
extractor makes it. The encoder's hidden states are kept at 50 Hz for the audio's length. They are ``L + 1`` per
row: the embedding, each later layer's input and the normed output. Whisper-tiny has 5.

Video frame ``i`` at ``fps`` attends to ``ROWS`` = 2·(``LEFT`` + ``RIGHT`` + 1) = 10 rows of those features. They
start at row ⌊i·50/fps⌋. The features are padded with 2·``LEFT`` zero rows before and 6·``RIGHT`` after. A frame's
rows × layers are flattened to the UNet's context ``[ROWS·(L + 1), D]``. For whisper-tiny that is 50 × 384. A
sinusoidal position code is added.
"""
from __future__ import annotations

import math

import torch

from framegraph.models.audio.whisper import torch_encode, whisper_log_mel
from framegraph.stream.media import SAMPLE_RATE

AUDIO_FPS = 50  # Whisper's encoder rows per second
LEFT = RIGHT = 2  # video frames of audio before and after a frame's own
ROWS = 2 * (LEFT + RIGHT + 1)  # feature rows one video frame attends to
SEGMENT = 30 * SAMPLE_RATE  # Whisper's window: the audio is encoded 30 s at a time


def every_layer_features(encoder, wave: torch.Tensor) -> torch.Tensor:
    """``float32 [T, L + 1, D]``: Whisper's hidden states of ``wave float32 [S]``, 16 kHz in [-1, 1].

    T = ⌊S / 320⌋ rows at 50 Hz. See the module docstring."""
    parts = []
    with torch.inference_mode():
        for start in range(0, max(len(wave), 1), SEGMENT):
            segment = torch.zeros(SEGMENT)
            piece = wave[start:start + SEGMENT].float()
            segment[:len(piece)] = piece
            mel = whisper_log_mel(segment[None])  # [1, 80, 3000]
            parts.append(torch_encode(encoder, mel, every_layer=True)[0])  # [1500, L + 1, D]
    rows = math.floor(len(wave) / SAMPLE_RATE * AUDIO_FPS)
    return torch.cat(parts)[:rows]


def frame_windows(features: torch.Tensor, fps: float, frames: int | None = None) -> torch.Tensor:
    """``[N, ROWS·(L + 1), D]``: each video frame's context from ``features [T, L + 1, D]`` at ``fps``.

    N is ``frames`` if given. Otherwise it is the frames the audio covers, ⌊T / 50 · fps⌋. No position code is
    added; see :func:`position_code`."""
    per_frame = AUDIO_FPS / fps
    n = math.floor(len(features) / AUDIO_FPS * fps) if frames is None else frames
    pad = math.ceil(per_frame)
    zeros = features.new_zeros
    padded = torch.cat([zeros(pad * LEFT, *features.shape[1:]), features,
                        zeros(pad * 3 * RIGHT, *features.shape[1:])])
    need = math.floor((n - 1) * per_frame) + ROWS if n else 0
    if need > len(padded):  # frames past the audio's end attend to silence
        padded = torch.cat([padded, zeros(need - len(padded), *features.shape[1:])])
    starts = [math.floor(i * per_frame) for i in range(n)]
    return torch.stack([padded[s:s + ROWS].flatten(0, 1) for s in starts]) if n else \
        features.new_zeros(0, ROWS * features.shape[1], features.shape[2])


def position_code(length: int, width: int) -> torch.Tensor:
    """``float32 [length, width]``: the sinusoidal position code added to a frame's context.

    Even columns hold sines, odd columns cosines. Wavelengths run from 2π to 10000·2π."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    code = torch.zeros(length, width)
    code[:, 0::2] = torch.sin(position * rate)
    code[:, 1::2] = torch.cos(position * rate)
    return code


__all__ = ["AUDIO_FPS", "LEFT", "RIGHT", "ROWS", "every_layer_features", "frame_windows", "position_code"]
