"""3D Gaussian splatting: render INRIA and gsplat scenes with the semantics of gsplat.

Public API:

- :func:`rasterize`: project, colour and blend Gaussians into a batch of cameras. Triton kernels on CUDA, the
  readable torch reference elsewhere.
- :func:`rasterize_to_pixels`: the blending step alone, on either backend.
- :class:`TileCapacity`: fixed-capacity tile lists kept across frames. No host sync per frame.
- :class:`GaussianScene`, :func:`load_ply`, :func:`save_ply`, :func:`load_splat`, :func:`load_scene`,
  :func:`check_fits`: scenes in the formats users have.

Every fast op in framegraph has this layout. ``reference.py`` is the pure-torch twin of every step.
``triton.py`` holds the kernels. This file dispatches between them. It registers the kernels as torch custom
ops: ``torch.ops.framegraph.gaussians_rasterize_fwd`` and ``_bwd``. ``io.py`` reads and writes the file formats.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from framegraph.kernels.backend import Backend, resolve_backend

from ..capacity import Capacity
from . import reference
from .io import load_ply, load_scene, load_splat, save_ply
from .reference import DEFAULT_ALPHA_CAP
from .scene import GaussianScene, SceneError, SceneTooLargeError, check_fits, random_scene

__all__ = [
    "rasterize",
    "rasterize_to_pixels",
    "TileCapacity",
    "RENDER_MODES",
    "GaussianScene",
    "SceneError",
    "SceneTooLargeError",
    "check_fits",
    "random_scene",
    "load_ply",
    "save_ply",
    "load_splat",
    "load_scene",
]

RenderMode = Literal["RGB", "D", "ED", "RGB+D", "RGB+ED"]
RasterizeMode = Literal["classic", "antialiased"]
RENDER_MODES: tuple[str, ...] = get_args(RenderMode)
RASTERIZE_MODES: tuple[str, ...] = get_args(RasterizeMode)
TRITON_TILE_SIZES = (4, 8, 16, 32)


def rasterize(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    sh_degree: int | None = None,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    radius_clip: float = 0.0,
    backgrounds: Tensor | None = None,
    tile_size: int = 16,
    render_mode: RenderMode = "RGB",
    alpha_cap: float = DEFAULT_ALPHA_CAP,
    rasterize_mode: RasterizeMode = "classic",
    backend: Backend = "auto",
    validate: bool = True,
    tiles: TileCapacity | None = None,
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Render 3D Gaussians into ``C`` cameras, with the same semantics as gsplat's ``rasterization()``.

    The pipeline projects each Gaussian into each camera: EWA splatting with an ``eps2d`` blur. It evaluates
    colours, directly or from spherical harmonics of the direction camera -> Gaussian. It lists Gaussian-tile
    overlaps sorted by depth. It alpha-blends each tile front to back.

    Args:
        means: ``[N, 3]`` Gaussian centres in world space.
        quats: ``[N, 4]`` rotations as quaternions, order **w, x, y, z**. They are normalised here, so any
            non-zero norm is fine.
        scales: ``[N, 3]`` **activated** scales: standard deviations along the Gaussian's axes. An INRIA PLY
            stores their log.
        opacities: ``[N]`` **activated** opacities in [0, 1]. An INRIA PLY stores their logit.
        colors: without ``sh_degree``, ``[N, D]`` or ``[C, N, D]`` per-Gaussian features of any D, e.g. RGB.
            With ``sh_degree``, SH coefficients ``[N, K, 3]`` or ``[C, N, K, 3]``, ``K >= (sh_degree + 1) ** 2``.
            The colour is then ``max(SH(dir) + 0.5, 0)``. ``dir`` runs from the camera centre to the Gaussian.
            This is the gsplat and INRIA convention.
        viewmats: ``[C, 4, 4]`` **world-to-camera** matrices, OpenCV convention. X right, y down, z forward;
            visible points have z > 0.
        Ks: ``[C, 3, 3]`` pinhole intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` in pixels. Pixel row i,
            col j has its centre at ``(j + 0.5, i + 0.5)``.
        width, height: image size in pixels.
        sh_degree: 0..3 to treat ``colors`` as SH coefficients. None for plain colours.
        near_plane, far_plane: Gaussians with camera z outside ``[near, far]`` are culled.
        eps2d: added to the diagonal of each 2D covariance. That is a blur of about 0.3 px.
        radius_clip: Gaussians whose pixel radii are both <= this are skipped.
        backgrounds: ``[C, D]`` or ``[D]`` colour behind the Gaussians. None is black. In depth modes the depth
            channel's background is 0.
        tile_size: tile edge in pixels. 16, like gsplat. The Triton backend takes 4, 8, 16 or 32.
        render_mode: ``"RGB"`` gives colours. ``"D"`` gives accumulated depth ``sum w_i z_i``. ``"ED"`` gives
            expected depth, ``D / alpha``. ``"RGB+D"`` and ``"RGB+ED"`` give colours with the depth as last
            channel.
        alpha_cap: maximum per-Gaussian alpha. 0.999 is gsplat's, 0.99 INRIA's.
        rasterize_mode: ``"classic"`` or ``"antialiased"``. Antialiased scales opacity by
            ``sqrt(det(cov2d) / det(cov2d + eps2d I))``, as in Mip-Splatting and gsplat.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. Auto runs the Triton kernels on CUDA float32 tensors
            and the torch reference elsewhere.
        validate: check shapes, devices and finiteness. That is one host sync. Turn it off on a hot path once
            the inputs are known good.
        tiles: None, or the :class:`TileCapacity` of a stream of frames. None sizes tile lists by the data, with
            a few host syncs a frame. A :class:`TileCapacity` gives fixed-capacity tile lists. There is no host
            sync after its first frame. The render stages pass one. There is no autograd on the torch backend
            then.

    Returns:
        A tuple:

        - **colors** ``[C, H, W, D]``. D = 3 for RGB, 1 for D/ED, 4 for RGB+D/ED.
        - **alphas** ``[C, H, W, 1]``, the accumulated opacity ``1 - T``.
        - **meta** dict: ``radii [C, N, 2] int32``, ``means2d [C, N, 2]``,
          ``depths [C, N]``, ``conics [C, N, 3]``, ``opacities [C, N]``,
          ``tiles_per_gauss [C, N]``, ``isect_ids [M]``, ``flatten_ids [M]``,
          ``isect_offsets [C, tile_height, tile_width]``, ``tile_width``,
          ``tile_height``, ``tile_size``, ``width``, ``height``, ``n_cameras``,
          ``backend`` and ``n_isects``.
        - ``n_isects`` is 0-d with ``tiles``: the used length of the padded ``isect_ids`` and ``flatten_ids``.
          It is None without.

    Differentiable w.r.t. means, quats, scales, opacities, colors and backgrounds on both backends.
    """
    if validate:
        _validate(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree,
                  backgrounds, tile_size, render_mode, rasterize_mode)
    chosen = resolve_backend(backend, means, op="rasterize", auto_dtypes=(torch.float32,))
    C, N = viewmats.shape[0], means.shape[0]

    radii, means2d, depths, conics, compensations = reference.project_gaussians(
        means, quats, scales, viewmats, Ks, width, height,
        opacities=opacities, eps2d=eps2d, near_plane=near_plane, far_plane=far_plane,
        radius_clip=radius_clip, calc_compensations=rasterize_mode == "antialiased",
    )
    opacities_c = opacities[None, :].expand(C, N)
    if compensations is not None:
        opacities_c = opacities_c * compensations

    if sh_degree is None:
        colors_c = per_camera(colors, C, 3)
    else:
        raw = reference.spherical_harmonics(sh_degree, view_dirs(means, viewmats), per_camera(colors, C, 4))
        colors_c = torch.clamp_min(raw + 0.5, 0.0)

    render_colors, render_alphas, meta = blend_projected(
        means2d, radii, depths, conics, colors_c, opacities_c, width, height, backgrounds=backgrounds,
        tile_size=tile_size, render_mode=render_mode, alpha_cap=alpha_cap, backend=chosen, tiles=tiles)
    return render_colors, render_alphas, meta


