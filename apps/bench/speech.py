"""Test speech for the benches that stream audio: 16 kHz mono int16."""
from __future__ import annotations

import os

import numpy as np

from framegraph.models.synth import espeak_available, make_sentence, synthesize
from framegraph.stream.media import SAMPLE_RATE


def speech_like(seconds: float, rate: int = SAMPLE_RATE, seed: int = 0) -> np.ndarray:
    """Voiced bursts separated by short silences, int16.

    A burst is 150–600 ms of harmonics of a wandering pitch."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * rate), np.float64)
    i = 0
    while i < len(out):
        n = int(rng.uniform(0.15, 0.6) * rate)
        t = np.arange(min(n, len(out) - i)) / rate
        f0 = rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))
        phase = 2 * np.pi * np.cumsum(f0) / rate
        burst = sum(np.sin(k * phase) / k for k in range(1, 6)) * np.hanning(len(t))
        out[i:i + len(t)] = 0.3 * burst
        i += len(t) + int(rng.uniform(0.05, 0.3) * rate)
    return (np.clip(out, -1, 1) * 32767).astype(np.int16)


def speech(seconds: float, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Exactly ``seconds`` of 16 kHz int16 speech.

    It is espeak-ng sentences when available, else :func:`speech_like` bursts. Returns the samples and a
    description for the JSON: ``{"source", "text"}``."""
    n = int(round(seconds * SAMPLE_RATE))
    if not espeak_available():
        return speech_like(seconds, SAMPLE_RATE, seed)[:n], {
            "source": "synthetic voiced bursts (bench.speech.speech_like): espeak-ng is not available"}
    rng = np.random.default_rng(seed)
    parts, texts, total = [], [], 0
    pause = np.zeros(int(0.15 * SAMPLE_RATE), np.int16)
    while total < n:
        text = make_sentence(rng)
        s = synthesize(text, voice="en-us", sample_rate=SAMPLE_RATE).samples.astype(np.int16)
        parts += [s, pause]
        texts.append(text)
        total += len(s) + len(pause)
    return np.concatenate(parts)[:n], {"source": "espeak-ng speech (en-us, models.synth.synthesize)",
                                      "text": " ".join(texts)}


def speech_or_file(path: str | None, seconds: float = 20.0) -> tuple[np.ndarray, dict]:
    """The speech a bench measures on.

    With ``path``, the file there: 16 kHz int16, named by its file name in the JSON. Without one,
    :func:`speech` of ``seconds``."""
    if path:
        from framegraph.stream.media import decode_audio

        return decode_audio(path), {"source": os.path.basename(path)}
    return speech(seconds)
