"""The measures every layer compares with.

The function :func:`psnr` compares pictures. The functions :func:`pearson` and :func:`pearson_by_lag` compare
two series. An example is a mouth's openness against the speech's loudness.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _float64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def psnr(a, b, data_range: float = 1.0, *, lo: float = 0.0) -> float:
    """Peak signal-to-noise ratio in dB of ``a`` against the reference ``b``.

    Both are tensors or arrays of one shape: a picture or a batch. Values lie in ``[lo, lo + data_range]``.
    The default is images in [0, 1]. Use ``data_range=2, lo=-1`` for [-1, 1]. Use ``data_range=255`` for uint8.
    ``a`` is clamped to the range first, as it would be shown. Identical pictures give ``inf``.

        psnr(render, truth)                  # float images in [0, 1]
        psnr(frame, real, data_range=255)    # uint8 frames
    """
    x = np.clip(_float64(a), lo, lo + data_range)
    y = _float64(b)
    if x.shape != y.shape:
        raise ValueError(f"psnr: shapes {list(x.shape)} and {list(y.shape)} differ")
    mse = float(np.mean((x - y) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(data_range * data_range / mse)


def pearson(a, b, digits: int | None = None) -> float | None:
    """Pearson correlation of two series of one length.

    The series are tensors, arrays or lists. Only entries where both are finite count. Returns None with fewer
    than 3 of them, or when a side does not vary. With ``digits``, the result is rounded to that many.

        pearson(drawn_openness, real_openness, digits=4)
    """
    x, y = _float64(a).ravel(), _float64(b).ravel()
    if x.shape != y.shape:
        raise ValueError(f"pearson: lengths {x.size} and {y.size} differ")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 3 or x.std() < 1e-9 or y.std() < 1e-9:
        return None
    r = float(np.corrcoef(x, y)[0, 1])
    return r if digits is None else round(r, digits)


def pearson_by_lag(a, b, max_lag: int) -> dict[int, float | None]:
    """:func:`pearson` of ``a[t + lag]`` with ``b[t]`` for each ``lag`` in ``-max_lag..max_lag``.

    A positive lag means ``a`` follows ``b`` by ``lag`` entries. Each value uses the overlap only.
    """
    x, y = _float64(a).ravel(), _float64(b).ravel()
    n = min(len(x), len(y))
    return {lag: pearson(x[lag:n], y[:n - lag]) if lag >= 0 else pearson(x[:n + lag], y[-lag:n])
            for lag in range(-max_lag, max_lag + 1)}


__all__ = ["psnr", "pearson", "pearson_by_lag"]
