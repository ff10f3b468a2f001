"""Triton kernels for the hot step of 3D Gaussian splatting: tile rasterization.

One program runs per (camera, tile). It walks the tile's depth-sorted Gaussian ids in batches of ``BATCH``. For
a batch it evaluates all ``TILE * TILE`` pixels against all ``BATCH`` Gaussians at once, in ``[P, B]`` blocks. It
turns the sequential front-to-back recurrence into a cumulative product along the batch. It carries the
transmittance and a per-pixel "done" flag to the next batch. The semantics are exactly those of
:func:`reference.blend_tile` and of gsplat.

The backward pass replays the same batches front to back. It needs no per-pixel "last Gaussian" index. Take the
forward colour ``acc`` of a pixel. The colour still to come behind Gaussian ``j`` is ``acc - sum_{k<=j} w_k c_k``.
So every gradient is available in the forward order:

    dL/dalpha_j = T_j (g . c_j) - (g . (acc - F_j)) / (1 - alpha_j) - gT T_final / (1 - alpha_j)

Here ``g`` is the colour gradient and ``gT`` the transmittance gradient. ``F_j`` is the running
``sum_{k<=j} w_k c_k``. Per-Gaussian sums over the tile's pixels are accumulated with atomics.

Kernels run on CUDA, or on CPU through Triton's interpreter. For that, set ``TRITON_INTERPRET=1`` before this
module is imported. Projection, spherical harmonics and tile sorting stay in torch, in ``reference.py``.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from framegraph.kernels.backend import device_capability

from .reference import ALPHA_THRESHOLD, TRANSMITTANCE_THRESHOLD

# Globals read inside kernels must be constexpr.
_ALPHA_THRESHOLD = tl.constexpr(ALPHA_THRESHOLD)
_TRANSMITTANCE_THRESHOLD = tl.constexpr(TRANSMITTANCE_THRESHOLD)

# (Gaussians per inner step, warps per tile). Each kernel fits in registers without spilling on sm_89, sm_90 and
# sm_120. The forward steps through 8 Gaussians on sm_89, 16 elsewhere; the backward 8 everywhere.
# docs/renderers.md says how these were chosen.
FWD_BATCH, FWD_WARPS = 16, 8
FWD_BATCH_SM89 = 8
BWD_BATCH, BWD_WARPS = 8, 8


def forward_config(capability: int) -> tuple[int, int]:
    """``(BATCH, num_warps)`` of ``_rasterize_fwd_kernel`` on a GPU of compute ``capability``. 89 is sm_89."""
    return (FWD_BATCH_SM89 if capability == 89 else FWD_BATCH), FWD_WARPS


@triton.jit
def _tile_setup(pid, n_tiles, tile_w, W, H, TILE: tl.constexpr):
    """Camera id, pixel coordinates and in-image mask of this program's tile."""
    cam = pid // n_tiles
    t = pid % n_tiles
    p = tl.arange(0, TILE * TILE)
    py = (t // tile_w) * TILE + p // TILE
    px = (t % tile_w) * TILE + p % TILE
    inside = (py < H) & (px < W)
    pix = (cam.to(tl.int64) * H + py) * W + px  # flat pixel index into [C, H, W]
    return pix, px.to(tl.float32) + 0.5, py.to(tl.float32) + 0.5, inside


@triton.jit
def _batch_alphas(
    ids_ptr, means2d_ptr, conics_ptr, opac_ptr, cur, end, fx, fy, done, T, alpha_cap,
    BATCH: tl.constexpr,
):
    """Alphas of one batch of Gaussians at every pixel of the tile, and the blend bookkeeping.

    Returns the Gaussian ids, the in-range mask, offsets ``dx, dy``, conic entries and opacities. Also
    ``vis = exp(-sigma)`` and the effective alpha, 0 where skipped. Also the transmittance after each Gaussian.
    Last, ``kept``, which Gaussians are blended, and ``stop``, which pixels finish in this batch.
    """
    idx = cur + tl.arange(0, BATCH)
    in_range = idx < end
    g = tl.load(ids_ptr + idx, mask=in_range, other=0).to(tl.int64)
    mx = tl.load(means2d_ptr + 2 * g, mask=in_range, other=0.0)
    my = tl.load(means2d_ptr + 2 * g + 1, mask=in_range, other=0.0)
    ca = tl.load(conics_ptr + 3 * g, mask=in_range, other=0.0)
    cb = tl.load(conics_ptr + 3 * g + 1, mask=in_range, other=0.0)
    cc = tl.load(conics_ptr + 3 * g + 2, mask=in_range, other=0.0)
    op = tl.load(opac_ptr + g, mask=in_range, other=0.0)

    dx = mx[None, :] - fx[:, None]  # [P, B]
    dy = my[None, :] - fy[:, None]
    sigma = 0.5 * (ca[None, :] * dx * dx + cc[None, :] * dy * dy) + cb[None, :] * dx * dy
    vis = tl.exp(-sigma)
    alpha = tl.minimum(op[None, :] * vis, alpha_cap)
    used = (sigma >= 0) & (alpha >= _ALPHA_THRESHOLD) & in_range[None, :] & (done == 0)[:, None]
    alpha = tl.where(used, alpha, 0.0)
    T_after = T[:, None] * tl.cumprod(1.0 - alpha, axis=1)
    kept = T_after > _TRANSMITTANCE_THRESHOLD
    stop = tl.max((used & (T_after <= _TRANSMITTANCE_THRESHOLD)).to(tl.int32), axis=1)
    return g, in_range, dx, dy, ca, cb, cc, op, vis, alpha, T_after, kept, used, stop


@triton.jit
def _rasterize_fwd_kernel(
    means2d_ptr, conics_ptr, colors_ptr, opac_ptr,  # [C*N, 2], [C*N, 3], [C*N, D], [C*N]
    offsets_ptr, ids_ptr,  # [C*n_tiles + 1] int32, [M] int32
    out_ptr, trans_ptr,  # [C, H, W, D], [C, H, W]
    W, H, tile_w, n_tiles, alpha_cap,
    TILE: tl.constexpr, BATCH: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
):
    pid = tl.program_id(0)
    pix, fx, fy, inside = _tile_setup(pid, n_tiles, tile_w, W, H, TILE)
    ch = tl.arange(0, DP)  # channels, padded to a power of two
    start = tl.load(offsets_ptr + pid)
    end = tl.load(offsets_ptr + pid + 1)

    T = tl.full([TILE * TILE], 1.0, tl.float32)
    done = (~inside).to(tl.int32)
    acc = tl.zeros([TILE * TILE, DP], dtype=tl.float32)
    n_alive = tl.sum(1 - done)
    cur = start
    while (cur < end) & (n_alive > 0):
        g, in_range, dx, dy, ca, cb, cc, op, vis, alpha, T_after, kept, used, stop = _batch_alphas(
            ids_ptr, means2d_ptr, conics_ptr, opac_ptr, cur, end, fx, fy, done, T, alpha_cap, BATCH
        )
        weights = tl.where(kept, alpha * (T_after / (1.0 - alpha)), 0.0)  # alpha_j * T before j
        for d in tl.static_range(D):
            col_d = tl.load(colors_ptr + g * D + d, mask=in_range, other=0.0)
            acc += tl.where(ch[None, :] == d, tl.sum(weights * col_d[None, :], axis=1)[:, None], 0.0)
        T = tl.min(tl.where(kept, T_after, T[:, None]), axis=1)
        done = done | stop
        n_alive = tl.sum(1 - done)
        cur += BATCH

    tl.store(out_ptr + pix[:, None] * D + ch[None, :], acc, mask=inside[:, None] & (ch[None, :] < D))
    tl.store(trans_ptr + pix, T, mask=inside)


@triton.jit
def _rasterize_bwd_kernel(
    means2d_ptr, conics_ptr, colors_ptr, opac_ptr,
    offsets_ptr, ids_ptr,
    out_ptr, trans_ptr, g_out_ptr, g_trans_ptr,  # forward outputs and their gradients
    g_means2d_ptr, g_conics_ptr, g_colors_ptr, g_opac_ptr,  # accumulated with atomics
    W, H, tile_w, n_tiles, alpha_cap,
    TILE: tl.constexpr, BATCH: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
):
    pid = tl.program_id(0)
    pix, fx, fy, inside = _tile_setup(pid, n_tiles, tile_w, W, H, TILE)
    ch = tl.arange(0, DP)
    ch_ok = inside[:, None] & (ch[None, :] < D)
    start = tl.load(offsets_ptr + pid)
    end = tl.load(offsets_ptr + pid + 1)

    G = tl.load(g_out_ptr + pix[:, None] * D + ch[None, :], mask=ch_ok, other=0.0)  # [P, DP]
    acc_out = tl.load(out_ptr + pix[:, None] * D + ch[None, :], mask=ch_ok, other=0.0)
    g_T = tl.load(g_trans_ptr + pix, mask=inside, other=0.0)
    T_final = tl.load(trans_ptr + pix, mask=inside, other=1.0)
    g_acc = tl.sum(G * acc_out, axis=1)  # g . (all blended colour)

    T = tl.full([TILE * TILE], 1.0, tl.float32)
    done = (~inside).to(tl.int32)
    front = tl.zeros([TILE * TILE], dtype=tl.float32)  # g . sum_{k<j} w_k c_k
    n_alive = tl.sum(1 - done)
    cur = start
    while (cur < end) & (n_alive > 0):
        g, in_range, dx, dy, ca, cb, cc, op, vis, alpha, T_after, kept, used, stop = _batch_alphas(
            ids_ptr, means2d_ptr, conics_ptr, opac_ptr, cur, end, fx, fy, done, T, alpha_cap, BATCH
        )
        one_minus = 1.0 - alpha
        T_before = T_after / one_minus
        blended = kept & used
        weights = tl.where(blended, alpha * T_before, 0.0)
        g_dot_c = tl.zeros([TILE * TILE, BATCH], dtype=tl.float32)  # g . c_j at each pixel
        for d in tl.static_range(D):
            col_d = tl.load(colors_ptr + g * D + d, mask=in_range, other=0.0)
            G_d = tl.sum(tl.where(ch[None, :] == d, G, 0.0), axis=1)
            g_dot_c += G_d[:, None] * col_d[None, :]
            tl.atomic_add(g_colors_ptr + g * D + d, tl.sum(weights * G_d[:, None], axis=0), mask=in_range)
        front_after = front[:, None] + tl.cumsum(weights * g_dot_c, axis=1)
        behind = g_acc[:, None] - front_after  # g . colour blended behind j
        g_alpha = T_before * g_dot_c - (behind + g_T[:, None] * T_final[:, None]) / one_minus
        # alpha = min(cap, o * vis): no gradient where the cap is active.
        g_alpha = tl.where(blended & (op[None, :] * vis <= alpha_cap), g_alpha, 0.0)
        g_sigma = -op[None, :] * vis * g_alpha

        tl.atomic_add(g_opac_ptr + g, tl.sum(vis * g_alpha, axis=0), mask=in_range)
        tl.atomic_add(g_conics_ptr + 3 * g, tl.sum(0.5 * dx * dx * g_sigma, axis=0), mask=in_range)
        tl.atomic_add(g_conics_ptr + 3 * g + 1, tl.sum(dx * dy * g_sigma, axis=0), mask=in_range)
        tl.atomic_add(g_conics_ptr + 3 * g + 2, tl.sum(0.5 * dy * dy * g_sigma, axis=0), mask=in_range)
        g_mx = tl.sum((ca[None, :] * dx + cb[None, :] * dy) * g_sigma, axis=0)
        g_my = tl.sum((cb[None, :] * dx + cc[None, :] * dy) * g_sigma, axis=0)
        tl.atomic_add(g_means2d_ptr + 2 * g, g_mx, mask=in_range)
        tl.atomic_add(g_means2d_ptr + 2 * g + 1, g_my, mask=in_range)

        front = front + tl.sum(weights * g_dot_c, axis=1)
        T = tl.min(tl.where(kept, T_after, T[:, None]), axis=1)
        done = done | stop
        n_alive = tl.sum(1 - done)
        cur += BATCH


# ----------------------------------------------------------------------------
# Launchers (registered as torch custom ops in ``__init__.py``).
# ----------------------------------------------------------------------------
def _grid(means2d: Tensor, colors: Tensor, width: int, height: int, tile_size: int) -> tuple[int, int, int, int]:
    """``(programs, tiles per row, tiles per camera, padded channel count)``. Programs are cameras x tiles."""
    tile_w, tile_h = -(-width // tile_size), -(-height // tile_size)
    return means2d.shape[0] * tile_w * tile_h, tile_w, tile_w * tile_h, triton.next_power_of_2(colors.shape[-1])


def rasterize_fwd(means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor, tile_offsets: Tensor,
                  flatten_ids: Tensor, width: int, height: int, tile_size: int, alpha_cap: float
                  ) -> tuple[Tensor, Tensor]:
    """Blended colour ``[C, H, W, D]``, without background, and transmittance ``[C, H, W]``.

    Inputs are float32 and contiguous: ``means2d [C, N, 2]``, ``conics [C, N, 3]``, ``colors [C, N, D]``,
    ``opacities [C, N]``. ``tile_offsets [C * n_tiles + 1]`` int32 holds the tile starts, then the number of
    intersections. ``flatten_ids [M]`` int32 is sorted by camera, tile and depth.
    """
    C, D = means2d.shape[0], colors.shape[-1]
    programs, tile_w, n_tiles, DP = _grid(means2d, colors, width, height, tile_size)
    out = means2d.new_zeros((C, height, width, D))
    trans = means2d.new_ones((C, height, width))
    if programs > 0 and flatten_ids.numel() > 0:
        batch, warps = forward_config(device_capability(means2d.device))
        _rasterize_fwd_kernel[(programs,)](
            means2d, conics, colors, opacities, tile_offsets, flatten_ids, out, trans,
            width, height, tile_w, n_tiles, alpha_cap,
            TILE=tile_size, BATCH=batch, D=D, DP=DP, num_warps=warps,
        )
    return out, trans


def rasterize_bwd(saved: list[Tensor], grad_out: Tensor, grad_trans: Tensor, width: int, height: int,
                  tile_size: int, alpha_cap: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients w.r.t. ``means2d, conics, colors, opacities`` of :func:`rasterize_fwd`.

    ``saved``: the forward's six tensor arguments, then its two outputs, ``out`` and ``trans``.
    """
    means2d, conics, colors, opacities, tile_offsets, flatten_ids, out, trans = saved
    programs, tile_w, n_tiles, DP = _grid(means2d, colors, width, height, tile_size)
    grads = [torch.zeros_like(t) for t in (means2d, conics, colors, opacities)]
    if programs > 0 and flatten_ids.numel() > 0:
        _rasterize_bwd_kernel[(programs,)](
            means2d, conics, colors, opacities, tile_offsets, flatten_ids,
            out, trans, grad_out.contiguous(), grad_trans.contiguous(), *grads,
            width, height, tile_w, n_tiles, alpha_cap,
            TILE=tile_size, BATCH=BWD_BATCH, D=colors.shape[-1], DP=DP, num_warps=BWD_WARPS,
        )
    return tuple(grads)
