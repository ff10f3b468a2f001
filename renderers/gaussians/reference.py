"""Pure-torch 3D Gaussian splatting, one readable function per step.

This is the slow, obvious twin of the Triton path in ``triton.py``. It defines what "correct" means for it.
Every step follows the semantics of gsplat's ``rasterization()``, from nerfstudio-project/gsplat. So scenes
trained there render the same here:

1. :func:`quat_scale_to_covar`: quaternion and scale -> 3D covariance. Order w, x, y, z.
2. :func:`project_gaussians`: EWA splatting, world -> camera -> pixels. 2D conics, per-axis pixel radii, culling.
3. :func:`spherical_harmonics`: view-dependent colour, SH degree 0..3.
4. :func:`isect_tiles`, :func:`isect_offsets`: camera | tile | depth keys, one per Gaussian-tile overlap,
   sorted. Then the tile ranges.
5. :func:`rasterize_to_pixels`: per-tile front-to-back alpha blending.

Steps 4 and 5 size their lists by the data, which reads counts back to the host. The render stages' sync-free
path uses their fixed-shape forms. These are :func:`isect_tiles_fixed` into a capacity, :func:`tile_ranges` and
:func:`rasterize_tiles_fixed`. They give the same lists and, up to float rounding, the same images.

Everything is differentiable by autograd except the integer bookkeeping: radii and tile keys. That is what
training needs.

Conventions: pixel row i, column j has its centre at ``(j + 0.5, i + 0.5)``. Cameras are OpenCV: x right, y
down, z forward. ``viewmats`` are world-to-camera.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# Constants shared with the Triton kernels (and gsplat's CUDA kernels).
ALPHA_THRESHOLD = 1.0 / 255.0  # a Gaussian with alpha below this is skipped at a pixel
TRANSMITTANCE_THRESHOLD = 1e-4  # a pixel stops before T would fall to this or below
DEFAULT_ALPHA_CAP = 0.999  # gsplat's cap; the INRIA rasterizer uses 0.99
RADIUS_SIGMAS = 3.33  # pixel radius of a Gaussian, in standard deviations per axis
FOV_CLAMP = 1.3  # the EWA Jacobian is evaluated at x/z, y/z clamped to 1.3x the fov

# Real spherical-harmonic basis constants (Sloan, "Efficient Spherical Harmonic
# Evaluation", JCGT 2013), with the sign convention used by gsplat and INRIA 3DGS.
SH_C0 = 0.28209479177387814


# ----------------------------------------------------------------------------
# 1. Covariance
# ----------------------------------------------------------------------------
def quat_to_rotmat(quats: Tensor) -> Tensor:
    """Rotation matrices ``[..., 3, 3]`` from quaternions ``[..., 4]``, order w, x, y, z.

    Quaternions are normalised first, so any non-zero scale is accepted.
    """
    w, x, y, z = F.normalize(quats, dim=-1).unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, dim=-1).reshape(quats.shape[:-1] + (3, 3))


def quat_scale_to_covar(quats: Tensor, scales: Tensor) -> Tensor:
    """3D covariances ``[..., 3, 3] = R S S^T R^T`` from quats ``[..., 4]`` and scales ``[..., 3]``.

    ``scales`` are standard deviations along the Gaussian's local axes. They are already activated. An INRIA PLY
    stores their log.
    """
    M = quat_to_rotmat(quats) * scales[..., None, :]  # R @ diag(s)
    return M @ M.transpose(-1, -2)


# ----------------------------------------------------------------------------
# 2. Projection (EWA splatting)
# ----------------------------------------------------------------------------
def world_to_camera(means: Tensor, covars: Tensor, viewmats: Tensor) -> tuple[Tensor, Tensor]:
    """Means ``[N, 3]`` and covariances ``[N, 3, 3]`` into each camera: ``[C, N, 3]``, ``[C, N, 3, 3]``."""
    R = viewmats[:, :3, :3]  # [C, 3, 3]
    t = viewmats[:, :3, 3]  # [C, 3]
    means_c = torch.einsum("cij,nj->cni", R, means) + t[:, None, :]
    covars_c = torch.einsum("cij,njk,clk->cnil", R, covars, R)
    return means_c, covars_c


def perspective_project(
    means_c: Tensor, covars_c: Tensor, Ks: Tensor, width: int, height: int
) -> tuple[Tensor, Tensor]:
    """Pinhole projection of camera-space Gaussians.

    Args:
        means_c: ``[C, N, 3]`` camera-space means. z > 0 in front of the camera.
        covars_c: ``[C, N, 3, 3]`` camera-space covariances.
        Ks: ``[C, 3, 3]`` intrinsics. fx, fy, cx and cy are used.

    Returns:
        ``means2d [C, N, 2]`` in pixels and ``covars2d [C, N, 2, 2]``. That is the first-order, EWA image of the
        covariance. The Jacobian is taken at the mean, with x/z and y/z clamped. The clamp is 1.3x the field of
        view's tangent about the principal point. So Gaussians far off screen don't blow up.
    """
    x, y, z = means_c.unbind(-1)
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    margin = FOV_CLAMP - 1.0
    tan_fovx, tan_fovy = 0.5 * width / fx, 0.5 * height / fy
    xz = torch.clamp(x / z, min=-(cx / fx + margin * tan_fovx), max=(width - cx) / fx + margin * tan_fovx)
    yz = torch.clamp(y / z, min=-(cy / fy + margin * tan_fovy), max=(height - cy) / fy + margin * tan_fovy)

    zero = torch.zeros_like(z)
    J = torch.stack(
        [fx / z, zero, -fx * xz / z, zero, fy / z, -fy * yz / z], dim=-1
    ).reshape(z.shape + (2, 3))
    covars2d = J @ covars_c @ J.transpose(-1, -2)
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)
    return means2d, covars2d


def project_gaussians(
    means: Tensor, quats: Tensor, scales: Tensor, viewmats: Tensor, Ks: Tensor, width: int, height: int, **options
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Project 3D Gaussians into ``C`` cameras, as gsplat's ``fully_fused_projection`` does.

    ``quats [N, 4]`` are rotations, order w, x, y, z, of any non-zero norm. ``scales [N, 3]`` are activated
    standard deviations. Their covariances go through :func:`project_covariances`. The keyword ``options`` are
    that function's."""
    return project_covariances(means, quat_scale_to_covar(quats, scales), viewmats, Ks, width, height, **options)


