"""Triton kernel for the 4DGS temporal slice. It is the twin of :func:`reference.slice_gaussians`.

One program runs per block of ``BLOCK`` Gaussians. Each lane handles one Gaussian end to end:

- normalise the two quaternions.
- build the 4D rotation ``R = L(q_l) R(q_r)`` row by row, and scale its columns.
- form the 10 unique entries of ``Sigma = (R S)(R S)^T``.
- condition on ``t``. That gives the conditional mean, 3 values, and the conditional covariance, 6 unique
  values. Also opacity x temporal marginal, and the cull flag.

Everything after the slice is the 3DGS pipeline: projection, tiles, blending.

``__init__.py`` registers the launcher as a torch custom op. It has a schema and a fake implementation, so
graphs capture it. Its backward replays :func:`reference.slice_gaussians` under autograd. That is cheap next
to rendering. It runs on CUDA, or on CPU through Triton's interpreter. For that, set ``TRITON_INTERPRET=1``
before this module is imported.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 128  # Gaussians per program
WARPS = 4


@triton.jit
def _row_times_right(x0, x1, x2, x3, p, q, r, s):
    """Row vector ``x`` times fudan-zvg's ``M_r(p, q, r, s)``. That is one row of ``R = M_l M_r``."""
    return (x0 * p - x1 * q - x2 * r - x3 * s,
            x0 * q + x1 * p + x2 * s - x3 * r,
            x0 * r - x1 * s + x2 * p + x3 * q,
            x0 * s + x1 * r - x2 * q + x3 * p)


@triton.jit
def _dot4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 * b0 + a1 * b1 + a2 * b2 + a3 * b3


@triton.jit
def _load4(ptr, i, m, first, rest):
    """The 4 values of row ``i`` of an ``[N, 4]`` tensor. ``first`` and ``rest`` where masked."""
    return (tl.load(ptr + 4 * i, mask=m, other=first), tl.load(ptr + 4 * i + 1, mask=m, other=rest),
            tl.load(ptr + 4 * i + 2, mask=m, other=rest), tl.load(ptr + 4 * i + 3, mask=m, other=rest))


@triton.jit
def _load_unit_quat(ptr, i, m):
    """Quaternion ``i`` of an ``[N, 4]`` tensor, normalised. The identity where masked."""
    w, x, y, z = _load4(ptr, i, m, 1.0, 0.0)
    inv = 1.0 / tl.sqrt(w * w + x * x + y * y + z * z)
    return w * inv, x * inv, y * inv, z * inv