@dataclass
class TileCapacity:
    """The capacities a renderer keeps from frame to frame. Its steady-state frames then make no host sync.

    See :mod:`framegraph.renderers.capacity`. Pass one to :func:`rasterize`, one per stream of frames.

    Attributes:
        isects: the (Gaussian, tile) overlaps of a frame. A frame that needs more than it holds drops the
            overlaps of its last Gaussians, in index order. The next frames get room for them.
        per_tile: the longest tile list, for the torch twin of the Triton kernel,
            :func:`reference.rasterize_tiles_fixed`. An overflowing frame drops the farthest Gaussians of its
            longest tiles.
    """

    isects: Capacity = field(default_factory=lambda: Capacity(headroom=1.5, quantum=1024))
    per_tile: Capacity = field(default_factory=lambda: Capacity(headroom=1.5, quantum=64))

    @property
    def overflows(self) -> int:
        return self.isects.overflows + self.per_tile.overflows


def per_camera(x: Tensor, C: int, rank: int) -> Tensor:
    """``x`` with a leading camera axis of size ``C``. As is if it has ``rank`` dims, else expanded without a copy."""
    return x if x.dim() == rank else x[None].expand(C, *x.shape)


def view_dirs(means: Tensor, viewmats: Tensor) -> Tensor:
    """Directions ``[C, N, 3]`` from each camera centre to each point ``means [N, 3]``. Not normalised."""
    campos = torch.linalg.inv_ex(viewmats)[0][:, :3, 3]  # [C, 3] camera centres (inv_ex: no status read back)
    return means[None, :, :] - campos[:, None, :]


