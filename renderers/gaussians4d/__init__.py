"""4D Gaussian splatting: dynamic scenes with the semantics of fudan-zvg's 4DGS, from ICLR 2024.

Each Gaussian lives in x, y, z, t. It has a 4D mean, 4 scales and a 4D rotation. The rotation is made of a left
and a right quaternion. To render time ``t``, every Gaussian is *sliced*. Conditioned on ``t``, it is a 3D
Gaussian. It moves along its space-time tilt, shrinks to the Schur complement and fades by its temporal
marginal. The 3DGS pipeline then projects and blends it.

Public API:

- :func:`rasterize_4d`: slice at ``t``, colour by SH x temporal cosines, project, blend. It runs the Triton slice
  and Triton blending on CUDA, the readable torch reference elsewhere.
- :class:`Gaussian4DScene`, :func:`random_scene_4d`: activated parameters in memory.
- :func:`load_checkpoint`, :func:`save_checkpoint`: fudan-zvg ``chkpnt*.pth`` files.
- :class:`Gaussian4DRenderStage`, in ``stage.py``: camera in, frame at ``t = pts`` out.
- :class:`Fitter4D`, in ``fit.py``: fits 4D Gaussians to multi-view video.
- ``python -m framegraph.renderers.gaussians4d.demo``: fits the shipped demo scene to its procedural ground
  truth.

Every fast op in framegraph has this layout. ``reference.py`` is the pure-torch twin of every step.
``triton.py`` holds the slice kernel. This file dispatches between them, in :func:`slice_gaussians`. It
registers the kernel as the torch custom op ``torch.ops.framegraph.gaussians4d_slice``.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from framegraph.kernels.backend import Backend, resolve_backend
from framegraph.renderers.gaussians import (
    RENDER_MODES,
    RenderMode,
    TileCapacity,
    blend_projected,
    check_float32,
    check_render_args,
    check_values,
    expect_shape,
    per_camera,
    view_dirs,
)
from framegraph.renderers.gaussians.reference import DEFAULT_ALPHA_CAP

from . import reference
from .io import CheckpointError, load_checkpoint, save_checkpoint
from .reference import CULL_THRESHOLD
from .scene import Gaussian4DScene, check_fits_4d, random_scene_4d

__all__ = [
    "rasterize_4d",
    "slice_gaussians",
    "RENDER_MODES",
    "CULL_THRESHOLD",
    "Gaussian4DScene",
    "random_scene_4d",
    "check_fits_4d",
    "load_checkpoint",
    "save_checkpoint",
    "CheckpointError",
    "Gaussian4DRenderStage",
    "scene_time",
]


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
    tiles: TileCapacity | None = None,
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Render 4D Gaussians at time ``t`` into ``C`` cameras, with fudan-zvg 4DGS semantics.

    The pipeline:

    - Slice every 4D Gaussian at ``t``. That gives a conditional 3D mean and covariance, and opacity x temporal
      marginal.
    - Drop those whose marginal is <= ``cull_threshold``.
    - Evaluate colours: spherical harmonics x a temporal cosine basis. The view direction runs from the camera
      centre to the Gaussian's spatial mean ``mu_xyz``, as in fudan-zvg's CUDA renderer.
    - Run the 3DGS pipeline of :func:`framegraph.renderers.gaussians.rasterize`. That is EWA projection with an
      ``eps2d`` blur, tiles sorted by depth, front-to-back blending.

    Args:
        means: ``[N, 3]`` spatial means; times: ``[N]`` temporal means.
        scales: ``[N, 4]`` **activated** standard deviations, along each Gaussian's x, y, z, t axes.
        quats_l, quats_r: ``[N, 4]`` left and right quaternions, order w, x, y, z, any non-zero norm.
            The 4D rotation is ``L(q_l) @ R(q_r)``.
        opacities: ``[N]`` **activated** opacities in [0, 1].
        colors: without ``sh_degree``, ``[N, D]`` or ``[C, N, D]`` features. With ``sh_degree``,
            ``[N, K, 3]`` coefficients, ``K >= (sh_degree_t + 1) * (sh_degree + 1) ** 2``. See
            :func:`reference.sh_colors_4d`. The colour is then ``max(value + 0.5, 0)``.
        t: render time in the scene's units, a Python float.
        viewmats: ``[C, 4, 4]`` world-to-camera, OpenCV axes. Ks: ``[C, 3, 3]`` intrinsics in pixels.
        width, height: image size.
        sh_degree: 0..3 to treat ``colors`` as SH coefficients. None for plain colours.
        sh_degree_t: degree of the temporal cosine basis. duration: its period,
            ``time_duration[1] - time_duration[0]``.
        near_plane, far_plane, eps2d, radius_clip, backgrounds, tile_size, render_mode, alpha_cap:
            as in :func:`framegraph.renderers.gaussians.rasterize`.
        cull_threshold: temporal marginal at or below which a Gaussian is skipped. 0.05, like fudan-zvg.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. Auto runs the Triton slice and Triton blending on CUDA
            float32, torch elsewhere.
        validate: check shapes, devices and finiteness. One host sync.
        tiles: None, or the :class:`~framegraph.renderers.gaussians.TileCapacity` of a stream of frames. With
            None, culling compacts the Gaussians and tile lists are sized by the data. That costs a few host
            syncs a frame. With a capacity, culled Gaussians keep their slot with opacity 0, so projection
            culls them. The tile lists have fixed capacities. There is no host sync after the first frame. The
            render stage passes one.

    Returns:
        ``colors [C, H, W, D]``, ``alphas [C, H, W, 1]`` and a meta dict. The meta holds:

        - the slice of all ``N`` Gaussians: ``means3d [N, 3]``, ``covars [N, 6]``, ``opacities_t [N]``,
          ``keep [N] bool``.
        - ``ids [M]``: the kept Gaussians, in order. With ``tiles`` it is None, and ``M = N``.
        - the 3DGS meta of those ``M``: ``radii [C, M, 2]``, ``means2d``, ``depths``, ``conics``,
          ``isect_ids``, ``flatten_ids``, ``isect_offsets``, and so on.
        - ``backend``.

    Differentiable w.r.t. means, times, scales, quats, opacities and colors on both backends.
    Without ``tiles``, culling compacts the Gaussians with one host sync, a ``nonzero``.
    """
    if validate:
        _validate(means, times, scales, quats_l, quats_r, opacities, colors, t, viewmats, Ks, width, height,
                  sh_degree, sh_degree_t, duration, backgrounds, tile_size, render_mode)
    chosen = resolve_backend(backend, means, op="rasterize_4d", auto_dtypes=(torch.float32,))
    C = viewmats.shape[0]

    means3d, covars6, opacities_t, keep = slice_gaussians(means, times, scales, quats_l, quats_r, opacities,
                                                          float(t), float(cull_threshold), backend=chosen)
    if tiles is None:  # compact: the kept Gaussians only (readable; nonzero reads their number back)
        ids = keep.nonzero()[:, 0]
        kept = _Selected(ids)
        k_opac = opacities_t.index_select(0, ids)
    else:  # mask: every Gaussian keeps its slot, the culled ones with opacity 0, which projection culls
        ids, kept = None, _Selected(None)
        k_opac = torch.where(keep, opacities_t, torch.zeros_like(opacities_t))
    M = k_opac.shape[0]
    k_means = kept(means3d)
    k_covars = reference.covar6_to_mat(kept(covars6))

    radii, means2d, depths, conics, _ = reference.project_covariances(
        k_means, k_covars, viewmats, Ks, width, height, opacities=k_opac, eps2d=eps2d,
        near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip,
    )
    opacities_c = k_opac[None, :].expand(C, M)

    if sh_degree is None:
        colors_c = per_camera(kept(colors, colors.dim() - 2), C, 3)
    else:
        dirs = view_dirs(kept(means), viewmats)  # to mu_xyz, like fudan-zvg
        dt = (kept(times) - t)[None, :].expand(C, M)
        coeffs = per_camera(kept(colors), C, 4)
        raw = reference.sh_colors_4d(sh_degree, sh_degree_t, dirs, dt, duration, coeffs)
        colors_c = torch.clamp_min(raw + 0.5, 0.0)

    render_colors, render_alphas, meta = blend_projected(
        means2d, radii, depths, conics, colors_c, opacities_c, width, height, backgrounds=backgrounds,
        tile_size=tile_size, render_mode=render_mode, alpha_cap=alpha_cap, backend=chosen, tiles=tiles)
    meta.update({"means3d": means3d, "covars": covars6, "opacities_t": opacities_t, "keep": keep, "ids": ids})
    return render_colors, render_alphas, meta


