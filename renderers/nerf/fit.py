"""Fitting a :class:`NerfModel` to posed images (instant-ngp's recipe, shrunk to run on a CPU).

Each step draws a random batch of rays from all training pixels, marches them with a random offset
per ray (so samples cover the whole interval, not fixed points), skips empty space with the occupancy
grid, composites over the model's background and takes an Adam step on a Huber (or MSE) loss. Every
``occupancy_every`` steps the occupancy grid is updated from the current density (all cells during
the warm-up, then ``occupancy_cells`` sampled cells).

Adam settings follow instant-ngp: ``betas=(0.9, 0.99)``, ``eps=1e-15``, learning rate ``1e-2`` with a
small weight decay on the MLPs only; the rate steps down (×0.33) at 50 %, 75 % and 90 % of the steps.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.kernels.backend import Backend

from .marcher import camera_rays
from .model import NerfModel

LOSSES = ("huber", "mse")


@dataclass
class FitReport:
    """What :func:`fit` measured: ``losses`` per step, ``wall_s`` and ``cpu_s`` (this process's CPU time:
    on a shared machine the honest measure of work), samples evaluated per ray (mean over steps), the
    final occupied fraction of the grid."""

    steps: int
    losses: list = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    samples_per_ray: float = 0.0
    occupied_fraction: float = 1.0


def psnr(a: Tensor, b: Tensor) -> float:
    """Peak signal-to-noise ratio (dB) of images in [0, 1]."""
    mse = float(torch.mean((a.double() - b.double()) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def dataset_rays(images: Tensor, viewmats: Tensor, Ks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """All pixels of ``images [N, H, W, 3]`` (in [0, 1]) as rays: ``origins, dirs, colors [N * H * W, 3]``."""
    N, H, W, _ = images.shape
    o, d = zip(*(camera_rays(viewmats[i], Ks[i], W, H) for i in range(N)))
    return torch.cat(o), torch.cat(d), images.reshape(-1, 3).float()


def fit(model: NerfModel, images: Tensor, viewmats: Tensor, Ks: Tensor, *, steps: int = 2000,
        batch_rays: int = 4096, lr: float = 1e-2, loss: str = "huber", occupancy_every: int = 16,
        occupancy_warmup: int = 256, occupancy_cells: int | None = None, seed: int = 0,
        backend: Backend = "auto", log_every: int = 0,
        callback: Callable[[int, float], None] | None = None) -> FitReport:
    """Train ``model`` in place on posed images.

    Args:
        images: ``[N, H, W, 3]`` float in [0, 1] (or uint8, divided by 255).
        viewmats: ``[N, 4, 4]`` world-to-camera (OpenCV); ``Ks``: ``[N, 3, 3]``.
        steps: optimisation steps; ``batch_rays``: rays per step.
        lr: Adam learning rate (instant-ngp: 1e-2).
        loss: ``"huber"`` (delta 0.1, on RGB) or ``"mse"``.
        occupancy_every: steps between occupancy updates (0: never update, keep the grid as it is).
        occupancy_warmup: before this step every cell is re-evaluated at each update.
        occupancy_cells: cells evaluated per update after the warm-up (default: a quarter of them).
        seed: seeds ray batches, offsets and occupancy samples.
        backend: kernels to use (``"auto"``: Triton on CUDA).
        log_every: print the loss every so many steps (0: quiet).
        callback: ``callback(step, loss)`` after each step.
    """
    if loss not in LOSSES:
        raise ValueError(f"fit: loss={loss!r}; expected one of {LOSSES}")
    if images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f"fit: images must be [N, H, W, 3], got {list(images.shape)}")
    n = images.shape[0]
    if viewmats.shape != (n, 4, 4) or Ks.shape != (n, 3, 3):
        raise ValueError(f"fit: need viewmats [{n}, 4, 4] and Ks [{n}, 3, 3], got {list(viewmats.shape)} "
                         f"and {list(Ks.shape)}")
    if images.dtype == torch.uint8:
        images = images.float() / 255
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    origins, dirs, colors = (t.to(dev) for t in dataset_rays(images, viewmats, Ks))
    n_rays = origins.shape[0]
    field_ = model.field
    opt = torch.optim.Adam([
        {"params": [field_.grid["table"]], "weight_decay": 0.0},
        {"params": list(field_.density) + list(field_.color), "weight_decay": 1e-6},
    ], lr=lr, betas=(0.9, 0.99), eps=1e-15)
    milestones = [int(steps * f) for f in (0.5, 0.75, 0.9)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, gamma=0.33)
    R3 = model.occupancy.resolution ** 3
    occupancy_cells = occupancy_cells or max(1, R3 // 4)
    step_size = model.config.step_size
    report = FitReport(steps=steps)
    evaluated = 0
    t0, c0 = time.perf_counter(), time.process_time()
    model.train()
    for step in range(steps):
        if occupancy_every and step % occupancy_every == 0:
            cells = None if step < occupancy_warmup else occupancy_cells
            model.occupancy.update(lambda p: field_.query_density(p, backend)[0], step_size, n_cells=cells,
                                   generator=gen)
        idx = torch.randint(0, n_rays, (batch_rays,), device=dev, generator=gen)
        offsets = torch.rand(batch_rays, device=dev, generator=gen)
        out = model.render_rays(origins[idx], dirs[idx], backend=backend, offsets=offsets, chunk_steps=1 << 30)
        target = colors[idx]
        value = (F.huber_loss(out.rgb, target, delta=0.1) if loss == "huber" else F.mse_loss(out.rgb, target))
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        sched.step()
        evaluated += out.n_evaluated
        v = float(value.detach())
        report.losses.append(v)
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {v:.5f}  samples/ray {out.n_evaluated / batch_rays:6.1f}  "
                  f"occupied {model.occupancy.occupied_fraction:.3f}  {time.perf_counter() - t0:6.1f} s", flush=True)
        if callback is not None:
            callback(step, v)
    model.eval()
    report.wall_s = time.perf_counter() - t0
    report.cpu_s = time.process_time() - c0
    report.samples_per_ray = evaluated / max(1, steps * batch_rays)
    report.occupied_fraction = model.occupancy.occupied_fraction
    return report
