"""The public 3DGS entry point: :func:`rasterize` (projection, SH, tiles, blending)."""
from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import Tensor

from framegraph.kernels.backend import Backend, resolve_backend

from . import reference
from .reference import DEFAULT_ALPHA_CAP

RenderMode = Literal["RGB", "D", "ED", "RGB+D", "RGB+ED"]
RasterizeMode = Literal["classic", "antialiased"]
RENDER_MODES: tuple[str, ...] = get_args(RenderMode)
RASTERIZE_MODES: tuple[str, ...] = get_args(RasterizeMode)


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
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Render 3D Gaussians into ``C`` cameras; same semantics as gsplat's ``rasterization()``.

    Pipeline: project each Gaussian into each camera (EWA splatting with an
    ``eps2d`` blur), evaluate colours (directly, or from spherical harmonics of
    the direction camera -> Gaussian), list Gaussian-tile overlaps sorted by
    depth, and alpha-blend each tile front to back.

    Args:
        means: ``[N, 3]`` Gaussian centres in world space.
        quats: ``[N, 4]`` rotations as quaternions **(w, x, y, z)**; normalised
            here, so any non-zero norm is fine.
        scales: ``[N, 3]`` **activated** scales (standard deviations along the
            Gaussian's axes; ``exp`` of what an INRIA PLY stores).
        opacities: ``[N]`` **activated** opacities in [0, 1] (``sigmoid`` of the PLY value).
        colors: without ``sh_degree``: ``[N, D]`` or ``[C, N, D]`` per-Gaussian
            features (any D, e.g. RGB). With ``sh_degree``: SH coefficients
            ``[N, K, 3]`` or ``[C, N, K, 3]``, ``K >= (sh_degree + 1) ** 2``;
            the colour is ``max(SH(dir) + 0.5, 0)`` with ``dir`` from the camera
            centre to the Gaussian (gsplat / INRIA convention).
        viewmats: ``[C, 4, 4]`` **world-to-camera** matrices, OpenCV convention
            (x right, y down, z forward; visible points have z > 0).
        Ks: ``[C, 3, 3]`` pinhole intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``
            in pixels; pixel ``(row i, col j)`` has its centre at ``(j + 0.5, i + 0.5)``.
        width, height: image size in pixels.
        sh_degree: 0..3 to treat ``colors`` as SH coefficients; None for plain colours.
        near_plane, far_plane: Gaussians with camera z outside ``[near, far]`` are culled.
        eps2d: added to the diagonal of each 2D covariance (a ~0.3 px blur).
        radius_clip: Gaussians whose pixel radii are both <= this are skipped.
        backgrounds: ``[C, D]`` (or ``[D]``) colour behind the Gaussians;
            None = black. In depth modes the depth channel's background is 0.
        tile_size: tile edge in pixels (16 like gsplat; the Triton backend
            takes 4, 8, 16 or 32).
        render_mode: ``"RGB"`` colours; ``"D"`` accumulated depth
            ``sum w_i z_i``; ``"ED"`` expected depth (``D / alpha``);
            ``"RGB+D"`` / ``"RGB+ED"`` colours with the depth as last channel.
        alpha_cap: maximum per-Gaussian alpha (0.999 like gsplat; 0.99 like INRIA).
        rasterize_mode: ``"classic"``, or ``"antialiased"`` (opacity scaled by
            ``sqrt(det(cov2d) / det(cov2d + eps2d I))`` as in Mip-Splatting / gsplat).
        backend: ``"auto"`` (Triton kernels on CUDA float32 tensors, the torch
            reference elsewhere), ``"triton"`` or ``"torch"``.
        validate: check shapes, devices and finiteness (one host sync). Turn off
            on a hot path once the inputs are known good.

    Returns:
        A tuple:

        - **colors** ``[C, H, W, D]`` (D = 3 for RGB, 1 for D/ED, 4 for RGB+D/ED).
        - **alphas** ``[C, H, W, 1]`` accumulated opacity ``1 - T``.
        - **meta** dict: ``radii [C, N, 2] int32``, ``means2d [C, N, 2]``,
          ``depths [C, N]``, ``conics [C, N, 3]``, ``opacities [C, N]``,
          ``tiles_per_gauss [C, N]``, ``isect_ids [M]``, ``flatten_ids [M]``,
          ``isect_offsets [C, tile_height, tile_width]``, ``tile_width``,
          ``tile_height``, ``tile_size``, ``width``, ``height``, ``n_cameras``,
          ``backend``.

    Differentiable w.r.t. means, quats, scales, opacities, colors and
    backgrounds on both backends.
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
        colors_c = colors if colors.dim() == 3 else colors[None].expand(C, -1, -1)
    else:
        campos = torch.linalg.inv(viewmats)[:, :3, 3]  # [C, 3] camera centres
        dirs = means[None, :, :] - campos[:, None, :]
        coeffs = colors if colors.dim() == 4 else colors[None].expand(C, -1, -1, -1)
        colors_c = torch.clamp_min(reference.spherical_harmonics(sh_degree, dirs, coeffs) + 0.5, 0.0)

    render_colors, render_alphas, meta = blend_projected(
        means2d, radii, depths, conics, colors_c, opacities_c, width, height, backgrounds=backgrounds,
        tile_size=tile_size, render_mode=render_mode, alpha_cap=alpha_cap, backend=chosen)
    return render_colors, render_alphas, meta


def expect_shape(name: str, t: Any, shape: tuple[Any, ...]) -> None:
    """Raise if ``t`` is not a tensor of ``shape`` (ints fixed, None free)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")


def _validate(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree,
              backgrounds, tile_size, render_mode, rasterize_mode) -> None:
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode must be one of {RENDER_MODES}, got {render_mode!r}")
    if rasterize_mode not in RASTERIZE_MODES:
        raise ValueError(f"rasterize_mode must be one of {RASTERIZE_MODES}, got {rasterize_mode!r}")
    for name, v in (("width", width), ("height", height), ("tile_size", tile_size)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    expect_shape("means", means, (None, 3))
    N = means.shape[0]
    expect_shape("quats", quats, (N, 4))
    expect_shape("scales", scales, (N, 3))
    expect_shape("opacities", opacities, (N,))
    expect_shape("viewmats", viewmats, (None, 4, 4))
    C = viewmats.shape[0]
    expect_shape("Ks", Ks, (C, 3, 3))
    if sh_degree is None:
        if colors.dim() == 2:
            expect_shape("colors", colors, (N, None))
        else:
            expect_shape("colors", colors, (C, N, None))
    else:
        if not isinstance(sh_degree, int) or not 0 <= sh_degree <= 3:
            raise ValueError(f"sh_degree must be an int in 0..3 or None, got {sh_degree!r}")
        if colors.dim() == 3:
            expect_shape("colors (SH coefficients)", colors, (N, None, 3))
        else:
            expect_shape("colors (SH coefficients)", colors, (C, N, None, 3))
        if colors.shape[-2] < (sh_degree + 1) ** 2:
            raise ValueError(
                f"sh_degree={sh_degree} needs {(sh_degree + 1) ** 2} SH coefficients per channel, "
                f"colors has {colors.shape[-2]}"
            )
    if backgrounds is not None:
        D = 3 if sh_degree is not None else colors.shape[-1]
        if backgrounds.dim() == 1:
            expect_shape("backgrounds", backgrounds, (D,))
        else:
            expect_shape("backgrounds", backgrounds, (C, D))

    named = {"means": means, "quats": quats, "scales": scales, "opacities": opacities,
             "colors": colors, "viewmats": viewmats, "Ks": Ks}
    if backgrounds is not None:
        named["backgrounds"] = backgrounds
    for name, t in named.items():
        if t.device != means.device:
            raise ValueError(f"{name} is on {t.device} but means is on {means.device}; put all inputs on one device")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating point tensor, got {t.dtype}")

    # One host sync for all value checks.
    checks = [torch.isfinite(t).all() for t in named.values()]
    checks.append((quats.detach().norm(dim=-1) > 0).all() if N else torch.ones((), dtype=torch.bool))
    flags = torch.stack(checks).tolist()
    for name, finite in zip(named, flags):
        if not finite:
            bad = int((~torch.isfinite(named[name])).sum())
            raise ValueError(f"{name} contains {bad} NaN or Inf values")
    if not flags[-1]:
        bad = int((quats.detach().norm(dim=-1) == 0).sum())
        raise ValueError(f"quats has {bad} zero-norm quaternions; a rotation needs a non-zero quaternion")


def blend_projected(means2d: Tensor, radii: Tensor, depths: Tensor, conics: Tensor, colors_c: Tensor,
                    opacities_c: Tensor, width: int, height: int, *, backgrounds: Tensor | None,
                    tile_size: int, render_mode: RenderMode, alpha_cap: float, backend: Literal["triton", "torch"]
                    ) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """The steps after projection, shared by 3DGS and 4DGS: depth channels for the render mode, tile
    intersection and sort, front-to-back blending (``backend`` "triton" or "torch"), expected depth.

    Args: projected Gaussians per camera — ``means2d [C, N, 2]``, ``radii [C, N, 2]``, ``depths [C, N]``,
    ``conics [C, N, 3]``, ``colors_c [C, N, D]``, ``opacities_c [C, N]``; ``backgrounds [C, D]`` or
    ``[D]`` or None. Returns ``(colors [C, H, W, D'], alphas [C, H, W, 1], meta)``.
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
    tiles_per_gauss, isect_ids, flatten_ids = reference.isect_tiles(
        means2d, radii, depths, tile_size, tile_width, tile_height
    )
    offsets = reference.isect_offsets(isect_ids, C, tile_width, tile_height)

    if backend == "triton":
        from . import triton as triton_backend

        to_pixels = triton_backend.rasterize_to_pixels
    else:
        to_pixels = reference.rasterize_to_pixels
    render_colors, render_alphas = to_pixels(
        means2d, conics, colors_c, opacities_c, width, height, tile_size, offsets, flatten_ids,
        backgrounds=backgrounds, alpha_cap=alpha_cap,
    )
    if render_mode in ("ED", "RGB+ED"):
        expected = render_colors[..., -1:] / render_alphas.clamp(min=1e-10)
        render_colors = torch.cat([render_colors[..., :-1], expected], dim=-1)

    meta = {
        "radii": radii, "means2d": means2d, "depths": depths, "conics": conics,
        "opacities": opacities_c, "tiles_per_gauss": tiles_per_gauss, "isect_ids": isect_ids,
        "flatten_ids": flatten_ids, "isect_offsets": offsets, "tile_width": tile_width,
        "tile_height": tile_height, "tile_size": tile_size, "width": width, "height": height,
        "n_cameras": C, "backend": backend,
    }
    return render_colors, render_alphas, meta