class _Selected:
    """``x.index_select(dim, ids)``, or ``x`` itself when ``ids`` is None and every Gaussian is kept."""

    def __init__(self, ids: Tensor | None):
        self.ids = ids

    def __call__(self, x: Tensor, dim: int = 0) -> Tensor:
        return x if self.ids is None else x.index_select(dim, self.ids)


def _validate(means, times, scales, quats_l, quats_r, opacities, colors, t, viewmats, Ks, width, height,
              sh_degree, sh_degree_t, duration, backgrounds, tile_size, render_mode) -> None:
    N, C = check_render_args(means, viewmats, Ks, width, height, tile_size, render_mode, sh_degree, colors,
                             backgrounds)
    if not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"t must be a finite Python number (the render time), got {t!r}")
    if not duration > 0:
        raise ValueError(f"duration must be > 0 (time_duration[1] - time_duration[0]), got {duration!r}")
    for name, x, shape in (("times", times, (N,)), ("scales", scales, (N, 4)), ("quats_l", quats_l, (N, 4)),
                           ("quats_r", quats_r, (N, 4)), ("opacities", opacities, (N,))):
        expect_shape(name, x, shape)
    if sh_degree is not None:
        if not isinstance(sh_degree_t, int) or sh_degree_t < 0:
            raise ValueError(f"sh_degree_t must be an int >= 0, got {sh_degree_t!r}")
        expect_shape("colors (SH coefficients)", colors, (N, None, 3))
        need = (sh_degree + 1) ** 2 * (sh_degree_t + 1)
        if colors.shape[1] < need:
            raise ValueError(f"sh_degree={sh_degree}, sh_degree_t={sh_degree_t} need {need} coefficients per "
                             f"channel, colors has {colors.shape[1]}")
    named = {"means": means, "times": times, "scales": scales, "quats_l": quats_l, "quats_r": quats_r,
             "opacities": opacities, "colors": colors, "viewmats": viewmats, "Ks": Ks}
    if backgrounds is not None:
        named["backgrounds"] = backgrounds
    zero_norm = "zero-norm quaternions; a rotation needs a non-zero quaternion"
    check_values(named, {
        "quats_l": (quats_l.detach().norm(dim=-1) == 0, zero_norm),
        "quats_r": (quats_r.detach().norm(dim=-1) == 0, zero_norm),
        "scales": (scales.detach() <= 0, "values <= 0; scales are activated standard deviations (exp of the "
                   "checkpoint's log-scales)"),
    })


