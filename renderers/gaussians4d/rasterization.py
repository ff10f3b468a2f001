"""The public 4DGS entry point: :func:`rasterize_4d` (slice at t, colour, project, tiles, blend)."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from framegraph.kernels.backend import Backend, resolve_backend
from framegraph.renderers.gaussians.rasterization import RENDER_MODES, RenderMode, blend_projected, expect_shape
from framegraph.renderers.gaussians.reference import DEFAULT_ALPHA_CAP

from . import reference
from .reference import CULL_THRESHOLD


def rasterize_4d(
    means: Tensor,
    times: Tensor,
    scales: Tensor,
    quats_l: Tensor,
    quats_r: Tensor,
    opacities: Tensor,
    colors: Tensor,
    t: float,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    sh_degree: int | None = None,
    sh_degree_t: int = 0,
    duration: float = 1.0,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    radius_clip: float = 0.0,
    backgrounds: Tensor | None = None,
    tile_size: int = 16,
    render_mode: RenderMode = "RGB",
    alpha_cap: float = DEFAULT_ALPHA_CAP,
    cull_threshold: float = CULL_THRESHOLD,
    backend: Backend = "auto",
    validate: bool = True,
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Render 4D Gaussians at time ``t`` into ``C`` cameras (fudan-zvg 4DGS semantics).

    Pipeline: slice every 4D Gaussian at ``t`` (conditional 3D mean and covariance, opacity x
    temporal marginal), drop those whose marginal is <= ``cull_threshold``, evaluate colours
    (spherical harmonics x temporal cosine basis, view direction from the camera centre to the
    Gaussian's spatial mean ``mu_xyz`` as in fudan-zvg's CUDA renderer), then the 3DGS pipeline of
    :func:`framegraph.renderers.gaussians.rasterize`: EWA projection with an ``eps2d`` blur, tiles
    sorted by depth, front-to-back blending.

    Args:
        means: ``[N, 3]`` spatial means; times: ``[N]`` temporal means.
        scales: ``[N, 4]`` **activated** standard deviations (x, y, z, t axes of each Gaussian).
        quats_l, quats_r: ``[N, 4]`` left / right quaternions (w, x, y, z), any non-zero norm;
            the 4D rotation is ``L(q_l) @ R(q_r)``.
        opacities: ``[N]`` **activated** opacities in [0, 1].
        colors: without ``sh_degree``: ``[N, D]`` or ``[C, N, D]`` features. With ``sh_degree``:
            ``[N, K, 3]`` coefficients, ``K >= (sh_degree_t + 1) * (sh_degree + 1) ** 2`` (see
            :func:`reference.sh_colors_4d`); the colour is ``max(value + 0.5, 0)``.
        t: render time, in the scene's units (a Python float).
        viewmats: ``[C, 4, 4]`` world-to-camera (OpenCV); Ks: ``[C, 3, 3]`` intrinsics in pixels.
        width, height: image size.
        sh_degree: 0..3 to treat ``colors`` as SH coefficients; None for plain colours.
        sh_degree_t: degree of the temporal cosine basis; duration: its period
            (``time_duration[1] - time_duration[0]``).
        near_plane, far_plane, eps2d, radius_clip, backgrounds, tile_size, render_mode, alpha_cap:
            as in :func:`framegraph.renderers.gaussians.rasterize`.
        cull_threshold: temporal marginal at or below which a Gaussian is skipped (0.05 like fudan-zvg).
        backend: ``"auto"`` (Triton slice + Triton blending on CUDA float32, torch elsewhere),
            ``"triton"`` or ``"torch"``.
        validate: check shapes, devices and finiteness (one host sync).

    Returns:
        ``colors [C, H, W, D]``, ``alphas [C, H, W, 1]`` and a meta dict: the slice of all ``N``
        Gaussians (``means3d [N, 3]``, ``covars [N, 6]``, ``opacities_t [N]``, ``keep [N] bool``),
        ``ids [M]`` (the kept Gaussians, in order), and the 3DGS meta of those ``M``
        (``radii [C, M, 2]``, ``means2d``, ``depths``, ``conics``, ``isect_ids``, ``flatten_ids``,
        ``isect_offsets``, ...), plus ``backend``.

    Differentiable w.r.t. means, times, scales, quats, opacities and colors on both backends.
    Culling compacts the Gaussians with one host sync (``nonzero``).
    """
    if validate:
        _validate(means, times, scales, quats_l, quats_r, opacities, colors, t, viewmats, Ks, width, height,
                  sh_degree, sh_degree_t, duration, backgrounds, tile_size, render_mode)
    chosen = resolve_backend(backend, means, op="rasterize_4d", auto_dtypes=(torch.float32,))
    C = viewmats.shape[0]

    if chosen == "triton":
        from . import triton as triton_backend

        slice_fn = triton_backend.slice_gaussians
    else:
        slice_fn = reference.slice_gaussians
    means3d, covars6, opacities_t, keep = slice_fn(means, times, scales, quats_l, quats_r, opacities,
                                                   float(t), float(cull_threshold))
    ids = keep.nonzero()[:, 0]
    M = ids.numel()
    k_means = means3d.index_select(0, ids)
    k_covars = reference.covar6_to_mat(covars6.index_select(0, ids))
    k_opac = opacities_t.index_select(0, ids)

    radii, means2d, depths, conics, _ = reference.project_covariances(
        k_means, k_covars, viewmats, Ks, width, height, opacities=k_opac, eps2d=eps2d,
        near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip,
    )
    opacities_c = k_opac[None, :].expand(C, M)

    if sh_degree is None:
        k_colors = colors.index_select(colors.dim() - 2, ids)
        colors_c = k_colors if k_colors.dim() == 3 else k_colors[None].expand(C, -1, -1)
    else:
        campos = torch.linalg.inv(viewmats)[:, :3, 3]  # [C, 3] camera centres
        dirs = means.index_select(0, ids)[None, :, :] - campos[:, None, :]  # to mu_xyz, like fudan-zvg
        dt = (times.index_select(0, ids) - t)[None, :].expand(C, M)
        coeffs = colors.index_select(0, ids)[None].expand(C, -1, -1, -1)
        raw = reference.sh_colors_4d(sh_degree, sh_degree_t, dirs, dt, duration, coeffs)
        colors_c = torch.clamp_min(raw + 0.5, 0.0)

    render_colors, render_alphas, meta = blend_projected(
        means2d, radii, depths, conics, colors_c, opacities_c, width, height, backgrounds=backgrounds,
        tile_size=tile_size, render_mode=render_mode, alpha_cap=alpha_cap, backend=chosen)
    meta.update({"means3d": means3d, "covars": covars6, "opacities_t": opacities_t, "keep": keep, "ids": ids})
    return render_colors, render_alphas, meta


