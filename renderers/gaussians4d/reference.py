"""Pure-torch 4D Gaussian splatting: rotation, covariance, temporal slice, colour, projection.

This is the slow, obvious twin of ``triton.py``. It defines what "correct" means for it. The semantics are those
of fudan-zvg's paper, "Real-time Photorealistic Dynamic Scene Representation and Rendering with 4D Gaussian
Splatting", ICLR 2024. The mode is ``rot_4d=True``:

1. :func:`rotation_4d`: ``R = L(q_l) @ R(q_r)``. A left-isoclinic times a right-isoclinic rotation, built from
   two unit quaternions. Their code calls it ``build_rotation_4d``.
2. :func:`covariance_4d`: ``Sigma = R S S^T R^T`` over x, y, z, t, with ``S = diag(scales)``.
3. :func:`slice_gaussians`: condition every 4D Gaussian on time ``t``. That gives a 3D Gaussian.
   Its mean is ``mu_xyz + Sigma_xt / Sigma_tt (t - mu_t)``.
   Its covariance is the Schur complement ``Sigma_xx - Sigma_xt Sigma_tx / Sigma_tt``.
   Its opacity is ``o * exp(-(t - mu_t)^2 / (2 Sigma_tt))``.
   Gaussians whose temporal marginal is not above 0.05 are culled.
4. :func:`sh_colors_4d`: spherical harmonics x a cosine, Fourier, basis in time. Their ``eval_shfs_4d``.
5. Projection of the sliced 3D Gaussians. It is the 3DGS reference's ``project_covariances``, re-exported
   here. That is the EWA math of ``project_gaussians``, from covariances instead of quaternions and scales.

Conventions:

- Quaternions are ``w, x, y, z`` = ``a, b, c, d``, real part first. Any non-zero norm; they are normalised here.
- 4D vectors are ``x, y, z, t``.
- Cameras are as in ``renderers/cameras.py``: OpenCV, world-to-camera.
- 3D covariances travel as their 6 unique values ``xx, xy, xz, yy, yz, zz``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.renderers.gaussians.reference import (  # noqa: F401 - project_covariances re-exported
    project_covariances,
    sh_basis,
)

CULL_THRESHOLD = 0.05  # a Gaussian whose temporal marginal is <= this is not rendered (fudan-zvg)


# ----------------------------------------------------------------------------
# 1. Rotation
# ----------------------------------------------------------------------------
def quat_left_matrix(q: Tensor) -> Tensor:
    """``[..., 4, 4]`` matrix of left multiplication ``v -> q * v`` by quaternion ``q [..., 4]``."""
    a, b, c, d = q.unbind(-1)
    rows = [a, -b, -c, -d,
            b, a, -d, c,
            c, d, a, -b,
            d, -c, b, a]
    return torch.stack(rows, dim=-1).reshape(q.shape[:-1] + (4, 4))


def quat_right_matrix(q: Tensor) -> Tensor:
    """``[..., 4, 4]`` matrix of ``v -> v * conj(q)`` for quaternion ``q [..., 4]``. fudan-zvg's ``M_r``."""
    p, q_, r, s = q.unbind(-1)
    rows = [p, q_, r, s,
            -q_, p, -s, r,
            -r, s, p, -q_,
            -s, -r, q_, p]
    return torch.stack(rows, dim=-1).reshape(q.shape[:-1] + (4, 4))


def rotation_4d(quats_l: Tensor, quats_r: Tensor) -> Tensor:
    """4D rotations ``[..., 4, 4] = L(q_l) @ R(q_r)`` from left and right quaternions ``[..., 4]``.

    Both are normalised first. Every rotation of R^4 can be written this way, up to the sign of both
    quaternions. So ``q_l, q_r`` is a full parametrisation of SO(4).
    """
    return quat_left_matrix(F.normalize(quats_l, dim=-1)) @ quat_right_matrix(F.normalize(quats_r, dim=-1))