def expect_shape(name: str, t: Any, shape: tuple[Any, ...]) -> None:
    """Raise if ``t`` is not a tensor of ``shape``. Ints in ``shape`` are fixed, None is free."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")


def check_render_args(means: Tensor, viewmats: Tensor, Ks: Tensor, width: int, height: int, tile_size: int,
                      render_mode: str, sh_degree: int | None, colors: Tensor,
                      backgrounds: Tensor | None) -> tuple[int, int]:
    """The checks 3DGS and 4DGS share. Returns ``(N, C)``.

    They check render mode, image size, ``means [N, 3]``, cameras, plain colours ``[N, D]`` or ``[C, N, D]``,
    ``sh_degree`` and backgrounds."""
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode must be one of {RENDER_MODES}, got {render_mode!r}")
    for name, v in (("width", width), ("height", height), ("tile_size", tile_size)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    expect_shape("means", means, (None, 3))
    expect_shape("viewmats", viewmats, (None, 4, 4))
    N, C = means.shape[0], viewmats.shape[0]
    expect_shape("Ks", Ks, (C, 3, 3))
    if sh_degree is None:
        expect_shape("colors", colors, (N, None) if colors.dim() == 2 else (C, N, None))
    elif not isinstance(sh_degree, int) or not 0 <= sh_degree <= 3:
        raise ValueError(f"sh_degree must be an int in 0..3 or None, got {sh_degree!r}")
    if backgrounds is not None:
        D = 3 if sh_degree is not None else colors.shape[-1]
        expect_shape("backgrounds", backgrounds, (D,) if backgrounds.dim() == 1 else (C, D))
    return N, C


def check_values(named: dict[str, Tensor], invalid: dict[str, tuple[Tensor, str]]) -> None:
    """Every tensor of ``named`` is floating point, on the first one's device and finite. One host sync.

    ``invalid`` maps a name to a bool mask of bad entries and what is wrong with them. No entry may be set."""
    first, device = next(iter(named.items()))[0], next(iter(named.values())).device
    for name, t in named.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but {first} is on {device}; put all inputs on one device")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating point tensor, got {t.dtype}")
    checks = [torch.isfinite(t).all() for t in named.values()] + [~mask.any() for mask, _ in invalid.values()]
    flags = torch.stack(checks).tolist() if checks else []
    for name, ok in zip(named, flags):
        if not ok:
            raise ValueError(f"{name} contains {int((~torch.isfinite(named[name])).sum())} NaN or Inf values")
    for (name, (mask, what)), ok in zip(invalid.items(), flags[len(named):]):
        if not ok:
            raise ValueError(f"{name} has {int(mask.sum())} {what}")


def _validate(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree,
              backgrounds, tile_size, render_mode, rasterize_mode) -> None:
    if rasterize_mode not in RASTERIZE_MODES:
        raise ValueError(f"rasterize_mode must be one of {RASTERIZE_MODES}, got {rasterize_mode!r}")
    N, C = check_render_args(means, viewmats, Ks, width, height, tile_size, render_mode, sh_degree, colors,
                             backgrounds)
    expect_shape("quats", quats, (N, 4))
    expect_shape("scales", scales, (N, 3))
    expect_shape("opacities", opacities, (N,))
    if sh_degree is not None:
        expect_shape("colors (SH coefficients)", colors, (N, None, 3) if colors.dim() == 3 else (C, N, None, 3))
        if colors.shape[-2] < (sh_degree + 1) ** 2:
            raise ValueError(
                f"sh_degree={sh_degree} needs {(sh_degree + 1) ** 2} SH coefficients per channel, "
                f"colors has {colors.shape[-2]}"
            )
    named = {"means": means, "quats": quats, "scales": scales, "opacities": opacities,
             "colors": colors, "viewmats": viewmats, "Ks": Ks}
    if backgrounds is not None:
        named["backgrounds"] = backgrounds
    check_values(named, {"quats": (quats.detach().norm(dim=-1) == 0,
                                   "zero-norm quaternions; a rotation needs a non-zero quaternion")})


def blend_projected(means2d: Tensor, radii: Tensor, depths: Tensor, conics: Tensor, colors_c: Tensor,
                    opacities_c: Tensor, width: int, height: int, *, backgrounds: Tensor | None,
                    tile_size: int, render_mode: RenderMode, alpha_cap: float, backend: Backend,
                    tiles: TileCapacity | None = None) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """The steps after projection, shared by 3DGS and 4DGS.

    They are: depth channels for the render mode, tile intersection and sort, front-to-back blending, expected
    depth. ``backend`` is "triton" or "torch". ``tiles`` None gives the readable, data-sized tile lists, with a
    few host syncs a frame. A :class:`TileCapacity` gives fixed-capacity lists, by :func:`_blend_fixed`. There is
    no host sync after the first frame. Then ``isect_ids`` and ``flatten_ids`` in the meta end in padding.
    ``n_isects`` is their used length.

    Args: the projected Gaussians per camera. ``means2d [C, N, 2]``, ``radii [C, N, 2]``, ``depths [C, N]``,
    ``conics [C, N, 3]``, ``colors_c [C, N, D]``, ``opacities_c [C, N]``. ``backgrounds`` is ``[C, D]``, ``[D]``
    or None. Returns ``(colors [C, H, W, D'], alphas [C, H, W, 1], meta)``.
    """
    C = means2d.shape[0]
    if backgrounds is not None and backgrounds.dim() == 1:
        backgrounds = backgrounds[None].expand(C, -1)
    if render_mode in ("RGB+D", "RGB+ED"):
        colors_c = torch.cat([colors_c, depths[..., None]], dim=-1)
        if backgrounds is not None:
            backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(C, 1)], dim=-1)
    elif render_mode in ("D", "ED"):
        colors_c = depths[..., None]
        if backgrounds is not None:
            backgrounds = backgrounds.new_zeros(C, 1)

    tile_width, tile_height = reference.tile_grid(width, height, tile_size)
    if tiles is None or means2d.shape[1] == 0:
        tiles_per_gauss, isect_ids, flatten_ids = reference.isect_tiles(
            means2d, radii, depths, tile_size, tile_width, tile_height
        )
        offsets = reference.isect_offsets(isect_ids, C, tile_width, tile_height)
        n_isects = None
        render_colors, render_alphas = rasterize_to_pixels(
            means2d, conics, colors_c, opacities_c, width, height, tile_size, offsets, flatten_ids,
            backgrounds=backgrounds, alpha_cap=alpha_cap, backend=backend,
        )
    else:
        tiles_per_gauss, isect_ids, flatten_ids, ranges, (render_colors, render_alphas) = _blend_fixed(
            means2d, radii, depths, conics, colors_c, opacities_c, width, height, backgrounds=backgrounds,
            tile_size=tile_size, alpha_cap=alpha_cap, backend=backend, tiles=tiles)
        offsets, n_isects = ranges[:-1].reshape(C, tile_height, tile_width), ranges[-1]
    if render_mode in ("ED", "RGB+ED"):
        expected = render_colors[..., -1:] / render_alphas.clamp(min=1e-10)
        render_colors = torch.cat([render_colors[..., :-1], expected], dim=-1)

    meta = {
        "radii": radii, "means2d": means2d, "depths": depths, "conics": conics,
        "opacities": opacities_c, "tiles_per_gauss": tiles_per_gauss, "isect_ids": isect_ids,
        "flatten_ids": flatten_ids, "isect_offsets": offsets, "tile_width": tile_width,
        "tile_height": tile_height, "tile_size": tile_size, "width": width, "height": height,
        "n_cameras": C, "backend": backend, "n_isects": n_isects,
    }
    return render_colors, render_alphas, meta


def _blend_fixed(means2d: Tensor, radii: Tensor, depths: Tensor, conics: Tensor, colors_c: Tensor,
                 opacities_c: Tensor, width: int, height: int, *, backgrounds: Tensor | None, tile_size: int,
                 alpha_cap: float, backend: Backend, tiles: TileCapacity
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
    """Tile lists and blending of :func:`blend_projected` without a host sync after the first frame.

    Intersections go in ``tiles.isects`` slots, by :func:`reference.isect_tiles_fixed`. Tile ranges come from
    ``searchsorted``, by :func:`reference.tile_ranges`. Then the Triton kernels run. On the torch backend their
    torch twin :func:`reference.rasterize_tiles_fixed` runs instead. It takes at most ``tiles.per_tile`` Gaussians
    per tile. Its memory is about 2^22 floats a block. On a CPU it is slower than the readable per-tile loop.

    Returns ``tiles_per_gauss [C, N]``, ``isect_ids [cap]``, ``flatten_ids [cap]``, the tile ranges
    ``[C * n_tiles + 1]`` and ``(colors, alphas)``.
    """
    C, N = means2d.shape[:2]
    tile_width, tile_height = reference.tile_grid(width, height, tile_size)
    boxes = reference.tile_boxes(means2d, radii, tile_size, tile_width, tile_height)
    cap = tiles.isects.size(boxes[3].sum(), limit=C * N * tile_width * tile_height)
    tiles_per_gauss, isect_ids, flatten_ids = reference.isect_tiles_fixed(boxes, depths, tile_width, tile_height,
                                                                          cap)
    ranges = reference.tile_ranges(isect_ids, C, tile_width, tile_height)
    if backend == "torch":
        per_tile = tiles.per_tile.size((ranges[1:] - ranges[:-1]).max(), limit=C * N)
        rendered = reference.rasterize_tiles_fixed(
            means2d, conics, colors_c, opacities_c, width, height, tile_size, ranges, flatten_ids, per_tile,
            backgrounds=backgrounds, alpha_cap=alpha_cap)
    else:
        rendered = rasterize_to_pixels(
            means2d, conics, colors_c, opacities_c, width, height, tile_size, ranges[:-1].reshape(C, -1),
            flatten_ids, backgrounds=backgrounds, alpha_cap=alpha_cap, backend=backend, n_isects=ranges[-1])
    return tiles_per_gauss, isect_ids, flatten_ids, ranges, rendered


def rasterize_to_pixels(means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor, width: int, height: int,
                        tile_size: int, isect_offsets: Tensor, flatten_ids: Tensor, backgrounds: Tensor | None = None,
                        alpha_cap: float = DEFAULT_ALPHA_CAP, *, backend: Backend = "auto",
                        n_isects: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Blend projected Gaussians into images. Differentiable on both backends.

    The torch backend runs :func:`reference.rasterize_to_pixels`, with the same arguments and returns. The Triton
    one runs the tile kernels, float32, ``tile_size`` 4, 8, 16 or 32. ``n_isects`` is 0-d: the used length of
    ``flatten_ids`` when the rest is padding, as :func:`reference.isect_tiles_fixed` leaves it. None: all of it."""
    op = "rasterize_to_pixels"
    if resolve_backend(backend, means2d, op=op, auto_dtypes=(torch.float32,)) == "torch":
        return reference.rasterize_to_pixels(means2d, conics, colors, opacities, width, height, tile_size,
                                             isect_offsets, flatten_ids, backgrounds=backgrounds, alpha_cap=alpha_cap,
                                             n_isects=n_isects)
    check_float32(op, means2d)
    if tile_size not in TRITON_TILE_SIZES:
        raise ValueError(f"{op}: the Triton kernels take tile_size in {TRITON_TILE_SIZES}, got {tile_size}; "
                         "use backend='torch' for other tile sizes")
    end = isect_offsets.new_tensor([flatten_ids.numel()]) if n_isects is None else n_isects.reshape(1)
    tile_offsets = torch.cat([isect_offsets.flatten(), end.to(isect_offsets.dtype)]).to(torch.int32).contiguous()
    out, trans = _rasterize_fwd_op(
        means2d.contiguous(), conics.contiguous(), colors.contiguous(), opacities.contiguous(),
        tile_offsets, flatten_ids.to(torch.int32).contiguous(), width, height, tile_size, float(alpha_cap),
    )
    if backgrounds is not None:
        out = out + trans[..., None] * backgrounds[:, None, None, :]
    return out, (1.0 - trans)[..., None]


def check_float32(op: str, t: Tensor) -> None:
    """The Gaussian splatting kernels compute in float32."""
    if t.dtype != torch.float32:
        raise TypeError(f"{op}: the Triton kernels compute in float32, got {t.dtype}; "
                        "pass float32 tensors or use backend='torch'")


# ----------------------------------------------------------------------------- custom ops (Triton path)


@torch.library.custom_op("framegraph::gaussians_rasterize_fwd", mutates_args=())
def _rasterize_fwd_op(means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor, tile_offsets: Tensor,
                      flatten_ids: Tensor, width: int, height: int, tile_size: int, alpha_cap: float
                      ) -> tuple[Tensor, Tensor]:
    from . import triton as kernels

    return kernels.rasterize_fwd(means2d, conics, colors, opacities, tile_offsets, flatten_ids, width, height,
                                 tile_size, alpha_cap)


@_rasterize_fwd_op.register_fake
def _(means2d, conics, colors, opacities, tile_offsets, flatten_ids, width, height, tile_size, alpha_cap):
    C, D = means2d.shape[0], colors.shape[-1]
    return means2d.new_empty((C, height, width, D)), means2d.new_empty((C, height, width))


@torch.library.custom_op("framegraph::gaussians_rasterize_bwd", mutates_args=())
def _rasterize_bwd_op(saved: list[Tensor], grad_out: Tensor, grad_trans: Tensor, width: int, height: int,
                      tile_size: int, alpha_cap: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from . import triton as kernels

    return kernels.rasterize_bwd(saved, grad_out, grad_trans, width, height, tile_size, alpha_cap)


@_rasterize_bwd_op.register_fake
def _(saved, grad_out, grad_trans, width, height, tile_size, alpha_cap):
    return tuple(torch.empty_like(t) for t in saved[:4])


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:6], *output)
    ctx.launch = inputs[6:]


def _backward(ctx, grad_out, grad_trans):
    saved = list(ctx.saved_tensors)
    grad_out = torch.zeros_like(saved[6]) if grad_out is None else grad_out
    grad_trans = torch.zeros_like(saved[7]) if grad_trans is None else grad_trans
    grads = _rasterize_bwd_op(saved, grad_out, grad_trans, *ctx.launch)
    return (*grads, None, None, None, None, None, None)


_rasterize_fwd_op.register_autograd(_backward, setup_context=_setup_context)
