"""The fitting loop: Gaussians optimised against posed images. It is the 3DGS recipe, as gsplat's trainer has it.

- One view per step, rendered with :func:`rasterize`, ``backend="auto"``. That is the torch reference's autograd
  on CPU and the Triton backward on CUDA.
- The loss is ``0.8 L1 + 0.2 (1 - SSIM)``.
- One Adam per parameter kind, with its own learning rate. The means' rate decays exponentially to 1 % over the
  run.
- The SH degree rises by one every ``sh_interval`` steps.
- Densification works from the accumulated 2D mean gradients; see ``densify.py``.

It is deterministic for a seed. The view order and every random draw derive from ``(seed, epoch)`` or
``(seed, step)``. So a resumed fit continues exactly as an uninterrupted one.

Checkpoint ``PREFIX`` is three files. ``PREFIX.ply`` is the scene, as INRIA PLY. ``PREFIX.fit.json`` holds step,
config and history. ``PREFIX.fit.safetensors`` holds raw parameters, Adam moments and densification statistics.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from framegraph.stream.quality import psnr

from ..cameras import camera_centers
from ..gaussians import GaussianScene, rasterize, save_ply
from ..posed_images import focus_bounds
from .data import PosedImages
from .densify import DensifyConfig, DensifyState, refine, reset_opacity
from .loop import (
    CheckpointError,
    TrainingRun,
    adam_tensors,
    load_adam_tensors,
    read_checkpoint,
    write_checkpoint,
)
from .losses import fit_loss, ssim
from .params import PARAM_NAMES, Params, activated, init_params, params_to_scene, random_points

CHECKPOINT_FORMAT = "framegraph-fit"
CHECKPOINT_VERSION = 1


@dataclass
class FitConfig:
    """Everything that decides a fit. It is saved in the checkpoint JSON.

    Learning rates are gsplat's defaults, tuned for 30 000 steps on megapixel images. Three are raised for
    CPU-sized fits of a few thousand steps: ``lr_means``, 1.6e-4 there; ``lr_scales``, 5e-3 there; ``lr_sh0``,
    2.5e-3 there. ``lr_means`` is multiplied by the scene scale. It decays to ``lr_means_final`` of itself by the
    last step. ``sh_interval`` and densification steps of None scale with ``steps``; see :meth:`resolved`.
    """

    steps: int = 3000
    seed: int = 0
    sh_degree: int = 3
    sh_interval: int | None = None
    init_points: int = 2000
    init_opacity: float = 0.1
    init_scale: float = 1.0
    ssim_weight: float = 0.2
    lr_means: float = 4e-4
    lr_means_final: float = 0.01
    lr_scales: float = 1e-2
    lr_quats: float = 1e-3
    lr_opacities: float = 5e-2
    lr_sh0: float = 1e-2
    lr_shN: float = 2.5e-3 / 20
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    densify: DensifyConfig = field(default_factory=DensifyConfig)
    densify_auto: bool = True  # scale refine_start / stop / every and reset_every with steps

    def resolved(self) -> FitConfig:  # (of the same class: subclasses add their own fields)
        """A copy with step-dependent defaults filled in for a run of :attr:`steps`.

        gsplat's schedule is for 30 000 steps. Shorter runs scale it. The SH degree goes up every steps/30.
        Densification runs from 5 % to 50 % of the run, every 1 %, at least every 50 steps. Opacity resets
        every 20 %.
        """
        cfg = type(self)(**{f.name: getattr(self, f.name) for f in fields(self)})
        cfg.densify = DensifyConfig(**asdict(self.densify))
        if cfg.sh_interval is None:
            cfg.sh_interval = max(1, self.steps // 30)
        if self.densify_auto:
            d = cfg.densify
            d.refine_start = max(1, self.steps // 20)
            d.refine_stop = self.steps // 2
            d.refine_every = max(50, self.steps // 100)
            d.reset_every = max(d.refine_every * 3, self.steps // 5)
            cfg.densify_auto = False
        return cfg

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["background"] = list(self.background)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FitConfig:
        d = dict(d)
        d["densify"] = DensifyConfig(**d.get("densify", {}))
        d["background"] = tuple(d.get("background", (0.0, 0.0, 0.0)))
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise CheckpointError(f"unknown fit config keys {sorted(unknown)}")
        return cls(**d)


def optimizer_step(loss: Tensor, optimizers: dict[str, torch.optim.Optimizer], set_lrs: Callable[[], None],
                   diverged: str) -> float:
    """One step of every optimiser on ``loss``. Returns the loss value.

    It zeroes the gradients and backpropagates. A loss with no gradient steps on zero gradients; that is a view
    where nothing is visible. A non-finite loss is refused: ``FloatingPointError`` "``diverged``: loss is ...".
    Then it sets the learning rates and steps."""
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    if loss.requires_grad:
        loss.backward()
    loss_value = float(loss.detach())
    if not math.isfinite(loss_value):
        raise FloatingPointError(f"{diverged}: loss is {loss_value}")
    set_lrs()
    for opt in optimizers.values():
        opt.step()
    return loss_value


def scene_scale_of(viewmats: Tensor) -> float:
    """gsplat's scene scale: 1.1 x the largest distance of a camera centre from their mean."""
    c = camera_centers(viewmats.double())
    return 1.1 * float((c - c.mean(0)).norm(dim=-1).max().clamp(min=1e-6))


