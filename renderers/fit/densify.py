"""Adaptive density control of the 3DGS recipe, after Kerbl et al. 2023 and gsplat's ``DefaultStrategy``.

Between ``refine_start`` and ``refine_stop``, every ``refine_every`` steps:

- **grow**: a Gaussian grows when its average 2D mean-gradient norm exceeds ``grow_grad2d``. The norm is in NDC
  units: pixels scaled by ``width / 2``, ``height / 2``. Small ones are *cloned*: their largest scale is at most
  ``grow_scale3d x scene_scale``. Large ones are *split* in two. The children are sampled from the parent's
  Gaussian, with scales / 1.6.
- **prune**: Gaussians with opacity < ``prune_opacity`` are removed. After the first opacity reset, so are
  those larger than ``prune_scale3d x scene_scale``.

Every ``reset_every`` steps, opacities are clamped to ``2 x prune_opacity``. So floaters fade out and get pruned.

Every operation keeps the optimizers consistent. New Gaussians start with zero Adam moments. Kept ones keep theirs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..gaussians.reference import quat_to_rotmat
from .params import Params

Optimizers = dict[str, torch.optim.Optimizer]


@dataclass
class DensifyConfig:
    """When and how the Gaussian set is grown and pruned. Steps are optimisation steps."""

    refine_start: int = 500
    refine_stop: int = 15_000
    refine_every: int = 100
    reset_every: int = 3_000
    grow_grad2d: float = 0.0002
    grow_scale3d: float = 0.01
    prune_scale3d: float = 0.1
    prune_opacity: float = 0.005
    max_gaussians: int | None = None  # growth stops at this many (None: unlimited)


class DensifyState:
    """Running per-Gaussian statistics between refinements.

    Attributes:
        grad2d: ``[N]`` sum of 2D mean-gradient norms, in NDC units, over the views that saw the Gaussian.
        count: ``[N]`` number of such views.
    """

    def __init__(self, n: int, device=None):
        self.grad2d = torch.zeros(n, device=device)
        self.count = torch.zeros(n, device=device)

    @torch.no_grad()
    def update(self, means2d_grad: Tensor, radii: Tensor, width: int, height: int) -> None:
        """Accumulate from one rendered batch: ``means2d_grad [C, N, 2]`` in pixels, ``radii [C, N, 2]``."""
        C = means2d_grad.shape[0]
        g = means2d_grad.clone()
        g[..., 0] *= width / 2.0 * C
        g[..., 1] *= height / 2.0 * C
        seen = (radii > 0).all(dim=-1)  # [C, N]
        self.grad2d += (g.norm(dim=-1) * seen).sum(dim=0)
        self.count += seen.sum(dim=0).to(self.count.dtype)

    def reset(self) -> None:
        self.grad2d.zero_()
        self.count.zero_()

    def select(self, keep: Tensor) -> None:
        """Keep rows ``keep``, an index tensor, in that order."""
        self.grad2d, self.count = self.grad2d[keep], self.count[keep]

    def append(self, n: int) -> None:
        """Add ``n`` fresh rows of zeros at the end."""
        self.grad2d = torch.cat([self.grad2d, self.grad2d.new_zeros(n)])
        self.count = torch.cat([self.count, self.count.new_zeros(n)])


# ----------------------------------------------------------------------------
# Parameter surgery that keeps Adam's moments aligned with the Gaussians
# ----------------------------------------------------------------------------
@torch.no_grad()
def _replace(params: Params, optimizers: Optimizers, make: Callable[[str, Tensor], Tensor],
             make_moment: Callable[[Tensor], Tensor]) -> None:
    """Swap every parameter for ``make(name, old)`` and each Adam moment for ``make_moment(old)``."""
    for name in list(params):
        old = params[name]
        new = make(name, old.detach()).contiguous().requires_grad_(True)
        params[name] = new
        opt = optimizers.get(name)
        if opt is None:
            continue
        state = opt.state.pop(old, None)
        if state is not None:
            opt.state[new] = {k: (v if k == "step" else make_moment(v)) for k, v in state.items()}
        opt.param_groups[0]["params"] = [new]


@torch.no_grad()
def keep_rows(params: Params, optimizers: Optimizers, state: DensifyState, keep: Tensor) -> None:
    """Keep only the Gaussians at indices ``keep``. The rest are pruned."""
    _replace(params, optimizers, lambda _n, p: p[keep], lambda v: v[keep])
    state.select(keep)


@torch.no_grad()
def append_rows(params: Params, optimizers: Optimizers, state: DensifyState, new: Params) -> None:
    """Append new Gaussians, ``new[name]`` rows, with zero optimizer moments."""
    n = new["means"].shape[0]
    _replace(params, optimizers, lambda name, p: torch.cat([p, new[name].to(p)]),
             lambda v: torch.cat([v, v.new_zeros((n,) + v.shape[1:])]))
    state.append(n)


@torch.no_grad()
def clone(params: Params, optimizers: Optimizers, state: DensifyState, mask: Tensor) -> int:
    """Duplicate the Gaussians where ``mask [N]`` is set. The copies sit on the originals."""
    sel = torch.where(mask)[0]
    append_rows(params, optimizers, state, {k: v[sel] for k, v in params.items()})
    return int(sel.numel())


@torch.no_grad()
def split(params: Params, optimizers: Optimizers, state: DensifyState, mask: Tensor,
          generator: torch.Generator | None = None) -> int:
    """Replace each Gaussian where ``mask [N]`` is set by two, sampled from it, with scales / 1.6."""
    sel = torch.where(mask)[0]
    n = int(sel.numel())
    if n == 0:
        return 0
    scales = torch.exp(params["scales"][sel])  # [n, 3]
    R = quat_to_rotmat(F.normalize(params["quats"][sel], dim=-1))  # [n, 3, 3]
    noise = torch.randn(2, n, 3, generator=generator).to(scales)
    offsets = torch.einsum("nij,nj,bnj->bni", R, scales, noise)  # [2, n, 3]
    children = {k: torch.cat([v[sel], v[sel]]) for k, v in params.items()}
    children["means"] = (params["means"][sel][None] + offsets).reshape(2 * n, 3)
    children["scales"] = torch.log(scales / 1.6).repeat(2, 1)
    keep = torch.where(~mask)[0]
    keep_rows(params, optimizers, state, keep)
    append_rows(params, optimizers, state, children)
    return n


@torch.no_grad()
def reset_opacity(params: Params, optimizers: Optimizers, value: float) -> None:
    """Clamp opacities to at most ``value``, post-sigmoid, and zero their Adam moments."""
    cap = float(torch.logit(torch.tensor(value)))
    opt = optimizers.get("opacities")
    old = params["opacities"]
    new = old.detach().clamp(max=cap).contiguous().requires_grad_(True)
    params["opacities"] = new
    if opt is not None:
        st = opt.state.pop(old, None)
        if st is not None:
            opt.state[new] = {k: (v if k == "step" else torch.zeros_like(v)) for k, v in st.items()}
        opt.param_groups[0]["params"] = [new]


@torch.no_grad()
def largest_scale(params: Params) -> Tensor:
    """``[N]`` each Gaussian's largest standard deviation, in world units."""
    return torch.exp(params["scales"]).max(dim=-1).values


