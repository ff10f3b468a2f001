"""Affine image registration, batched in torch: where did the head move?

It is Lucas–Kanade, solved by Gauss–Newton. ``register_affine(moving, fixed)`` finds an affine
``theta [N, 2, 3]`` per image pair. ``theta`` is in grid_sample's normalised coordinates, with
``align_corners=False``. Then ``grid_sample(moving, affine_grid(theta))`` looks like ``fixed``.

The decoder's reference warp uses it. It moves the portrait onto the face the decoder has just drawn. The
drawn face is blurrier than the portrait, but its pose is right. Low frequencies pin down a pose. Both images
are blurred alike first. Residuals are weighted robustly, with a Cauchy weight. So a mouth that opened or eyes
that closed in ``fixed`` do not pull the pose.

Each forward-additive Gauss–Newton step on ``theta = I + Δ`` solves ``(JᵀWJ + λI) δ = −JᵀWr``. The residual is
``r = warped − fixed``. ``J`` is the warped image's gradient times ``(x, y, 1)``. No gradient flows through
the estimate. It is a measurement of the pose, not a learned quantity.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _luma(x: Tensor) -> Tensor:
    """``[N, 3, H, W]`` → ``[N, 1, H, W]``."""
    return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]) if x.shape[1] == 3 else x


def gaussian_blur(x: Tensor, sigma: float) -> Tensor:
    """``[N, C, H, W]`` blurred by a separable Gaussian of ``sigma`` px, with replicate borders.

    With ``sigma <= 0`` it returns ``x`` itself."""
    if sigma <= 0:
        return x
    N, C, H, W = x.shape
    r = max(1, math.ceil(2.5 * sigma))
    t = torch.arange(-r, r + 1, device=x.device, dtype=x.dtype)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    x = x.reshape(N * C, 1, H, W)
    x = F.conv2d(pad_edges(x, r, -1), k.view(1, 1, 1, -1))
    return F.conv2d(pad_edges(x, r, -2), k.view(1, 1, -1, 1)).reshape(N, C, H, W)


def pad_edges(x: Tensor, r: int, dim: int) -> Tensor:
    """``x`` with its first and last slice along ``dim`` repeated ``r`` times on each side.

    It is ``F.pad(mode="replicate")`` as a concatenation of slices, with the same numbers. Inductor in torch 2.13
    fails to compile replicate padding of the VAE decoder's pixel-shuffled output. The error is ``vr must not
    be None``, from an index of an index."""
    n = x.shape[dim]
    first, last = x.narrow(dim, 0, 1), x.narrow(dim, n - 1, 1)
    sizes = list(x.shape)
    sizes[dim] = r
    return torch.cat([first.expand(sizes), x, last.expand(sizes)], dim=dim)


def _gradient(x: Tensor) -> tuple[Tensor, Tensor]:
    """Central differences per px of ``[N, 1, H, W]``, with replicate borders."""
    p = pad_edges(pad_edges(x, 1, -1), 1, -2)
    return (p[..., 1:-1, 2:] - p[..., 1:-1, :-2]) / 2, (p[..., 2:, 1:-1] - p[..., :-2, 1:-1]) / 2


def pixel_grid(height: int, width: int, device=None, dtype=torch.float32) -> tuple[Tensor, Tensor]:
    """Pixel centres ``(x [1, W], y [H, 1])`` in grid_sample's normalised coordinates (``align_corners=False``)."""
    x = (torch.arange(width, device=device, dtype=dtype) * 2 + 1) / width - 1
    y = (torch.arange(height, device=device, dtype=dtype) * 2 + 1) / height - 1
    return x.view(1, width), y.view(height, 1)


def affine_sample(image: Tensor, theta: Tensor) -> Tensor:
    """``grid_sample(image, affine_grid(theta, image.shape))`` for ``image [N, C, H, W]``, ``theta [N, 2, 3]``.

    Sampling is bilinear, with border padding and ``align_corners=False``. The grid is built by broadcasting.
    ``affine_grid`` would use a batched matmul. At these sizes on a CPU that costs more than the sampling.
    """
    h, w = image.shape[-2:]
    x, y = pixel_grid(h, w, image.device, theta.dtype)
    t = theta.view(-1, 6, 1, 1)
    grid = torch.stack([t[:, 0] * x + t[:, 1] * y + t[:, 2], t[:, 3] * x + t[:, 4] * y + t[:, 5]], dim=-1)
    return F.grid_sample(image, grid.to(image.dtype), mode="bilinear", padding_mode="border", align_corners=False)