def rotmat4_to_quats(R: Tensor) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`rotation_4d`: unit ``q_l, q_r`` ``[..., 4]`` with ``rotation_4d(q_l, q_r) = R``.

    ``R [..., 4, 4]`` must be a rotation: orthonormal, det +1. ``R`` is bilinear in the two quaternions:
    ``R = sum_mn q_l[m] q_r[n] B_mn``. The 16 ``B_mn`` are signed permutation matrices. They are orthogonal:
    ``<B_mn, B_kl> = 4 delta``. So ``A_mn = <R, B_mn> / 4 = q_l[m] q_r[n]`` is a rank-one matrix. Its largest
    column gives ``q_l``, and ``A^T q_l`` gives ``q_r``.
    """
    eye = torch.eye(4, dtype=R.dtype, device=R.device)
    basis = quat_left_matrix(eye)[:, None] @ quat_right_matrix(eye)[None, :]  # [4, 4, 4, 4] = B_mn
    A = torch.einsum("...ij,mnij->...mn", R, basis) / 4.0
    col = A.norm(dim=-2).argmax(dim=-1)  # column n with the largest |q_r[n]|
    ql = torch.gather(A, -1, col[..., None, None].expand(A.shape[:-1] + (1,)))[..., 0]
    ql = F.normalize(ql, dim=-1)
    qr = F.normalize((A.transpose(-1, -2) @ ql[..., None])[..., 0], dim=-1)
    return ql, qr


def gaussians_from_motion(C: Tensor, sigma_t: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Scales ``[N, 4]`` and quaternions ``q_l, q_r`` ``[N, 4]`` of 4D Gaussians with given slices. Float64 in.

    The slices have covariance ``C [N, 3, 3]``, temporal std ``sigma_t [N]`` and velocity ``v [N, 3]``."""
    n = C.shape[0]
    var_t = sigma_t**2
    cov = torch.zeros(n, 4, 4, dtype=torch.float64)
    cov[:, :3, :3] = C + var_t[:, None, None] * v[:, :, None] * v[:, None, :]
    cov[:, :3, 3] = cov[:, 3, :3] = var_t[:, None] * v
    cov[:, 3, 3] = var_t
    lam, V = torch.linalg.eigh(cov)
    V[:, :, 0] *= torch.sign(torch.linalg.det(V))[:, None]  # a rotation, det +1
    ql, qr = rotmat4_to_quats(V)
    return torch.sqrt(lam.clamp(min=1e-12)), ql, qr


# ----------------------------------------------------------------------------
# 2. Covariance
# ----------------------------------------------------------------------------
def covariance_4d(scales: Tensor, quats_l: Tensor, quats_r: Tensor) -> Tensor:
    """4D covariances ``[..., 4, 4] = R diag(scales^2) R^T``.

    ``scales [..., 4]`` are activated standard deviations along the Gaussian's own axes. The checkpoint's
    ``_scaling`` and ``_scaling_t`` are their logs.
    """
    M = rotation_4d(quats_l, quats_r) * scales[..., None, :]  # R @ diag(s)
    return M @ M.transpose(-1, -2)


def covar6_to_mat(c6: Tensor) -> Tensor:
    """``xx, xy, xz, yy, yz, zz [..., 6]`` -> symmetric ``[..., 3, 3]``."""
    xx, xy, xz, yy, yz, zz = c6.unbind(-1)
    return torch.stack([xx, xy, xz, xy, yy, yz, xz, yz, zz], dim=-1).reshape(c6.shape[:-1] + (3, 3))


def mat_to_covar6(m: Tensor) -> Tensor:
    """Symmetric ``[..., 3, 3]`` -> its upper triangle ``xx, xy, xz, yy, yz, zz [..., 6]``."""
    return torch.stack([m[..., 0, 0], m[..., 0, 1], m[..., 0, 2], m[..., 1, 1], m[..., 1, 2], m[..., 2, 2]], -1)


