"""Image losses and metrics for fitting: L1, SSIM, PSNR. Images are ``[..., H, W, 3]`` in [0, 1]."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _gaussian_window(size: int, sigma: float, device: torch.device, dtype: torch.dtype) -> Tensor:
    x = torch.arange(size, device=device, dtype=dtype) - (size - 1) / 2
    g = torch.exp(-(x * x) / (2 * sigma * sigma))
    g = g / g.sum()
    return g[:, None] * g[None, :]  # [size, size], sums to 1


def ssim(a: Tensor, b: Tensor, *, window: int = 11, sigma: float = 1.5, data_range: float = 1.0) -> Tensor:
    """Mean structural similarity of two image batches ``[..., H, W, C]``, as a scalar tensor.

    It is the INRIA 3DGS form, after Wang et al. 2004. Local statistics use an 11 x 11 Gaussian window, sigma
    1.5. Padding is zero, for a "same" size output. ``C1 = (0.01 L)^2`` and ``C2 = (0.03 L)^2`` for data range
    ``L``. It is averaged over pixels, channels and images. Identical images give exactly 1. Differentiable.
    """
    if a.shape != b.shape or a.dim() < 3:
        raise ValueError(f"ssim: images must have the same shape [..., H, W, C], got {list(a.shape)} and "
                         f"{list(b.shape)}")
    H, W, C = a.shape[-3:]
    x = a.reshape(-1, H, W, C).permute(0, 3, 1, 2)  # [B, C, H, W]
    y = b.reshape(-1, H, W, C).permute(0, 3, 1, 2)
    w = _gaussian_window(window, sigma, a.device, a.dtype).expand(C, 1, window, window)

    def blur(t: Tensor) -> Tensor:
        return F.conv2d(t, w, padding=window // 2, groups=C)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x * mu_x
    var_y = blur(y * y) - mu_y * mu_y
    cov = blur(x * y) - mu_x * mu_y
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x * mu_x + mu_y * mu_y + c1) * (var_x + var_y + c2))
    return s.mean()


def fit_loss(render: Tensor, target: Tensor, ssim_weight: float = 0.2) -> Tensor:
    """The 3DGS photometric loss ``(1 - w) L1 + w (1 - SSIM)`` for ``[..., H, W, 3]`` images."""
    l1 = (render - target).abs().mean()
    if ssim_weight == 0:
        return l1
    return (1.0 - ssim_weight) * l1 + ssim_weight * (1.0 - ssim(render, target))


__all__ = ["ssim", "fit_loss"]
