"""Fitting a :class:`NerfModel` to posed images. It is instant-ngp's recipe, shrunk to run on a CPU.

Each step draws a random batch of rays from all training pixels. It marches them with a random offset per ray.
So samples cover the whole interval, not fixed points. It skips empty space with the occupancy grid. It
composites over the model's background. It takes an Adam step on a Huber or MSE loss. Every
``occupancy_every`` steps, the occupancy grid is updated from the current density. All cells update during the
warm-up. Then ``occupancy_cells`` sampled cells update.

Adam settings follow instant-ngp: ``betas=(0.9, 0.99)``, ``eps=1e-15``, learning rate ``1e-2``. A small weight
decay applies to the MLPs only. The rate steps down ×0.33 at 50 %, 75 % and 90 % of the steps.

:class:`NerfFitter` is the fit in progress on the shared loop, ``renderers/fit/loop.py``. That gives a progress
bar with PSNR and ETA, checkpoints, and Ctrl-C saves. Every random draw comes from one generator. Its state is
checkpointed with the weights, Adam moments and occupancy grid. So a resumed fit ends bit for bit where an
uninterrupted one does. :func:`fit` is the same loop as one call.

Checkpoint ``PREFIX`` is two files and a directory:

- ``PREFIX.fit.json``: step, fit config, data fingerprint, history.
- ``PREFIX.fit.safetensors``: Adam moments, occupancy EMA, generator state.
- The weights are the NeRF directory saved beside them. ``framegraph fit-nerf`` keeps all of it in ``OUT/``,
  with prefix ``OUT/fit``.
"""
from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.kernels.backend import Backend
from framegraph.stream.quality import psnr

from ..fit.loop import (
    TrainingRun,
    adam_tensors,
    load_adam_tensors,
    read_checkpoint,
    write_checkpoint,
)
from ..posed_images import PosedImages
from .marcher import camera_rays
from .model import NerfModel, load_nerf

CHECKPOINT_FORMAT, CHECKPOINT_VERSION = "framegraph-nerf-fit", 1
LOSSES = ("huber", "mse")


@dataclass
class FitReport:
    """What :func:`fit` measured.

    It holds ``losses`` per step, ``wall_s`` and ``cpu_s``. ``cpu_s`` is this process's CPU time. On a shared
    machine that is the honest measure of work. It also holds the samples evaluated per ray, as a mean over
    steps, and the final occupied fraction of the grid."""

    steps: int
    losses: list = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    samples_per_ray: float = 0.0
    occupied_fraction: float = 1.0