class Fitter(TrainingRun):
    """Holds a fit in progress: parameters, optimizers, densification state, step, history.

    Args:
        train: the training views.
        config: see :class:`FitConfig`.
        device: where to optimise, "cpu" or "cuda".
        bounds: ``(lo [3], hi [3])`` box for random initial points. Default: :func:`focus_bounds`.
        points / colors: an initial point cloud ``[M, 3]`` to start from instead of random points. Optional
            ``[M, 3]`` colours in [0, 1].
        scene_scale: overrides :func:`scene_scale_of`.
    """

    def __init__(self, train: PosedImages, config: FitConfig, *, device: str | torch.device = "cpu",
                 bounds: tuple[Tensor, Tensor] | None = None, points: Tensor | None = None,
                 colors: Tensor | None = None, scene_scale: float | None = None,
                 _params: Params | None = None):
        if len(train) == 0:
            raise ValueError("Fitter: no training images")
        self.cfg = config.resolved()
        self.device = torch.device(device)
        self.train = train
        self._images = train.images.to(self.device)
        self._viewmats = train.viewmats.to(self.device)
        self._Ks = train.Ks.to(self.device)
        self._bg = torch.tensor(self.cfg.background, dtype=torch.float32, device=self.device)[None]
        self.scene_scale = scene_scale if scene_scale is not None else scene_scale_of(train.viewmats)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.wall_s = 0.0
        if _params is None:
            g = torch.Generator().manual_seed(self.cfg.seed)
            if points is None:
                lo, hi = bounds if bounds is not None else focus_bounds(train.viewmats)
                points = random_points(lo.float(), hi.float(), self.cfg.init_points, g)
            _params = init_params(points.float(), colors, sh_degree=self.cfg.sh_degree,
                                  init_opacity=self.cfg.init_opacity, init_scale=self.cfg.init_scale, generator=g)
        self.params: Params = {k: v.detach().to(self.device).contiguous().requires_grad_(True)
                               for k, v in _params.items()}
        lrs = self._base_lrs()
        self.optimizers = {k: torch.optim.Adam([self.params[k]], lr=lrs[k], eps=1e-15) for k in PARAM_NAMES}
        self.densify_state = DensifyState(self.n, device=self.device)

    # ------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Current number of Gaussians."""
        return self.params["means"].shape[0]

    @property
    def sh_degree_now(self) -> int:
        return min(self.step // self.cfg.sh_interval, self.cfg.sh_degree)

    def _base_lrs(self) -> dict[str, float]:
        c = self.cfg
        return {"means": c.lr_means * self.scene_scale, "scales": c.lr_scales, "quats": c.lr_quats,
                "opacities": c.lr_opacities, "sh0": c.lr_sh0, "shN": c.lr_shN}

    def _set_lrs(self) -> None:
        lrs = self._base_lrs()
        lrs["means"] *= self.cfg.lr_means_final ** (min(self.step, self.cfg.steps) / max(1, self.cfg.steps))
        for k, opt in self.optimizers.items():
            opt.param_groups[0]["lr"] = lrs[k]

    def view_index(self, step: int) -> int:
        """Which training view step ``step`` uses: a fresh seeded permutation each epoch."""
        n = len(self.train)
        epoch, i = divmod(step, n)
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
        return int(torch.randperm(n, generator=g)[i])

    def render(self, viewmats: Tensor, Ks: Tensor, width: int, height: int,
               sh_degree: int | None = None) -> tuple[Tensor, dict[str, Any]]:
        """Render the current Gaussians, differentiably: ``([C, H, W, 3], meta)``."""
        d = self.sh_degree_now if sh_degree is None else sh_degree
        C = viewmats.shape[0]
        colors, _, meta = rasterize(**activated(self.params), viewmats=viewmats.to(self.device),
                                    Ks=Ks.to(self.device), width=width, height=height, sh_degree=d,
                                    backgrounds=self._bg.expand(C, 3), backend="auto", validate=False)
        return colors, meta

    # ------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One optimisation step, with densification when due. Returns ``{"loss", "psnr"}`` of the view."""
        i = self.view_index(self.step)
        target = self._images[i:i + 1]
        W, H = self.train.width, self.train.height
        colors, meta = self.render(self._viewmats[i:i + 1], self._Ks[i:i + 1], W, H)
        meta["means2d"].retain_grad()
        loss = fit_loss(colors, target, self.cfg.ssim_weight)
        # no gradient only when no Gaussian reaches any pixel of this view
        loss_value = optimizer_step(loss, self.optimizers, self._set_lrs, f"fit diverged at step {self.step}")

        d = self.cfg.densify
        s = self.step
        if s < d.refine_stop:
            if meta["means2d"].grad is not None:
                self.densify_state.update(meta["means2d"].grad, meta["radii"], W, H)
            if s > d.refine_start and s % d.refine_every == 0:
                g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + 7 * s + 1)
                counts = refine(self.params, self.optimizers, self.densify_state, d, s, self.scene_scale, g)
                self.history.append({"step": s, "event": "refine", **counts, "n": self.n})
            if s % d.reset_every == 0 and s > 0:
                reset_opacity(self.params, self.optimizers, 2.0 * d.prune_opacity)
                self.history.append({"step": s, "event": "opacity_reset", "n": self.n})
        self.step += 1
        return {"loss": loss_value, "psnr": psnr(colors, target)}

    @torch.no_grad()
    def evaluate(self, data: PosedImages, chunk: int = 4) -> dict[str, Any]:
        """PSNR and SSIM of the current Gaussians on ``data``: the mean over views, and per view."""
        per_view, ssims = [], []
        for j in range(0, len(data), chunk):
            vm, K = data.viewmats[j:j + chunk], data.Ks[j:j + chunk]
            out, _ = self.render(vm, K, data.width, data.height)
            out = out.clamp(0, 1).cpu()
            for k in range(out.shape[0]):
                per_view.append(psnr(out[k], data.images[j + k]))
                ssims.append(float(ssim(out[k:k + 1], data.images[j + k:j + k + 1])))
        return {"psnr": sum(per_view) / len(per_view), "ssim": sum(ssims) / len(ssims),
                "psnr_per_view": [round(p, 3) for p in per_view], "n_views": len(per_view)}

    def scene(self) -> GaussianScene:
        """The Gaussians as a CPU :class:`GaussianScene`, with all SH coefficients."""
        return params_to_scene(self.params)

    # ------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.cfg.steps

    def progress_postfix(self) -> dict[str, Any]:
        return {"n": self.n, "sh": self.sh_degree_now}

    # ------------------------------------------------------------------
    def save(self, prefix: str) -> dict[str, str]:
        """Write ``PREFIX.ply``, ``PREFIX.fit.json`` and ``PREFIX.fit.safetensors``. Returns the paths."""
        prefix = _strip_ply(prefix)
        ply = prefix + ".ply"
        Path(ply).parent.mkdir(parents=True, exist_ok=True)
        save_ply(self.scene(), ply)
        tensors = {f"params.{k}": v for k, v in self.params.items()}
        for k, opt in self.optimizers.items():
            tensors.update(adam_tensors(opt, [k]))
        tensors["densify.grad2d"] = self.densify_state.grad2d
        tensors["densify.count"] = self.densify_state.count
        doc = self.checkpoint_doc(CHECKPOINT_FORMAT, CHECKPOINT_VERSION, n_gaussians=self.n,
                                  scene_scale=self.scene_scale, config=self.cfg.to_json(),
                                  files={"ply": Path(ply).name, "state": Path(prefix).name + ".fit.safetensors"})
        return {"ply": ply, **write_checkpoint(prefix, doc, tensors)}

    @classmethod
    def load(cls, prefix: str, train: PosedImages, *, device: str | torch.device = "cpu",
             steps: int | None = None) -> Fitter:
        """Resume from :meth:`save`'s files. ``train`` must be the same data; it is checked.

        ``steps`` may extend the run. The learning-rate schedule then follows the new length."""
        prefix = _strip_ply(prefix)
        doc, tensors = read_checkpoint(prefix, CHECKPOINT_FORMAT, CHECKPOINT_VERSION, train)
        cfg = FitConfig.from_json(doc["config"])
        if steps is not None:
            cfg.steps = steps
        params = {k: tensors[f"params.{k}"] for k in PARAM_NAMES}
        fitter = cls(train, cfg, device=device, scene_scale=float(doc["scene_scale"]), _params=params)
        for k, opt in fitter.optimizers.items():
            load_adam_tensors(opt, [k], tensors)
        fitter.densify_state.grad2d = tensors["densify.grad2d"].to(fitter.device)
        fitter.densify_state.count = tensors["densify.count"].to(fitter.device)
        fitter.resume_progress(doc)
        return fitter


def _strip_ply(prefix: str) -> str:
    prefix = str(prefix)
    return prefix[:-4] if prefix.lower().endswith(".ply") else prefix


__all__ = ["FitConfig", "Fitter", "CheckpointError", "scene_scale_of", "focus_bounds"]
