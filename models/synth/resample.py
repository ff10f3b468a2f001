"""Band-limited resampling of int16 audio by windowed sinc, with no delay.

Output sample ``n`` is the input signal evaluated at time ``n / rate_out``.
"""
from __future__ import annotations

import numpy as np


def _kaiser(u: np.ndarray, beta: float = 8.0) -> np.ndarray:
    """Kaiser window at positions ``u`` in [-1, 1]. 0 outside."""
    inside = np.abs(u) < 1
    return np.where(inside, np.i0(beta * np.sqrt(np.clip(1 - u * u, 0, None))) / np.i0(beta), 0.0)


def resample(samples: np.ndarray, rate_in: int, rate_out: int, taps: int = 32) -> np.ndarray:
    """Resample mono ``int16 [S]`` from ``rate_in`` to ``rate_out`` Hz → ``int16 [round(S * rate_out / rate_in)]``.

    It uses a Kaiser-windowed sinc of ``taps`` input samples.
    The cut-off is 0.95 × the lower Nyquist frequency.
    It is an exact copy when the rates are equal.
    """
    x = np.asarray(samples)
    if x.ndim != 1:
        raise ValueError(f"resample: expected mono samples [S], got shape {x.shape}")
    if rate_in == rate_out or len(x) == 0:
        return x.astype(np.int16, copy=True)
    n_out = int(round(len(x) * rate_out / rate_in))
    xf = x.astype(np.float64)
    cutoff = 0.95 * min(1.0, rate_out / rate_in)  # relative to the input Nyquist
    pos = np.arange(n_out) * (rate_in / rate_out)  # output sample times in input samples
    base = np.floor(pos).astype(np.int64)
    half = taps // 2
    out = np.zeros(n_out)
    step = 8192  # bounded memory: [step, taps]
    offsets = np.arange(-half + 1, half + 1)
    for s in range(0, n_out, step):
        b, p = base[s:s + step, None], pos[s:s + step, None]
        idx = b + offsets
        d = idx - p
        w = cutoff * np.sinc(cutoff * d) * _kaiser(d / half)
        valid = (idx >= 0) & (idx < len(xf))
        out[s:s + step] = np.sum(np.where(valid, xf[np.clip(idx, 0, len(xf) - 1)], 0.0) * w, axis=1)
    return np.clip(np.round(out), -32768, 32767).astype(np.int16)