def project_covariances(
    means: Tensor,
    covars: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    opacities: Tensor | None = None,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    calc_compensations: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Project 3D Gaussians given by world-space covariances into ``C`` cameras, by EWA splatting.

    Args:
        means: ``[N, 3]`` world-space centres.
        covars: ``[N, 3, 3]`` world-space covariances. :func:`quat_scale_to_covar` makes them. 4DGS slices give
            them directly.
        viewmats: ``[C, 4, 4]`` world-to-camera, OpenCV convention.
        Ks: ``[C, 3, 3]`` intrinsics.
        opacities: ``[N]`` or ``[C, N]`` activated opacities. When given, as gsplat does, Gaussians with
            opacity < 1/255 are culled. The pixel radius shrinks to where alpha falls below 1/255. That changes
            no pixel, only the work.
        eps2d: added to the 2D covariance diagonal. A pixel-sized blur.
        near_plane, far_plane: depth range kept, in camera z.
        radius_clip: Gaussians whose pixel radii are both <= this are culled.
        calc_compensations: also return ``sqrt(det(cov2d) / det(cov2d + eps2d I))``. That is the "antialiased"
            opacity factor of Mip-Splatting.

    Returns:
        ``radii [C, N, 2] int32``: x, y pixel half-extents, 0 = culled.
        ``means2d [C, N, 2]``. ``depths [C, N]``, the camera z. ``conics [C, N, 3]``: the upper triangle
        ``a, b, c`` of the inverse 2D covariance. ``compensations [C, N]`` or None.
    """
    means_c, covars_c = world_to_camera(means, covars, viewmats)
    depths = means_c[..., 2]
    in_depth = (depths >= near_plane) & (depths <= far_plane)
    # Culled Gaussians may sit at z <= 0; give them a harmless z so neither
    # values nor gradients of the kept ones ever see inf or NaN.
    safe_means_c = torch.where(in_depth[..., None], means_c, torch.ones_like(means_c))
    means2d, covars2d = perspective_project(safe_means_c, covars_c, Ks, width, height)

    a, b, c = covars2d[..., 0, 0], covars2d[..., 0, 1], covars2d[..., 1, 1]
    det_orig = a * c - b * b
    a, c = a + eps2d, c + eps2d
    det = a * c - b * b
    ok = in_depth & (det > 0)
    safe_det = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([c / safe_det, -b / safe_det, a / safe_det], dim=-1)
    compensations = None
    if calc_compensations:
        ratio = torch.where(ok, det_orig / safe_det, torch.zeros_like(det))
        compensations = torch.sqrt(torch.clamp(ratio, min=0.0))

    with torch.no_grad():
        extend = torch.full_like(det, RADIUS_SIGMAS)
        if opacities is not None:
            opac = opacities.detach().expand_as(det)
            if compensations is not None:
                opac = opac * compensations.detach()
            ok = ok & (opac >= ALPHA_THRESHOLD)
            # Beyond this many sigmas alpha < 1/255 anyway (arXiv 2402.00525, B.2).
            tight = torch.sqrt(2.0 * torch.log(torch.clamp(opac, min=ALPHA_THRESHOLD) / ALPHA_THRESHOLD))
            extend = torch.minimum(extend, tight)
        radius_x = torch.ceil(extend * torch.sqrt(torch.clamp(a, min=0.0)))
        radius_y = torch.ceil(extend * torch.sqrt(torch.clamp(c, min=0.0)))
        ok = ok & ~((radius_x <= radius_clip) & (radius_y <= radius_clip))
        mx, my = means2d[..., 0], means2d[..., 1]
        on_screen = (mx + radius_x > 0) & (mx - radius_x < width) & (my + radius_y > 0) & (my - radius_y < height)
        ok = ok & on_screen
        radii = torch.stack([radius_x, radius_y], dim=-1) * ok[..., None]
        radii = radii.to(torch.int32)
    return radii, means2d, depths, conics, compensations


# ----------------------------------------------------------------------------
# 3. Spherical harmonics
# ----------------------------------------------------------------------------
def sh_basis(degree: int, dirs: Tensor) -> Tensor:
    """Real SH basis ``[..., (degree + 1) ** 2]`` at unit directions ``[..., 3]``.

    Ordering and signs match gsplat and INRIA 3DGS. ``f_dc`` is basis 0; ``f_rest`` follow in this order.
    """
    if not 0 <= degree <= 3:
        raise ValueError(f"sh_degree must be 0..3, got {degree}")
    out = [torch.full_like(dirs[..., 0], SH_C0)]
    if degree >= 1:
        x, y, z = dirs.unbind(-1)
        c1 = 0.4886025119029199
        out += [-c1 * y, c1 * z, -c1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            1.0925484305920792 * x * y,
            -1.0925484305920792 * y * z,
            0.9461746957575601 * zz - 0.3153915652525201,
            -1.0925484305920792 * x * z,
            0.5462742152960396 * (xx - yy),
        ]
    if degree >= 3:
        out += [
            -0.5900435899266435 * y * (3 * xx - yy),
            2.890611442640554 * x * y * z,
            (0.4570457994644658 - 2.285228997322329 * zz) * y,  # = -0.457 y (4z^2 - x^2 - y^2) on the unit sphere
            z * (1.865881662950577 * zz - 1.119528997770346),
            (0.4570457994644658 - 2.285228997322329 * zz) * x,
            1.445305721320277 * z * (xx - yy),
            -0.5900435899266435 * x * (xx - 3 * yy),
        ]
    return torch.stack(out, dim=-1)


def spherical_harmonics(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """Evaluate SH colour ``[..., 3]`` for view directions ``[..., 3]`` and coefficients ``[..., K, 3]``.

    ``dirs`` need not be normalised. Only the first ``(degree + 1) ** 2`` of the ``K`` coefficients are used.
    The result is the raw SH sum. The renderer adds 0.5 and clamps at 0, as gsplat and INRIA do.
    """
    n_bases = (degree + 1) ** 2
    if coeffs.shape[-2] < n_bases:
        raise ValueError(f"sh_degree {degree} needs {n_bases} coefficients per colour, got {coeffs.shape[-2]}")
    basis = sh_basis(degree, F.normalize(dirs, dim=-1))  # [..., n_bases]
    return (basis[..., None] * coeffs[..., :n_bases, :]).sum(dim=-2)


# ----------------------------------------------------------------------------
# 4. Tile intersection
# ----------------------------------------------------------------------------
def tile_grid(width: int, height: int, tile_size: int) -> tuple[int, int]:
    """Number of tiles ``(tile_width, tile_height)`` covering the image."""
    return math.ceil(width / tile_size), math.ceil(height / tile_size)


@torch.no_grad()
def isect_tiles(
    means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int, tile_height: int
) -> tuple[Tensor, Tensor, Tensor]:
    """List every (Gaussian, tile) overlap, sorted by camera, tile and depth.

    Args:
        means2d: ``[C, N, 2]``.
        radii: ``[C, N, 2]`` int. 0 = culled.
        depths: ``[C, N]``.

    Returns:
        ``tiles_per_gauss [C, N] int32``, ``isect_ids [M] int64`` and ``flatten_ids [M] int32``.
        ``isect_ids`` are the sorted keys. The camera id is in the top bits, then the tile id. The depth's
        float32 bit pattern is in the low 32 bits. Positive floats sort like their bits. ``flatten_ids`` is the
        Gaussian's index into the flattened ``[C * N]`` axis. The sort is stable. So ties keep the order camera,
        Gaussian, tile row, tile column.
    """
    C, N = depths.shape
    device = means2d.device
    tile_bits = key_bits(C, tile_width, tile_height)

    x0, y0, box_w, tiles_per_gauss = tile_boxes(means2d, radii, tile_size, tile_width, tile_height)

    # One row per overlap: which Gaussian, and which tile of its bounding box.
    gauss = torch.repeat_interleave(torch.arange(C * N, device=device), tiles_per_gauss)
    first = torch.cumsum(tiles_per_gauss, 0) - tiles_per_gauss
    k = torch.arange(gauss.numel(), device=device) - first[gauss]
    keys = isect_keys(gauss, k, x0, y0, box_w, depths, tile_width, tile_bits)

    isect_ids, order = torch.sort(keys, stable=True)
    flatten_ids = gauss[order].to(torch.int32)
    return tiles_per_gauss.reshape(C, N).to(torch.int32), isect_ids, flatten_ids


def key_bits(n_cameras: int, tile_width: int, tile_height: int) -> int:
    """Bits of the tile id in an intersection key. Raises if camera and tile ids overflow the 32-bit prefix."""
    tile_bits = (tile_width * tile_height).bit_length()
    if tile_bits + n_cameras.bit_length() > 32:
        raise ValueError(f"{n_cameras} cameras x {tile_width * tile_height} tiles do not fit the 32-bit key prefix")
    return tile_bits


def tile_boxes(means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int, tile_height: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Tile bounding box of every projected Gaussian, flattened over ``[C * N]``, int64.

    Returns the first tile column ``x0``, the first tile row ``y0`` and the box width ``box_w`` in tiles. Also
    ``tiles_per_gauss``, 0 for culled Gaussians."""
    rx, ry = radii[..., 0].float(), radii[..., 1].float()
    tx, ty = means2d[..., 0].detach() / tile_size, means2d[..., 1].detach() / tile_size
    x0 = torch.floor(tx - rx / tile_size).clamp(0, tile_width).long()
    x1 = torch.ceil(tx + rx / tile_size).clamp(0, tile_width).long()
    y0 = torch.floor(ty - ry / tile_size).clamp(0, tile_height).long()
    y1 = torch.ceil(ty + ry / tile_size).clamp(0, tile_height).long()
    visible = (radii[..., 0] > 0) & (radii[..., 1] > 0)
    tiles_per_gauss = ((x1 - x0) * (y1 - y0) * visible).flatten()  # [C * N]
    return x0.flatten(), y0.flatten(), (x1 - x0).flatten(), tiles_per_gauss


def isect_keys(gauss: Tensor, k: Tensor, x0: Tensor, y0: Tensor, box_w: Tensor, depths: Tensor, tile_width: int,
               tile_bits: int) -> Tensor:
    """Sort keys ``[M] int64`` of overlaps ``k`` of Gaussians ``gauss``: camera id, tile id, depth bits.

    ``k`` is the row-major index in the Gaussian's tile box. ``gauss`` indexes ``[C * N]``. See
    :func:`isect_tiles`."""
    N = depths.shape[1]
    box_w = box_w[gauss].clamp(min=1)  # >= 1: padding slots may point at an empty box
    tile_x = x0[gauss] + k % box_w
    tile_y = y0[gauss] + k // box_w
    tile_id = tile_y * tile_width + tile_x
    cam_id = gauss // N
    depth_bits = depths.detach().float().contiguous().view(torch.int32).flatten()[gauss].long() & 0xFFFFFFFF
    return (cam_id << (32 + tile_bits)) | (tile_id << 32) | depth_bits


PAD_KEY = torch.iinfo(torch.int64).max  # the key of an unused slot: sorts after every real overlap


@torch.no_grad()
def isect_tiles_fixed(
    boxes: tuple[Tensor, Tensor, Tensor, Tensor], depths: Tensor, tile_width: int, tile_height: int, capacity: int
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`isect_tiles` into ``capacity`` slots, without a host sync: fixed shapes, no data-sized tensor.

    Slot ``s`` holds overlap ``s`` of the list :func:`isect_tiles` builds, in the same order with the same keys.
    Its Gaussian is found by ``searchsorted`` in the running sum of ``tiles_per_gauss``. Slots past the total get
    the key :data:`PAD_KEY`, which sorts last, and Gaussian 0. If the total exceeds ``capacity``, the overlaps
    past it are dropped. Those are the last Gaussians' in ``[C * N]`` order.

    Args:
        boxes: :func:`tile_boxes` of the projected Gaussians. Its last entry, summed, is the total wanted.
        depths: ``[C, N]``.

    Returns:
        ``tiles_per_gauss [C, N] int32``, ``isect_ids [capacity] int64`` and ``flatten_ids [capacity] int32``.
        ``isect_ids`` are the sorted keys, real ones first.
    """
    C, N = depths.shape
    tile_bits = key_bits(C, tile_width, tile_height)
    x0, y0, box_w, tiles_per_gauss = boxes
    ends = torch.cumsum(tiles_per_gauss, 0)  # [C * N] end of each Gaussian's run of slots
    slot = torch.arange(capacity, device=depths.device)
    owner = torch.searchsorted(ends, slot, right=True)  # == C * N for slots past the total
    used = owner < C * N
    gauss = owner.clamp(max=C * N - 1)
    k = slot - (ends[gauss] - tiles_per_gauss[gauss])
    keys = torch.where(used, isect_keys(gauss, k, x0, y0, box_w, depths, tile_width, tile_bits), PAD_KEY)

    isect_ids, order = torch.sort(keys, stable=True)
    flatten_ids = torch.where(used, gauss, 0)[order].to(torch.int32)
    return tiles_per_gauss.reshape(C, N).to(torch.int32), isect_ids, flatten_ids


@torch.no_grad()
def tile_ranges(isect_ids: Tensor, n_cameras: int, tile_width: int, tile_height: int) -> Tensor:
    """The ranges ``r [C * n_tiles + 1] int32`` of keys sorted by :func:`isect_tiles_fixed`.

    Tile ``t`` of camera ``c`` has flat index ``c * n_tiles + t``. It owns ``flatten_ids[r[i] : r[i + 1]]``.
    Padding is excluded. ``r[-1]`` is the number of real overlaps kept. It is a ``searchsorted`` of the tile
    boundaries: fixed shapes, no host sync. The starts are those of :func:`isect_offsets`."""
    n_tiles = tile_width * tile_height
    tile_bits = n_tiles.bit_length()
    prefix = isect_ids >> 32
    linear = (prefix >> tile_bits) * n_tiles + (prefix & ((1 << tile_bits) - 1))
    linear = torch.where(isect_ids == PAD_KEY, n_cameras * n_tiles, linear)  # sorted: padding is last
    bounds = torch.arange(n_cameras * n_tiles + 1, device=isect_ids.device)
    return torch.searchsorted(linear, bounds).to(torch.int32)


@torch.no_grad()
def isect_offsets(isect_ids: Tensor, n_cameras: int, tile_width: int, tile_height: int) -> Tensor:
    """Start of each tile's run in the sorted intersections: ``[C, tile_height, tile_width] int32``.

    Tile ``t`` of camera ``c`` owns ``flatten_ids[offsets[c, t] : next offset]``. The last one runs to the end.
    """
    n_tiles = tile_width * tile_height
    tile_bits = n_tiles.bit_length()
    prefix = isect_ids >> 32
    linear = (prefix >> tile_bits) * n_tiles + (prefix & ((1 << tile_bits) - 1))
    counts = torch.bincount(linear, minlength=n_cameras * n_tiles)
    offsets = torch.cumsum(counts, 0) - counts
    return offsets.reshape(n_cameras, tile_height, tile_width).to(torch.int32)


# ----------------------------------------------------------------------------
# 5. Rasterization
# ----------------------------------------------------------------------------
def blend_tile(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    pixels: Tensor,
    alpha_cap: float = DEFAULT_ALPHA_CAP,
) -> tuple[Tensor, Tensor]:
    """Front-to-back blending of ``M`` depth-sorted Gaussians over ``P`` pixels.

    Args:
        means2d ``[M, 2]``, conics ``[M, 3]``, colors ``[M, D]``, opacities ``[M]``:
            the tile's Gaussians, nearest first.
        pixels: ``[P, 2]`` pixel centres, x and y.

    Returns:
        ``color [P, D]``, without background, and ``transmittance [P]``.

    Per pixel, in order:

    - ``sigma = 0.5 (a dx^2 + c dy^2) + b dx dy`` with ``d = mean - pixel``.
    - ``alpha = min(alpha_cap, opacity * exp(-sigma))``.
    - Gaussians with sigma < 0 or alpha < 1/255 are skipped.
    - Blending stops before the first Gaussian that would take the transmittance to <= 1e-4.

    It is written as a cumulative product, so the whole tile is one autograd graph.
    """
    d = means2d[None, :, :] - pixels[:, None, :]  # [P, M, 2]
    dx, dy = d[..., 0], d[..., 1]
    a, b, c = conics[:, 0], conics[:, 1], conics[:, 2]
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy  # [P, M]
    alpha = torch.clamp_max(opacities * torch.exp(-sigma), alpha_cap)
    used = (sigma >= 0) & (alpha >= ALPHA_THRESHOLD)
    alpha = torch.where(used, alpha, torch.zeros_like(alpha))

    # T after each Gaussian; it only falls, so "not done yet" is a prefix.
    T_after = torch.cumprod(1.0 - alpha, dim=1)
    T_before = torch.cat([torch.ones_like(T_after[:, :1]), T_after[:, :-1]], dim=1)
    kept = T_after > TRANSMITTANCE_THRESHOLD
    weights = torch.where(kept, alpha * T_before, torch.zeros_like(alpha))
    transmittance = torch.where(kept, 1.0 - alpha, torch.ones_like(alpha)).prod(dim=1)
    return weights @ colors, transmittance


def rasterize_to_pixels(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    backgrounds: Tensor | None = None,
    alpha_cap: float = DEFAULT_ALPHA_CAP,
    n_isects: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Blend projected Gaussians into images, one tile at a time.

    Args:
        means2d ``[C, N, 2]``, conics ``[C, N, 3]``, colors ``[C, N, D]``,
        opacities ``[C, N]``: per-camera projected Gaussians.
        isect_offsets: ``[C, tile_height, tile_width]`` from :func:`isect_offsets`.
        flatten_ids: ``[M]`` from :func:`isect_tiles`.
        backgrounds: ``[C, D]`` colour behind everything, or None for black.
        n_isects: 0-d, the used length of ``flatten_ids``. The rest is padding, as from
            :func:`isect_tiles_fixed`. None: all of it.

    Returns:
        ``colors [C, H, W, D]`` and ``alphas [C, H, W, 1]``. Alphas are 1 - transmittance.
    """
    C, N = means2d.shape[:2]
    D = colors.shape[-1]
    tile_height, tile_width = isect_offsets.shape[1:]
    flat_means, flat_conics = means2d.reshape(C * N, 2), conics.reshape(C * N, 3)
    flat_colors, flat_opac = colors.reshape(C * N, D), opacities.reshape(C * N)
    end = isect_offsets.new_tensor([flatten_ids.numel()]) if n_isects is None else n_isects.reshape(1).to(
        isect_offsets.dtype)
    ends = torch.cat([isect_offsets.flatten()[1:], end])
    starts, ends = isect_offsets.flatten().tolist(), ends.tolist()

    out_colors = means2d.new_zeros((C, height, width, D), dtype=colors.dtype)
    out_T = means2d.new_ones((C, height, width), dtype=colors.dtype)
    for tile, (start, end) in enumerate(zip(starts, ends)):
        if start == end:
            continue
        cam, rest = divmod(tile, tile_width * tile_height)
        y0, x0 = (rest // tile_width) * tile_size, (rest % tile_width) * tile_size
        y1, x1 = min(y0 + tile_size, height), min(x0 + tile_size, width)
        ys, xs = torch.meshgrid(
            torch.arange(y0, y1, device=means2d.device, dtype=means2d.dtype) + 0.5,
            torch.arange(x0, x1, device=means2d.device, dtype=means2d.dtype) + 0.5,
            indexing="ij",
        )
        pixels = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
        ids = flatten_ids[start:end].long()
        color, T = blend_tile(flat_means[ids], flat_conics[ids], flat_colors[ids], flat_opac[ids], pixels, alpha_cap)
        out_colors[cam, y0:y1, x0:x1] = color.reshape(y1 - y0, x1 - x0, D)
        out_T[cam, y0:y1, x0:x1] = T.reshape(y1 - y0, x1 - x0)

    if backgrounds is not None:
        out_colors = out_colors + out_T[..., None] * backgrounds[:, None, None, :]
    return out_colors, (1.0 - out_T)[..., None]


def tile_pixels(n_cameras: int, tile_width: int, tile_height: int, tile_size: int, device, dtype
                ) -> tuple[Tensor, Tensor]:
    """Pixel centres ``x, y [C * n_tiles, tile_size ** 2]`` of every tile.

    They are row-major within a tile. Pixels past the image's right and bottom edges are included."""
    tile = torch.arange(n_cameras * tile_width * tile_height, device=device) % (tile_width * tile_height)
    p = torch.arange(tile_size * tile_size, device=device)
    ys = (tile // tile_width)[:, None] * tile_size + (p // tile_size)[None, :]
    xs = (tile % tile_width)[:, None] * tile_size + (p % tile_size)[None, :]
    return xs.to(dtype) + 0.5, ys.to(dtype) + 0.5


@torch.no_grad()
def rasterize_tiles_fixed(means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor, width: int, height: int,
                          tile_size: int, tile_offsets: Tensor, flatten_ids: Tensor, per_tile: int,
                          backgrounds: Tensor | None = None, alpha_cap: float = DEFAULT_ALPHA_CAP,
                          batch: int | None = None) -> tuple[Tensor, Tensor]:
    """:func:`rasterize_to_pixels` for all tiles at once, without a host sync.

    It is the torch twin of the Triton kernel in ``triton.py``. The sync-free render stages run it on the torch
    backend, without autograd.

    Every tile walks its depth-sorted Gaussians ``batch`` at a time, ``per_tile`` in all. ``per_tile`` is a
    capacity. It should be at least the longest tile's list; else that tile's farthest Gaussians are dropped.
    Each pixel's transmittance and a "done" flag carry from batch to batch, as in the kernel. Shapes are fixed:
    ``[C * n_tiles, tile_size ** 2, batch]``. ``batch`` None picks the largest power of two in 16..256 that
    keeps such a block under 2^22 entries. The loop count depends on ``per_tile`` only.

    Args: as :func:`rasterize_to_pixels`, with ``tile_offsets [C * n_tiles + 1]`` in place of
    ``isect_offsets``. :func:`tile_ranges` makes them. Returns ``colors [C, H, W, D]`` and
    ``alphas [C, H, W, 1]``. They equal :func:`rasterize_to_pixels` up to float rounding; the sums run in
    another order.
    """
    C, N = means2d.shape[:2]
    D = colors.shape[-1]
    tile_width, tile_height = tile_grid(width, height, tile_size)
    flat_means, flat_conics = means2d.reshape(C * N, 2), conics.reshape(C * N, 3)
    flat_colors, flat_opac = colors.reshape(C * N, D), opacities.reshape(C * N)
    starts, ends = tile_offsets[:-1].long(), tile_offsets[1:].long()
    if batch is None:
        fits = (1 << 22) // max(starts.numel() * tile_size * tile_size, 1)
        batch = min(256, max(16, 1 << max(fits.bit_length() - 1, 0)))
    px, py = tile_pixels(C, tile_width, tile_height, tile_size, means2d.device, means2d.dtype)
    T = torch.ones_like(px)  # [tiles, P] transmittance so far
    done = torch.zeros(px.shape, dtype=torch.bool, device=px.device)
    acc = px.new_zeros(px.shape + (D,), dtype=colors.dtype)
    last = max(flatten_ids.numel() - 1, 0)
    for k0 in range(0, per_tile, batch):
        idx = starts[:, None] + k0 + torch.arange(batch, device=px.device)  # [tiles, B]
        in_range = idx < ends[:, None]
        g = flatten_ids[idx.clamp(max=last)].long()
        dx = flat_means[g, 0][:, None, :] - px[..., None]  # [tiles, P, B]
        dy = flat_means[g, 1][:, None, :] - py[..., None]
        a, b, c = (flat_conics[g, i][:, None, :] for i in range(3))
        sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
        alpha = torch.clamp_max(flat_opac[g][:, None, :] * torch.exp(-sigma), alpha_cap)
        used = (sigma >= 0) & (alpha >= ALPHA_THRESHOLD) & in_range[:, None, :] & ~done[..., None]
        alpha = torch.where(used, alpha, torch.zeros_like(alpha))
        steps = torch.cumprod(1.0 - alpha, dim=-1)
        before = T[..., None] * torch.cat([torch.ones_like(steps[..., :1]), steps[..., :-1]], dim=-1)
        kept = T[..., None] * steps > TRANSMITTANCE_THRESHOLD
        weights = torch.where(kept, alpha * before, torch.zeros_like(alpha))
        acc = acc + torch.einsum("tpb,tbd->tpd", weights, flat_colors[g])
        T = T * torch.where(kept, 1.0 - alpha, torch.ones_like(alpha)).prod(dim=-1)
        done = done | (used & ~kept).any(dim=-1)
    shape = (C, tile_height, tile_width, tile_size, tile_size)
    out_colors = acc.reshape(shape + (D,)).permute(0, 1, 3, 2, 4, 5).reshape(
        C, tile_height * tile_size, tile_width * tile_size, D)[:, :height, :width]
    out_T = T.reshape(shape).permute(0, 1, 3, 2, 4).reshape(
        C, tile_height * tile_size, tile_width * tile_size)[:, :height, :width]
    if backgrounds is not None:
        out_colors = out_colors + out_T[..., None] * backgrounds[:, None, None, :]
    return out_colors, (1.0 - out_T)[..., None]
