"""Trainable 3DGS parameters: initialisation, activation, and conversion to and from :class:`GaussianScene`.

Parameters are held **pre-activation**, one leaf tensor per kind, as gsplat's ``simple_trainer`` does. So each
gets its own optimizer and learning rate. By name, with shape and activation:

- ``means`` ``[N, 3]``: none, in world units.
- ``scales`` ``[N, 3]``: ``exp`` gives standard deviations.
- ``quats`` ``[N, 4]``: normalised, order w, x, y, z.
- ``opacities`` ``[N]``: ``sigmoid``.
- ``sh0`` ``[N, 1, 3]``: the SH degree-0 coefficient, ``f_dc``.
- ``shN`` ``[N, K-1, 3]``: the higher SH coefficients, ``f_rest``. K = (d+1)^2.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..gaussians import GaussianScene
from ..gaussians.reference import SH_C0

PARAM_NAMES = ("means", "scales", "quats", "opacities", "sh0", "shN")
Params = dict[str, Tensor]


def rgb_to_sh0(rgb: Tensor) -> Tensor:
    """Degree-0 SH coefficient ``[..., 3]`` that renders as ``rgb``: ``0.5 + SH_C0 * c = rgb``."""
    return (rgb - 0.5) / SH_C0


def knn_mean_distance(points: Tensor, k: int = 3, chunk: int = 2048) -> Tensor:
    """Mean distance ``[N]`` from each point ``[N, 3]`` to its ``k`` nearest other points. Brute force."""
    n = points.shape[0]
    if n <= 1:
        return torch.ones(n, dtype=points.dtype, device=points.device)
    k = min(k, n - 1)
    out = []
    for i in range(0, n, chunk):
        d = torch.cdist(points[i:i + chunk], points)  # [B, N]
        nearest = d.topk(k + 1, dim=1, largest=False).values[:, 1:]  # drop the point itself
        out.append(nearest.mean(dim=1))
    return torch.cat(out)


def init_params(points: Tensor, colors: Tensor | None = None, *, sh_degree: int = 3,
                init_opacity: float = 0.1, init_scale: float = 1.0,
                generator: torch.Generator | None = None) -> Params:
    """Gaussians at ``points [N, 3]`` with base colours ``colors [N, 3]`` in [0, 1]. None gives random colours.

    As gsplat's trainer does: scales are isotropic, ``init_scale`` x the mean distance to the 3 nearest
    neighbours. Quaternions are random. Opacity is ``init_opacity``. Higher SH coefficients are zero. Returns
    float32 leaf tensors with ``requires_grad``. They are on the CPU unless ``points`` is elsewhere.
    """
    points = points.float()
    n, device = points.shape[0], points.device
    if colors is None:
        colors = torch.rand(n, 3, generator=generator).to(device)
    dist = knn_mean_distance(points).clamp(min=1e-7)
    K = (sh_degree + 1) ** 2
    params = {
        "means": points.clone(),
        "scales": torch.log(dist * init_scale)[:, None].repeat(1, 3),
        "quats": torch.rand(n, 4, generator=generator).to(device),
        "opacities": torch.logit(torch.full((n,), init_opacity, device=device)),
        "sh0": rgb_to_sh0(colors.float())[:, None, :],
        "shN": torch.zeros(n, K - 1, 3, device=device),
    }
    return {k: v.contiguous().requires_grad_(True) for k, v in params.items()}


def random_points(lo: Tensor, hi: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
    """``n`` points ``[n, 3]`` uniform in the box ``lo [3] .. hi [3]``."""
    return lo + (hi - lo) * torch.rand(n, 3, generator=generator, dtype=torch.float32)


def activated(params: Params) -> dict[str, Tensor]:
    """Keyword arguments for :func:`rasterize` from ``params``: means, quats, scales, opacities, colors."""
    return {
        "means": params["means"],
        "quats": params["quats"],
        "scales": torch.exp(params["scales"]),
        "opacities": torch.sigmoid(params["opacities"]),
        "colors": torch.cat([params["sh0"], params["shN"]], dim=1),
    }


@torch.no_grad()
def params_to_scene(params: Params, sh_degree: int | None = None) -> GaussianScene:
    """A detached CPU :class:`GaussianScene`. It keeps SH up to ``sh_degree``, default all."""
    a = activated(params)
    sh = a["colors"]
    if sh_degree is not None:
        sh = sh[:, : (sh_degree + 1) ** 2]
    quats = torch.nn.functional.normalize(a["quats"], dim=-1)
    return GaussianScene(means=a["means"].detach().cpu().clone(), quats=quats.cpu(),
                         scales=a["scales"].cpu(), opacities=a["opacities"].cpu(), sh=sh.detach().cpu().clone())


def scene_to_params(scene: GaussianScene, sh_degree: int | None = None, device=None) -> Params:
    """Trainable parameters from an activated scene. SH is padded with zeros up to ``sh_degree``."""
    device = device or scene.device
    degree = scene.sh_degree if sh_degree is None else sh_degree
    K = (degree + 1) ** 2
    sh = torch.zeros(scene.n, K, 3)
    keep = min(K, scene.sh.shape[1])
    sh[:, :keep] = scene.sh[:, :keep].float().cpu()
    params = {
        "means": scene.means.float().cpu().clone(),
        "scales": torch.log(scene.scales.float().cpu().clamp(min=1e-30)),
        "quats": scene.quats.float().cpu().clone(),
        "opacities": torch.logit(scene.opacities.float().cpu().clamp(1e-7, 1 - 1e-7)),
        "sh0": sh[:, :1].clone(),
        "shN": sh[:, 1:].clone(),
    }
    return {k: v.to(device).contiguous().requires_grad_(True) for k, v in params.items()}


__all__ = ["PARAM_NAMES", "Params", "init_params", "random_points", "activated", "params_to_scene",
           "scene_to_params", "rgb_to_sh0", "knn_mean_distance"]