def slice_gaussians(means: Tensor, times: Tensor, scales: Tensor, quats_l: Tensor, quats_r: Tensor,
                    opacities: Tensor, t: float, cull_threshold: float = CULL_THRESHOLD, *,
                    backend: Backend = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Condition 4D Gaussians on time ``t``. Differentiable on both backends.

    The torch backend runs :func:`reference.slice_gaussians`, with the same arguments and returns. The Triton
    one runs the Triton slice kernel, float32."""
    op = "slice_gaussians"
    if resolve_backend(backend, means, op=op, auto_dtypes=(torch.float32,)) == "torch":
        return reference.slice_gaussians(means, times, scales, quats_l, quats_r, opacities, t, cull_threshold)
    check_float32(op, means)
    return _slice_op(means, times, scales, quats_l, quats_r, opacities, float(t), float(cull_threshold))


# ----------------------------------------------------------------------------- custom op (Triton path)


@torch.library.custom_op("framegraph::gaussians4d_slice", mutates_args=())
def _slice_op(means: Tensor, times: Tensor, scales: Tensor, quats_l: Tensor, quats_r: Tensor, opacities: Tensor,
              t: float, cull_threshold: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from . import triton as kernels

    return kernels.slice_gaussians(means, times, scales, quats_l, quats_r, opacities, t, cull_threshold)


@_slice_op.register_fake
def _(means, times, scales, quats_l, quats_r, opacities, t, cull_threshold):
    N = means.shape[0]
    return (means.new_empty((N, 3)), means.new_empty((N, 6)), means.new_empty((N,)),
            torch.empty((N,), dtype=torch.bool, device=means.device))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:6])
    ctx.t, ctx.cull_threshold = inputs[6], inputs[7]


def _backward(ctx, g_means, g_covars, g_opac, _g_keep):
    """Replays :func:`reference.slice_gaussians` under autograd. That is cheap next to rendering."""
    inputs = [x.detach().requires_grad_(True) for x in ctx.saved_tensors]
    with torch.enable_grad():
        outs = reference.slice_gaussians(*inputs, ctx.t, ctx.cull_threshold)[:3]
        pairs = [(o, g) for o, g in zip(outs, (g_means, g_covars, g_opac)) if g is not None]
        grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return (*grads, None, None)


_slice_op.register_autograd(_backward, setup_context=_setup_context)

# The render stage renders through rasterize_4d above, so it is imported once that is defined.
from .stage import Gaussian4DRenderStage, scene_time  # noqa: E402