# ----------------------------------------------------------------------------
# 3. Temporal slice
# ----------------------------------------------------------------------------
def slice_gaussians(
    means: Tensor,
    times: Tensor,
    scales: Tensor,
    quats_l: Tensor,
    quats_r: Tensor,
    opacities: Tensor,
    t: float,
    cull_threshold: float = CULL_THRESHOLD,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Condition 4D Gaussians on time ``t``: the 3D Gaussians seen at that instant.

    Args:
        means: ``[N, 3]`` spatial means ``mu_xyz``; times: ``[N]`` temporal means ``mu_t``.
        scales: ``[N, 4]`` activated standard deviations, along the Gaussian's x, y, z, t axes.
        quats_l, quats_r: ``[N, 4]`` left and right rotation quaternions, order w, x, y, z.
        opacities: ``[N]`` activated opacities in [0, 1].
        t: the time to render, in the scene's time units.
        cull_threshold: Gaussians with ``marginal <= cull_threshold`` are not kept.

    Returns:
        ``means3d [N, 3]``: conditional means.
        ``covars [N, 6]``: conditional covariances, ``xx, xy, xz, yy, yz, zz``.
        ``opacities_t [N]``: opacity x temporal marginal ``exp(-(t - mu_t)^2 / (2 Sigma_tt))``.
        ``keep [N] bool``: marginal > threshold.
        Every Gaussian gets values. ``keep`` says which ones a renderer draws.
    """
    cov = covariance_4d(scales, quats_l, quats_r)
    cov_xx, cov_xt, cov_tt = cov[:, :3, :3], cov[:, :3, 3], cov[:, 3, 3]
    dt = t - times
    means3d = means + cov_xt / cov_tt[:, None] * dt[:, None]
    covars = cov_xx - cov_xt[:, :, None] * cov_xt[:, None, :] / cov_tt[:, None, None]
    marginal = torch.exp(-0.5 * dt * dt / cov_tt)
    keep = marginal > cull_threshold
    return means3d, mat_to_covar6(covars), opacities * marginal, keep


# ----------------------------------------------------------------------------
# 4. Colour: spherical harmonics x temporal cosine basis
# ----------------------------------------------------------------------------
def temporal_basis(dt: Tensor, duration: float, degree_t: int) -> Tensor:
    """``[..., degree_t + 1]``: ``cos(2 pi k dt / duration)`` for ``k = 0..degree_t``. ``k = 0`` gives 1.

    ``dt = mu_t - t``, fudan-zvg's ``dir_t``. The basis is even, so the sign does not matter.
    ``duration = time_duration[1] - time_duration[0]``.
    """
    k = torch.arange(degree_t + 1, dtype=dt.dtype, device=dt.device)
    return torch.cos(2 * math.pi * k * dt[..., None] / duration)


def sh_colors_4d(
    sh_degree: int, sh_degree_t: int, dirs: Tensor, dt: Tensor, duration: float, coeffs: Tensor
) -> Tensor:
    """Raw colour ``[..., 3]`` of 4D Gaussians, before ``+ 0.5`` and the clamp at 0.

    Args:
        dirs: ``[..., 3]`` view directions camera -> Gaussian. Normalised here.
        dt: ``[...]`` ``mu_t - t``.
        coeffs: ``[..., K, 3]`` with ``K >= (sh_degree_t + 1) * (sh_degree + 1) ** 2``. Block ``k`` of
            ``(sh_degree + 1) ** 2`` coefficients is weighted by ``cos(2 pi k dt / duration)``. This is
            fudan-zvg's ``eval_shfs_4d``. Its blocks are 16 wide because it is only used at SH degree 3. The
            loader compacts their blocks to this layout.
    """
    n = (sh_degree + 1) ** 2
    need = n * (sh_degree_t + 1)
    if coeffs.shape[-2] < need:
        raise ValueError(f"sh_degree={sh_degree}, sh_degree_t={sh_degree_t} need {need} coefficients per "
                         f"colour, got {coeffs.shape[-2]}")
    spatial = sh_basis(sh_degree, F.normalize(dirs, dim=-1))  # [..., n]
    temporal = temporal_basis(dt, duration, sh_degree_t)  # [..., deg_t + 1]
    basis = (temporal[..., :, None] * spatial[..., None, :]).flatten(-2)  # [..., need], block-major
    return (basis[..., None] * coeffs[..., :need, :]).sum(dim=-2)
