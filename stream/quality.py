"""Picture quality, the one measure every layer compares frames with: :func:`psnr`."""
from __future__ import annotations

import math

import numpy as np
import torch


def _float64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def psnr(a, b, data_range: float = 1.0, *, lo: float = 0.0) -> float:
    """Peak signal-to-noise ratio in dB of ``a`` against the reference ``b`` (tensors or arrays of one shape, a
    picture or a batch), values in ``[lo, lo + data_range]``: images in [0, 1] by default; ``data_range=2,
    lo=-1`` for [-1, 1]; ``data_range=255`` for uint8. ``a`` is clamped to the range first, as it would be
    shown. Identical pictures give ``inf``.

        psnr(render, truth)                  # float images in [0, 1]
        psnr(frame, real, data_range=255)    # uint8 frames
    """
    x = np.clip(_float64(a), lo, lo + data_range)
    y = _float64(b)
    if x.shape != y.shape:
        raise ValueError(f"psnr: shapes {list(x.shape)} and {list(y.shape)} differ")
    mse = float(np.mean((x - y) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(data_range * data_range / mse)


__all__ = ["psnr"]