def _validate(means, times, scales, quats_l, quats_r, opacities, colors, t, viewmats, Ks, width, height,
              sh_degree, sh_degree_t, duration, backgrounds, tile_size, render_mode) -> None:
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode must be one of {RENDER_MODES}, got {render_mode!r}")
    for name, v in (("width", width), ("height", height), ("tile_size", tile_size)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not isinstance(t, (int, float)) or not torch.isfinite(torch.tensor(float(t))):
        raise ValueError(f"t must be a finite Python number (the render time), got {t!r}")
    if not duration > 0:
        raise ValueError(f"duration must be > 0 (time_duration[1] - time_duration[0]), got {duration!r}")
    expect_shape("means", means, (None, 3))
    N = means.shape[0]
    for name, x, shape in (("times", times, (N,)), ("scales", scales, (N, 4)), ("quats_l", quats_l, (N, 4)),
                           ("quats_r", quats_r, (N, 4)), ("opacities", opacities, (N,)),
                           ("viewmats", viewmats, (None, 4, 4))):
        expect_shape(name, x, shape)
    C = viewmats.shape[0]
    expect_shape("Ks", Ks, (C, 3, 3))
    if sh_degree is None:
        expect_shape("colors", colors, (N, None) if colors.dim() == 2 else (C, N, None))
    else:
        if not isinstance(sh_degree, int) or not 0 <= sh_degree <= 3:
            raise ValueError(f"sh_degree must be an int in 0..3 or None, got {sh_degree!r}")
        if not isinstance(sh_degree_t, int) or sh_degree_t < 0:
            raise ValueError(f"sh_degree_t must be an int >= 0, got {sh_degree_t!r}")
        expect_shape("colors (SH coefficients)", colors, (N, None, 3))
        need = (sh_degree + 1) ** 2 * (sh_degree_t + 1)
        if colors.shape[1] < need:
            raise ValueError(f"sh_degree={sh_degree}, sh_degree_t={sh_degree_t} need {need} coefficients per "
                             f"channel, colors has {colors.shape[1]}")
    if backgrounds is not None:
        D = 3 if sh_degree is not None else colors.shape[-1]
        expect_shape("backgrounds", backgrounds, (D,) if backgrounds.dim() == 1 else (C, D))

    named = {"means": means, "times": times, "scales": scales, "quats_l": quats_l, "quats_r": quats_r,
             "opacities": opacities, "colors": colors, "viewmats": viewmats, "Ks": Ks}
    if backgrounds is not None:
        named["backgrounds"] = backgrounds
    for name, x in named.items():
        if x.device != means.device:
            raise ValueError(f"{name} is on {x.device} but means is on {means.device}; put all inputs on one device")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating point tensor, got {x.dtype}")
    checks = [torch.isfinite(x).all() for x in named.values()]
    for q in (quats_l, quats_r):
        checks.append((q.detach().norm(dim=-1) > 0).all() if N else torch.ones((), dtype=torch.bool))
    checks.append((scales.detach() > 0).all() if N else torch.ones((), dtype=torch.bool))
    flags = torch.stack(checks).tolist()
    for name, ok in zip(named, flags):
        if not ok:
            bad = int((~torch.isfinite(named[name])).sum())
            raise ValueError(f"{name} contains {bad} NaN or Inf values")
    for name, q, ok in (("quats_l", quats_l, flags[-3]), ("quats_r", quats_r, flags[-2])):
        if not ok:
            bad = int((q.detach().norm(dim=-1) == 0).sum())
            raise ValueError(f"{name} has {bad} zero-norm quaternions; a rotation needs a non-zero quaternion")
    if not flags[-1]:
        bad = int((scales.detach() <= 0).sum())
        raise ValueError(f"scales has {bad} values <= 0; scales are activated standard deviations (exp of the "
                         "checkpoint's log-scales)")
