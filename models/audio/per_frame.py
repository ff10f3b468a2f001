"""Audio measured per video frame: speech probability and loudness.

Both take ``int16`` mono audio at 16 kHz and give one value per video frame of ``fps``.
Training and evaluation share them.
"""
from __future__ import annotations

import math

import numpy as np

from framegraph.stream.media import SAMPLE_RATE

from .vad import WINDOW_SAMPLES, SileroVAD


def speech_per_frame(audio: np.ndarray, n_frames: int, fps: float) -> np.ndarray:
    """float [T]: Silero VAD's speech probability per video frame.

    Each frame takes the most of the 32 ms windows it overlaps. ``audio`` is int16 mono at 16 kHz.
    Frames past the audio's end get 0.
    """
    a = np.asarray(audio, np.float32) / 32768.0
    vad = SileroVAD()
    n_win = math.ceil(len(a) / WINDOW_SAMPLES)
    a = np.pad(a, (0, n_win * WINDOW_SAMPLES - len(a)))
    probs = np.array([vad(a[i * WINDOW_SAMPLES:(i + 1) * WINDOW_SAMPLES]) for i in range(n_win)])
    out = np.zeros(n_frames)
    for k in range(n_frames):
        w0 = int(k / fps * SAMPLE_RATE) // WINDOW_SAMPLES
        w1 = int(math.ceil((k + 1) / fps * SAMPLE_RATE / WINDOW_SAMPLES))
        if w0 < n_win:
            out[k] = probs[w0:max(w1, w0 + 1)].max()
    return out


def loudness_db_per_frame(audio: np.ndarray, n_frames: int, fps: float) -> np.ndarray:
    """float [T]: RMS level in dBFS of ``audio`` over each video frame. ``audio`` is int16 mono at 16 kHz."""
    a = np.asarray(audio, np.float64) / 32768.0
    spf = SAMPLE_RATE / fps
    out = np.full(n_frames, -120.0)
    for k in range(n_frames):
        seg = a[int(k * spf):int((k + 1) * spf)]
        if len(seg):
            out[k] = 10 * math.log10(float(np.mean(seg ** 2)) + 1e-12)
    return out