def dataset_rays(images: Tensor, viewmats: Tensor, Ks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """All pixels of ``images [N, H, W, 3]``, in [0, 1], as rays: ``origins, dirs, colors [N * H * W, 3]``."""
    N, H, W, _ = images.shape
    o, d = zip(*(camera_rays(viewmats[i], Ks[i], W, H) for i in range(N)))
    return torch.cat(o), torch.cat(d), images.reshape(-1, 3).float()


@dataclass
class NerfFitConfig:
    """Everything that decides a NeRF fit besides the model. It is saved in the checkpoint.

    Attributes:
        steps: optimisation steps; ``batch_rays``: rays per step.
        lr: Adam learning rate; instant-ngp's is 1e-2. It goes ×0.33 at 50 %, 75 % and 90 % of ``steps``.
        loss: ``"huber"``, delta 0.1 on RGB, or ``"mse"``.
        occupancy_every: steps between occupancy updates. 0: never update, keep the grid as it is.
        occupancy_warmup: before this step, every cell is re-evaluated at each update.
        occupancy_cells: cells evaluated per update after the warm-up. None: a quarter of them.
        seed: seeds ray batches, offsets and occupancy samples.
    """

    steps: int = 2000
    batch_rays: int = 4096
    lr: float = 1e-2
    loss: str = "huber"
    occupancy_every: int = 16
    occupancy_warmup: int = 256
    occupancy_cells: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"fit: loss={self.loss!r}; expected one of {LOSSES}")
        if self.steps < 0 or self.batch_rays < 1:
            raise ValueError(f"fit: steps must be >= 0 and batch_rays >= 1, got {self.steps} and {self.batch_rays}")

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step``, 0-based."""
        milestones = [int(self.steps * f) for f in (0.5, 0.75, 0.9)]
        return self.lr * 0.33 ** bisect.bisect_right(milestones, step)


class NerfFitter(TrainingRun):
    """A NeRF fit in progress: ``model`` trained in place on ``train``.

    :meth:`run` is the shared loop. :meth:`save` and :meth:`load` handle checkpoints. :meth:`evaluate` gives
    held-out PSNR.

    Args:
        model: the NeRF to train. Training runs on its device.
        train: training views: ``images [N, H, W, 3]`` in [0, 1], OpenCV ``viewmats``, ``Ks``.
        config: see :class:`NerfFitConfig`.
        backend: kernels to use. ``"auto"`` is Triton on CUDA.
    """

    def __init__(self, model: NerfModel, train: PosedImages, config: NerfFitConfig | None = None, *,
                 backend: Backend = "auto"):
        self.model, self.train, self.cfg, self.backend = model, train, config or NerfFitConfig(), backend
        if len(train) == 0:
            raise ValueError("fit: no training images")
        dev = model.device
        self.generator = torch.Generator(device=dev).manual_seed(self.cfg.seed)
        self.origins, self.dirs, self.colors = (t.to(dev) for t in dataset_rays(train.images, train.viewmats,
                                                                                  train.Ks))
        field_ = model.field
        self.param_names = (["grid.table"] + [f"density.{i}" for i in range(len(field_.density))]
                            + [f"color.{i}" for i in range(len(field_.color))])
        self.optimizer = torch.optim.Adam([
            {"params": [field_.grid["table"]], "weight_decay": 0.0},
            {"params": list(field_.density) + list(field_.color), "weight_decay": 1e-6},
        ], lr=self.cfg.lr, betas=(0.9, 0.99), eps=1e-15)
        self.step, self.wall_s, self.history = 0, 0.0, []
        self.losses: list[float] = []  # of the steps run by this object
        self.evaluated = 0  # network samples evaluated by those steps

    @property
    def total_steps(self) -> int:
        return self.cfg.steps

    def progress_postfix(self) -> dict[str, Any]:
        return {"occupied": f"{self.model.occupancy.occupied_fraction:.3f}"}

    def train_step(self) -> dict[str, float]:
        """One step, with an occupancy update first when due. Returns the batch's ``{"loss", "psnr"}``."""
        c, model, gen = self.cfg, self.model, self.generator
        dev = model.device
        if c.occupancy_every and self.step % c.occupancy_every == 0:
            cells = None if self.step < c.occupancy_warmup else (c.occupancy_cells or
                                                                  max(1, model.occupancy.resolution ** 3 // 4))
            model.occupancy.update(lambda p: model.field.query_density(p, self.backend)[0], model.config.step_size,
                                   n_cells=cells, generator=gen)
        idx = torch.randint(0, self.origins.shape[0], (c.batch_rays,), device=dev, generator=gen)
        offsets = torch.rand(c.batch_rays, device=dev, generator=gen)
        out = model.render_rays(self.origins[idx], self.dirs[idx], backend=self.backend, offsets=offsets,
                                chunk_steps=1 << 30)
        target = self.colors[idx]
        value = F.huber_loss(out.rgb, target, delta=0.1) if c.loss == "huber" else F.mse_loss(out.rgb, target)
        for group in self.optimizer.param_groups:
            group["lr"] = c.lr_at(self.step)
        self.optimizer.zero_grad(set_to_none=True)
        value.backward()
        loss = float(value.detach())
        if not math.isfinite(loss):
            raise FloatingPointError(f"fit diverged at step {self.step}: loss is {loss}")
        self.optimizer.step()
        self.evaluated += out.n_evaluated
        self.losses.append(loss)
        self.step += 1
        mse = float(torch.mean((out.rgb.detach() - target) ** 2))
        return {"loss": loss, "psnr": math.inf if mse == 0 else 10 * math.log10(1.0 / mse),
                "samples_per_ray": out.n_evaluated / c.batch_rays}

    @torch.no_grad()
    def evaluate(self, data: PosedImages, *, progress: bool = False) -> dict[str, Any]:
        """PSNR of the model's renders of ``data``'s views, the mean and per view. It shows a progress bar."""
        from ..fit.loop import progress as bar

        per_view = []
        for i in bar(range(len(data)), len(data), "held-out views", progress):
            img = self.model.render(data.viewmats[i], data.Ks[i], data.width, data.height, backend=self.backend)
            per_view.append(psnr(img.cpu(), data.images[i]))
        return {"psnr": sum(per_view) / len(per_view) if per_view else None,
                "psnr_per_view": [round(p, 3) for p in per_view], "n_views": len(per_view)}

    # ------------------------------------------------------------------ checkpoints
    def save(self, prefix: str) -> dict[str, str]:
        """Write the NeRF directory, ``prefix``'s folder, and the checkpoint ``prefix``. Returns the paths."""
        out = self.model.save(Path(prefix).parent)
        occ = self.model.occupancy
        tensors = {**adam_tensors(self.optimizer, self.param_names), "occupancy.opacity": occ.opacity,
                   "occupancy.bits": occ.bits.to(torch.uint8), "generator": self.generator.get_state()}
        doc = self.checkpoint_doc(CHECKPOINT_FORMAT, CHECKPOINT_VERSION, occupancy_updates=occ.updates,
                                  config=asdict(self.cfg))
        return {"nerf": str(out), **write_checkpoint(str(prefix), doc, tensors)}

    @classmethod
    def load(cls, prefix: str, train: PosedImages, *, device="cpu", steps: int | None = None,
             backend: Backend = "auto") -> NerfFitter:
        """Resume :meth:`save`'s files. The NeRF directory is ``prefix``'s folder.

        ``train`` must be the same data; it is checked. ``steps`` may extend the run. The learning-rate schedule
        then follows the new length."""
        doc, tensors = read_checkpoint(str(prefix), CHECKPOINT_FORMAT, CHECKPOINT_VERSION, train)
        config = NerfFitConfig(**doc["config"])
        if steps is not None:
            config.steps = steps
        model = load_nerf(Path(prefix).parent, device=device)
        fitter = cls(model, train, config, backend=backend)
        load_adam_tensors(fitter.optimizer, fitter.param_names, tensors)
        occ = model.occupancy
        occ.opacity = tensors["occupancy.opacity"].to(occ.device)
        occ.bits = tensors["occupancy.bits"].bool().to(occ.device)
        occ.updates = int(doc.get("occupancy_updates", 0))
        fitter.generator.set_state(tensors["generator"])
        fitter.resume_progress(doc)
        return fitter


def fit(model: NerfModel, images: Tensor, viewmats: Tensor, Ks: Tensor, *, steps: int = 2000,
        batch_rays: int = 4096, lr: float = 1e-2, loss: str = "huber", occupancy_every: int = 16,
        occupancy_warmup: int = 256, occupancy_cells: int | None = None, seed: int = 0,
        backend: Backend = "auto", log_every: int = 0,
        callback: Callable[[int, float], None] | None = None) -> FitReport:
    """Train ``model`` in place on posed images. It is a :class:`NerfFitter` run without a bar or checkpoints.

    Args:
        images: ``[N, H, W, 3]`` float in [0, 1]. Or uint8, divided by 255.
        viewmats: ``[N, 4, 4]`` world-to-camera, OpenCV axes. ``Ks``: ``[N, 3, 3]``.
        steps, batch_rays, lr, loss, occupancy_every, occupancy_warmup, occupancy_cells, seed: see
            :class:`NerfFitConfig`.
        backend: kernels to use. ``"auto"`` is Triton on CUDA.
        log_every: print the loss every so many steps. 0: quiet.
        callback: ``callback(step, loss)`` after each step.
    """
    config = NerfFitConfig(steps=steps, batch_rays=batch_rays, lr=lr, loss=loss, occupancy_every=occupancy_every,
                           occupancy_warmup=occupancy_warmup, occupancy_cells=occupancy_cells, seed=seed)
    if images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f"fit: images must be [N, H, W, 3], got {list(images.shape)}")
    n = images.shape[0]
    if viewmats.shape != (n, 4, 4) or Ks.shape != (n, 3, 3):
        raise ValueError(f"fit: need viewmats [{n}, 4, 4] and Ks [{n}, 3, 3], got {list(viewmats.shape)} "
                         f"and {list(Ks.shape)}")
    if images.dtype == torch.uint8:
        images = images.float() / 255
    fitter = NerfFitter(model, PosedImages(images.float(), viewmats, Ks, source="tensors"), config, backend=backend)
    report = FitReport(steps=steps)
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(steps):
        out = fitter.train_step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {out['loss']:.5f}  samples/ray {out['samples_per_ray']:6.1f}  "
                  f"occupied {model.occupancy.occupied_fraction:.3f}  {time.perf_counter() - t0:6.1f} s", flush=True)
        if callback is not None:
            callback(step, out["loss"])
    report.losses = fitter.losses
    report.wall_s = time.perf_counter() - t0
    report.cpu_s = time.process_time() - c0
    report.samples_per_ray = fitter.evaluated / max(1, steps * batch_rays)
    report.occupied_fraction = model.occupancy.occupied_fraction
    return report