@torch.no_grad()
def refine(params: Params, optimizers: Optimizers, state: DensifyState, cfg: DensifyConfig, step: int,
           scene_scale: float, generator: torch.Generator | None = None, *,
           size: Callable[[Params], Tensor] = largest_scale, split_fn: Callable[..., int] = split) -> dict[str, int]:
    """One densification round: grow, then prune. Returns the counts of each operation.

    ``size`` gives the ``[N]`` spatial extent compared with ``scene_scale``. ``split_fn`` splits, as :func:`split`
    does. Other kinds of Gaussians, such as 4D ones, pass their own."""
    grads = state.grad2d / state.count.clamp(min=1)
    high = grads > cfg.grow_grad2d
    small = size(params) <= cfg.grow_scale3d * scene_scale
    to_clone, to_split = high & small, high & ~small
    n = params["means"].shape[0]
    if cfg.max_gaussians is not None:  # grow only as far as the cap allows (most urgent first)
        room = max(0, cfg.max_gaussians - n)
        wanted = to_clone | to_split
        if int(wanted.sum()) > room:
            order = torch.argsort(torch.where(wanted, grads, torch.full_like(grads, -1.0)), descending=True)
            allowed = torch.zeros_like(wanted)
            allowed[order[:room]] = True
            to_clone, to_split = to_clone & allowed, to_split & allowed
    n_clone = clone(params, optimizers, state, to_clone)
    to_split = torch.cat([to_split, to_split.new_zeros(n_clone)])  # the fresh copies are not split
    n_split = split_fn(params, optimizers, state, to_split, generator)

    prune = torch.sigmoid(params["opacities"]) < cfg.prune_opacity
    if step > cfg.reset_every:
        prune |= size(params) > cfg.prune_scale3d * scene_scale
    n_prune = int(prune.sum())
    if n_prune:
        keep_rows(params, optimizers, state, torch.where(~prune)[0])
    state.reset()
    return {"cloned": n_clone, "split": n_split, "pruned": n_prune}


__all__ = ["DensifyConfig", "DensifyState", "refine", "clone", "split", "keep_rows", "append_rows",
           "reset_opacity", "largest_scale"]
