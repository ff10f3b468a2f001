"""Reconstruction losses and metrics for the video VAE.

Images are channels-first ``[N, 3, H, W]``. Videos ``[B, 3, T, H, W]`` are folded to frames. Values are in
[-1, 1] unless a function says otherwise. The losses are written here, not shared with ``renderers/fit``.
Models must not depend on renderers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def video_to_frames(x: Tensor) -> Tensor:
    """``[B, C, T, H, W]`` → ``[B·T, C, H, W]``. A 4-D input is returned as is."""
    if x.dim() == 4:
        return x
    if x.dim() != 5:
        raise ValueError(f"expected [B, C, T, H, W] or [N, C, H, W], got {list(x.shape)}")
    b, c, t, h, w = x.shape
    return x.transpose(1, 2).reshape(b * t, c, h, w)


def _gaussian_1d(size: int, sigma: float, device, dtype) -> Tensor:
    x = torch.arange(size, device=device, dtype=dtype) - (size - 1) / 2
    g = torch.exp(-(x * x) / (2 * sigma * sigma))
    return g / g.sum()


def ssim_map(a: Tensor, b: Tensor, *, window: int = 7, sigma: float = 1.5, data_range: float = 2.0) -> Tensor:
    """Per-pixel SSIM (Wang et al. 2004) of two frame batches ``[N, C, H, W]``.

    The window is Gaussian and separable, with ``window`` taps and ``sigma`` px. The convolution is valid, with
    no padding. The constants are ``(0.01 L)²`` and ``(0.03 L)²`` for data range ``L``. ``L`` is 2 for [-1, 1]
    images. Returns ``[N, C, H - window + 1, W - window + 1]``. Identical images give 1 everywhere."""
    if a.shape != b.shape or a.dim() != 4:
        raise ValueError(f"ssim: expected two [N, C, H, W] tensors of one shape, got {list(a.shape)} and "
                         f"{list(b.shape)}")
    if min(a.shape[-2:]) < window:
        raise ValueError(f"ssim: images {list(a.shape[-2:])} are smaller than the {window}-px window")
    c = a.shape[1]
    g = _gaussian_1d(window, sigma, a.device, a.dtype)
    gx = g.view(1, 1, 1, window).expand(c, 1, 1, window)
    gy = g.view(1, 1, window, 1).expand(c, 1, window, 1)

    def blur(t: Tensor) -> Tensor:
        return F.conv2d(F.conv2d(t, gx, groups=c), gy, groups=c)

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a * mu_a
    var_b = blur(b * b) - mu_b * mu_b
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    return ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a * mu_a + mu_b * mu_b + c1) * (var_a + var_b + c2))


def ssim(a: Tensor, b: Tensor, **kw) -> Tensor:
    """Mean SSIM of frames or videos in [-1, 1], as a differentiable scalar tensor; see :func:`ssim_map`."""
    return ssim_map(video_to_frames(a), video_to_frames(b), **kw).mean()


def box_mask(boxes: Tensor, height: int, width: int) -> Tensor:
    """Soft-edged rectangles: ``boxes float [N, 4]`` → ``float [N, 1, height, width]``.

    Each box is x, y, w, h in px. The mask is 1 inside each box and 0 outside. The edges are a 1-px linear ramp.
    Pixel centres lie at ``i + 0.5``."""
    ys = torch.arange(height, dtype=torch.float32, device=boxes.device) + 0.5
    xs = torch.arange(width, dtype=torch.float32, device=boxes.device) + 0.5
    x0, y0 = boxes[:, 0, None], boxes[:, 1, None]
    x1, y1 = x0 + boxes[:, 2, None], y0 + boxes[:, 3, None]
    mx = ((xs - x0 + 0.5).clamp(0, 1) * (x1 - xs + 0.5).clamp(0, 1))  # [N, W]
    my = ((ys - y0 + 0.5).clamp(0, 1) * (y1 - ys + 0.5).clamp(0, 1))  # [N, H]
    return (my[:, :, None] * mx[:, None, :])[:, None]


def kl_divergence(mean: Tensor, logvar: Tensor) -> Tensor:
    """KL(N(mean, exp(logvar)) ‖ N(0, 1)) averaged over every latent element, in nats per element."""
    return 0.5 * (mean * mean + logvar.exp() - 1.0 - logvar).mean()


def reconstruction_loss(recon: Tensor, target: Tensor, weight: Tensor | None = None, *,
                        ssim_weight: float = 0.2) -> tuple[Tensor, dict]:
    """``weighted L1 + ssim_weight · (1 − weighted SSIM)`` of videos ``[B, 3, T, H, W]`` in [-1, 1].

    ``weight`` ``[B·T, 1, H, W]`` scales each pixel's share. An example is ``1 + (mouth_weight − 1) · mouth
    mask``. Both terms are normalised by the weights' mean. So the loss scale does not depend on it.
    Returns the loss and its parts as floats, for logging."""
    r, t = video_to_frames(recon), video_to_frames(target)
    if weight is None:
        weight = torch.ones_like(r[:, :1])
    l1 = ((r - t).abs() * weight).mean() / weight.mean()
    parts = {"l1": float(l1.detach())}
    loss = l1
    if ssim_weight:
        s = ssim_map(r, t)
        k = (weight.shape[-1] - s.shape[-1]) // 2
        w = weight[..., k:k + s.shape[-2], k:k + s.shape[-1]]
        s_mean = (s * w).mean() / w.mean()
        loss = loss + ssim_weight * (1.0 - s_mean)
        parts["ssim"] = float(s_mean.detach())
    return loss, parts