@triton.jit
def _slice_kernel(
    means_ptr, times_ptr, scales_ptr, ql_ptr, qr_ptr, opac_ptr,  # [N, 3], [N], [N, 4], [N, 4], [N, 4], [N]
    out_means_ptr, out_covars_ptr, out_opac_ptr, out_keep_ptr,  # [N, 3], [N, 6], [N], [N] int8
    N, t, cull_threshold,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    i64 = i.to(tl.int64)

    a, b, c, d = _load_unit_quat(ql_ptr, i64, m)
    p, q, r, s = _load_unit_quat(qr_ptr, i64, m)
    s0, s1, s2, s3 = _load4(scales_ptr, i64, m, 1.0, 1.0)

    # Rows of R = M_l(a, b, c, d) @ M_r(p, q, r, s), each scaled by S: U = R S.
    x00, x01, x02, x03 = _row_times_right(a, -b, -c, -d, p, q, r, s)
    x10, x11, x12, x13 = _row_times_right(b, a, -d, c, p, q, r, s)
    x20, x21, x22, x23 = _row_times_right(c, d, a, -b, p, q, r, s)
    x30, x31, x32, x33 = _row_times_right(d, -c, b, a, p, q, r, s)
    x00, x01, x02, x03 = x00 * s0, x01 * s1, x02 * s2, x03 * s3
    x10, x11, x12, x13 = x10 * s0, x11 * s1, x12 * s2, x13 * s3
    x20, x21, x22, x23 = x20 * s0, x21 * s1, x22 * s2, x23 * s3
    x30, x31, x32, x33 = x30 * s0, x31 * s1, x32 * s2, x33 * s3

    # Sigma = U U^T: spatial block, space-time column, temporal variance.
    cxx = _dot4(x00, x01, x02, x03, x00, x01, x02, x03)
    cxy = _dot4(x00, x01, x02, x03, x10, x11, x12, x13)
    cxz = _dot4(x00, x01, x02, x03, x20, x21, x22, x23)
    cyy = _dot4(x10, x11, x12, x13, x10, x11, x12, x13)
    cyz = _dot4(x10, x11, x12, x13, x20, x21, x22, x23)
    czz = _dot4(x20, x21, x22, x23, x20, x21, x22, x23)
    cxt = _dot4(x00, x01, x02, x03, x30, x31, x32, x33)
    cyt = _dot4(x10, x11, x12, x13, x30, x31, x32, x33)
    czt = _dot4(x20, x21, x22, x23, x30, x31, x32, x33)
    ctt = _dot4(x30, x31, x32, x33, x30, x31, x32, x33)

    mu_t = tl.load(times_ptr + i64, mask=m, other=0.0)
    dt = t - mu_t
    inv_tt = 1.0 / ctt
    gx, gy, gz = cxt * inv_tt, cyt * inv_tt, czt * inv_tt  # Sigma_xt / Sigma_tt: the velocity
    mx = tl.load(means_ptr + 3 * i64, mask=m, other=0.0) + gx * dt
    my = tl.load(means_ptr + 3 * i64 + 1, mask=m, other=0.0) + gy * dt
    mz = tl.load(means_ptr + 3 * i64 + 2, mask=m, other=0.0) + gz * dt
    tl.store(out_means_ptr + 3 * i64, mx, mask=m)
    tl.store(out_means_ptr + 3 * i64 + 1, my, mask=m)
    tl.store(out_means_ptr + 3 * i64 + 2, mz, mask=m)

    tl.store(out_covars_ptr + 6 * i64, cxx - cxt * gx, mask=m)
    tl.store(out_covars_ptr + 6 * i64 + 1, cxy - cxt * gy, mask=m)
    tl.store(out_covars_ptr + 6 * i64 + 2, cxz - cxt * gz, mask=m)
    tl.store(out_covars_ptr + 6 * i64 + 3, cyy - cyt * gy, mask=m)
    tl.store(out_covars_ptr + 6 * i64 + 4, cyz - cyt * gz, mask=m)
    tl.store(out_covars_ptr + 6 * i64 + 5, czz - czt * gz, mask=m)

    marginal = tl.exp(-0.5 * dt * dt * inv_tt)
    opac = tl.load(opac_ptr + i64, mask=m, other=0.0)
    tl.store(out_opac_ptr + i64, opac * marginal, mask=m)
    tl.store(out_keep_ptr + i64, (marginal > cull_threshold).to(tl.int8), mask=m)


def slice_gaussians(means: Tensor, times: Tensor, scales: Tensor, quats_l: Tensor, quats_r: Tensor,
                    opacities: Tensor, t: float, cull_threshold: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Launch :func:`_slice_kernel`, the twin of :func:`reference.slice_gaussians`.

    It takes the same arguments and gives the same returns, in float32."""
    N = means.shape[0]
    out_means = means.new_empty((N, 3))
    out_covars = means.new_empty((N, 6))
    out_opac = means.new_empty((N,))
    keep = torch.empty((N,), dtype=torch.int8, device=means.device)
    if N > 0:
        _slice_kernel[(triton.cdiv(N, BLOCK),)](
            means.contiguous(), times.contiguous(), scales.contiguous(), quats_l.contiguous(),
            quats_r.contiguous(), opacities.contiguous(), out_means, out_covars, out_opac, keep,
            N, float(t), float(cull_threshold), BLOCK=BLOCK, num_warps=WARPS,
        )
    return out_means, out_covars, out_opac, keep != 0