def _solve(a: Tensor, b: Tensor) -> Tensor:
    """``torch.linalg.solve`` without its error check.

    The check reads the solver's status back to the host. On a GPU that is a host sync per Gauss–Newton step. It
    is also an op a compiled graph cannot cache. The systems here are symmetric positive definite plus damping.
    They are never singular."""
    return torch.linalg.solve_ex(a, b)[0]


def solve_spd_unrolled(a: Tensor, b: Tensor) -> Tensor:
    """``a⁻¹ b`` for small symmetric positive-definite systems ``a [N, n, n]``, ``b [N, n, k]``.

    It is Gaussian elimination unrolled over the static ``n``. It uses plain elementwise ops, so it exports to
    ONNX, which has no linear solve. It does not pivot; an SPD matrix does not need it. It is the twin of
    ``torch.linalg.solve`` here."""
    n = a.shape[-1]
    rows, rhs = [a[:, i] for i in range(n)], [b[:, i] for i in range(n)]  # [N, n] / [N, k] each
    for i in range(n):
        for j in range(i + 1, n):
            f = rows[j][:, i:i + 1] / rows[i][:, i:i + 1]
            rows[j], rhs[j] = rows[j] - f * rows[i], rhs[j] - f * rhs[i]
    x: list[Tensor] = [rhs[0]] * n
    for i in reversed(range(n)):
        acc = rhs[i]
        for j in range(i + 1, n):
            acc = acc - rows[i][:, j:j + 1] * x[j]
        x[i] = acc / rows[i][:, i:i + 1]
    return torch.stack(x, dim=1)


@torch.no_grad()
def register_affine(moving: Tensor, fixed: Tensor, *, iters: int = 8, blur_sigma: float = 1.0,
                    robust_scale: float = 0.1, damping: float = 1e-6) -> Tensor:
    """Affine ``theta float [N, 2, 3]`` taking ``fixed``'s pixels to where they are in ``moving``.

    ``moving`` is ``[N or 1, C, H, W]`` and ``fixed`` is ``[N, C, H, W]``. C is 1 or 3; values are in [-1, 1].
    ``grid_sample(moving, affine_grid(theta, fixed.shape), align_corners=False)`` then matches ``fixed``.
    ``robust_scale``: the residual, in image units, at which a pixel's weight halves."""
    n, _, h, w = fixed.shape
    mov = gaussian_blur(_luma(moving.float()), blur_sigma).expand(n, -1, -1, -1)
    fix = gaussian_blur(_luma(fixed.float()), blur_sigma)
    theta = torch.eye(2, 3, device=fixed.device).repeat(n, 1, 1)
    x, y = pixel_grid(h, w, fixed.device)
    basis = torch.stack([x.expand(h, w), y.expand(h, w), torch.ones(h, w, device=fixed.device)]).view(1, 3, h * w)
    damp = damping * torch.eye(6, device=fixed.device)
    for _ in range(iters):
        warped = affine_sample(mov, theta)
        gx, gy = _gradient(warped)
        gx, gy = gx.view(n, 1, -1) * (w / 2), gy.view(n, 1, -1) * (h / 2)  # per normalised unit
        jac = torch.cat([gx * basis, gy * basis], dim=1)  # [N, 6, HW]: ∂warped/∂theta (row-major)
        r = (warped - fix).view(n, 1, -1)
        wgt = 1.0 / (1.0 + (r / robust_scale) ** 2)
        jw = jac * wgt
        system, rhs = jw @ jac.transpose(1, 2) + damp, -(jw @ r.transpose(1, 2))
        solve = solve_spd_unrolled if torch.onnx.is_in_onnx_export() else _solve  # ONNX has no solve
        step = solve(system, rhs)  # [N, 6, 1]
        theta = theta + step.view(n, 2, 3)
    return theta.to(fixed.dtype)


__all__ = ["affine_sample", "gaussian_blur", "pixel_grid", "register_affine", "solve_spd_unrolled"]
