"""Fit 4D Gaussians, as fudan-zvg parameters, to multi-view video. It is the 3DGS recipe of ``renderers/fit`` in 4D.

The data is what a camera rig records: ``V`` fixed cameras filming ``T`` frames, a :class:`VideoViews`. Each
step renders one (frame, camera) pair with :func:`rasterize_4d`. That slices at the frame's time, then runs the
3DGS rasterizer; on CPU it is the torch reference's autograd. Each step takes one Adam step per parameter kind
on ``fit_loss``, L1 + SSIM. Densification is ``renderers/fit``'s ``refine``. It clones, splits and prunes by the
accumulated 2D mean gradients, and resets opacities. Its split here is 4D: children are sampled from the 4D
Gaussian, so they spread in time as well as space. The fit is deterministic for a seed on one machine. The
order of (frame, camera) pairs and every random draw derive from the seed and the step.

Parameters are held pre-activation, as fudan-zvg stores them. :func:`save_checkpoint` writes them. By name,
with shape and activation:

- ``means`` ``[N, 3]``: none. World units, ``_xyz``.
- ``times`` ``[N]``: none. Seconds, ``_t``.
- ``scales`` ``[N, 4]``: ``exp`` gives standard deviations, along the x, y, z axes and the t axis.
- ``quats_l`` ``[N, 4]``: normalised. ``_rotation``.
- ``quats_r`` ``[N, 4]``: normalised. ``_rotation_r``.
- ``opacities`` ``[N]``: ``sigmoid``.
- ``sh0`` ``[N, 1, 3]``: colour, SH degree 0. ``_features_dc``.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.stream.quality import psnr

from ..cameras import CameraPath
from ..fit.densify import DensifyState, append_rows, keep_rows, refine, reset_opacity
from ..fit.losses import fit_loss
from ..fit.params import knn_mean_distance, rgb_to_sh0
from ..fit.trainer import FitConfig, optimizer_step, scene_scale_of
from ..scenes import ProceduralScene
from . import rasterize_4d
from .reference import rotation_4d
from .scene import Gaussian4DScene

PARAM_NAMES_4D = ("means", "times", "scales", "quats_l", "quats_r", "opacities", "sh0")
Params = dict[str, Tensor]


@dataclass
class VideoViews:
    """``V`` cameras filming ``T`` frames of a dynamic scene.

    Attributes:
        images: ``[T, V, H, W, 3]`` float32 RGB in [0, 1].
        times: ``[T]`` frame times in seconds.
        cameras: the ``V`` cameras: ``viewmats [V, 4, 4]``, ``Ks [V, 3, 3]``, width, height.
    """

    images: Tensor
    times: Tensor
    cameras: CameraPath

    def __post_init__(self) -> None:
        T, V = self.times.shape[0], self.cameras.viewmats.shape[0]
        want = (T, V, self.cameras.height, self.cameras.width, 3)
        if tuple(self.images.shape) != want:
            raise ValueError(f"VideoViews: images must be [T, V, H, W, 3] = {list(want)} for {T} times and {V} "
                             f"cameras of {self.cameras.width}x{self.cameras.height}, got {list(self.images.shape)}")

    @property
    def n_frames(self) -> int:
        return self.times.shape[0]

    @property
    def n_cameras(self) -> int:
        return self.cameras.viewmats.shape[0]


def render_video(scene_at: Callable[[float], ProceduralScene], times: Sequence[float], cameras: CameraPath,
                 supersample: int = 2) -> VideoViews:
    """Ray-cast the procedural scene ``scene_at(t)`` from ``cameras`` at each time in ``times``, in seconds."""
    times = torch.as_tensor(list(times), dtype=torch.float32)
    w, h = cameras.width, cameras.height
    images = torch.stack([scene_at(float(t)).render(cameras.viewmats, cameras.Ks, w, h, supersample=supersample)[0]
                          for t in times])
    return VideoViews(images, times, cameras)


@dataclass
class Fit4DConfig(FitConfig):
    """A 4D fit: :class:`FitConfig`'s schedule and learning rates, plus the temporal ones.

    ``init_sigma_t`` is the initial temporal standard deviation of the Gaussians, in seconds. They start at the
    frame times of their points. ``lr_times`` is the learning rate of their temporal means, in seconds. It decays
    like the spatial means'. Both quaternions use ``lr_quats``. Colour is SH degree 0; ``sh_degree`` is ignored.
    A Gaussian's colour is constant. Gaussians of different times carry a changing colour.
    """

    sh_degree: int = 0
    init_sigma_t: float = 0.25
    init_opacity: float = 0.5
    lr_times: float = 1e-3
    lr_quats: float = 2e-3


class Fitter4D:
    """A 4D fit in progress: parameters, optimizers, densification state, step, history.

    Args:
        train: the training video, every frame from every camera.
        config: see :class:`Fit4DConfig`.
        points: ``[M, 3]`` initial Gaussian centres. ``colors [M, 3]`` are their RGB in [0, 1]. ``times [M]``
            are their times in seconds. For example, the scene's surface points at the frame times.
        time_duration: ``(t0, t1)`` of the scene, the checkpoint's ``time_duration``.
    """

    def __init__(self, train: VideoViews, config: Fit4DConfig, points: Tensor, colors: Tensor, times: Tensor,
                 time_duration: tuple[float, float]):
        if points.shape[0] == 0 or points.shape != colors.shape or times.shape != points.shape[:1]:
            raise ValueError(f"Fitter4D: points [M, 3], colors [M, 3] and times [M] must agree and M > 0, got "
                             f"{list(points.shape)}, {list(colors.shape)} and {list(times.shape)}")
        self.cfg = config.resolved()
        self.train = train
        self.time_duration = (float(time_duration[0]), float(time_duration[1]))
        self._bg = torch.tensor(self.cfg.background, dtype=torch.float32)[None]
        self.scene_scale = scene_scale_of(train.cameras.viewmats)
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.wall_s = 0.0
        n = points.shape[0]
        dist = knn_mean_distance(points.float())  # among the points of all times: static surfaces stay sharp
        identity = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(n, 4)
        params = {
            "means": points.float(), "times": times.float(),
            "scales": torch.cat([torch.log(dist.clamp(min=1e-7))[:, None].expand(n, 3),
                                 torch.full((n, 1), math.log(self.cfg.init_sigma_t))], dim=1),
            "quats_l": identity, "quats_r": identity,
            "opacities": torch.logit(torch.full((n,), self.cfg.init_opacity)),
            "sh0": rgb_to_sh0(colors.float())[:, None, :],
        }
        self.params: Params = {k: v.clone().contiguous().requires_grad_(True) for k, v in params.items()}
        lrs = self._base_lrs()
        self.optimizers = {k: torch.optim.Adam([self.params[k]], lr=lrs[k], eps=1e-15) for k in PARAM_NAMES_4D}
        self.densify_state = DensifyState(n)

    @property
    def n(self) -> int:
        """Current number of Gaussians."""
        return self.params["means"].shape[0]

    def _base_lrs(self) -> dict[str, float]:
        c = self.cfg
        return {"means": c.lr_means * self.scene_scale, "times": c.lr_times, "scales": c.lr_scales,
                "quats_l": c.lr_quats, "quats_r": c.lr_quats, "opacities": c.lr_opacities, "sh0": c.lr_sh0}

    def _set_lrs(self) -> None:
        lrs = self._base_lrs()
        decay = self.cfg.lr_means_final ** (min(self.step, self.cfg.steps) / max(1, self.cfg.steps))
        lrs["means"] *= decay
        lrs["times"] *= decay
        for k, opt in self.optimizers.items():
            opt.param_groups[0]["lr"] = lrs[k]

    def pair_index(self, step: int) -> tuple[int, int]:
        """The ``(frame, camera)`` pair step ``step`` trains on. Each epoch permutes all pairs afresh, seeded."""
        V = self.train.n_cameras
        n = self.train.n_frames * V
        epoch, i = divmod(step, n)
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
        return divmod(int(torch.randperm(n, generator=g)[i]), V)

    def scene(self) -> Gaussian4DScene:
        """The current Gaussians, activated and detached, as a :class:`Gaussian4DScene`."""
        p = {k: v.detach() for k, v in self.params.items()}
        return Gaussian4DScene(means=p["means"].clone(), times=p["times"].clone(), scales=torch.exp(p["scales"]),
                               quats_l=F.normalize(p["quats_l"], dim=-1), quats_r=F.normalize(p["quats_r"], dim=-1),
                               opacities=torch.sigmoid(p["opacities"]), sh=p["sh0"].clone(), sh_degree_t=0,
                               time_duration=self.time_duration)

    def render(self, t: float, viewmats: Tensor, Ks: Tensor) -> tuple[Tensor, dict]:
        """The current Gaussians at time ``t`` from ``C`` cameras, differentiable: ``([C, H, W, 3], meta)``."""
        p = self.params
        C = viewmats.shape[0]
        colors, _, meta = rasterize_4d(
            means=p["means"], times=p["times"], scales=torch.exp(p["scales"]), quats_l=p["quats_l"],
            quats_r=p["quats_r"], opacities=torch.sigmoid(p["opacities"]), colors=p["sh0"], t=float(t),
            viewmats=viewmats, Ks=Ks, width=self.train.cameras.width, height=self.train.cameras.height,
            sh_degree=0, duration=self.time_duration[1] - self.time_duration[0],
            backgrounds=self._bg.expand(C, 3), validate=False)
        return colors, meta

    def train_step(self) -> dict[str, float]:
        """One optimisation step, with densification when due. Returns ``{"loss", "psnr"}`` of the pair."""
        f, v = self.pair_index(self.step)
        cams = self.train.cameras
        target = self.train.images[f, v][None]
        colors, meta = self.render(float(self.train.times[f]), cams.viewmats[v:v + 1].float(), cams.Ks[v:v + 1].float())
        means2d = meta["means2d"]
        if means2d.requires_grad:
            means2d.retain_grad()
        loss = fit_loss(colors, target, self.cfg.ssim_weight)
        # no gradient only when no Gaussian is seen at this time from this camera
        loss_value = optimizer_step(loss, self.optimizers, self._set_lrs, f"4D fit diverged at step {self.step}")
        self._densify(meta)
        self.step += 1
        return {"loss": loss_value, "psnr": psnr(colors, target)}

    def _densify(self, meta: dict) -> None:
        d, s = self.cfg.densify, self.step
        if s >= d.refine_stop:
            return
        if meta["means2d"].grad is not None:  # gradients of the kept Gaussians, scattered back to all N
            ids = meta["ids"]
            grad = torch.zeros(1, self.n, 2)
            radii = torch.zeros(1, self.n, 2, dtype=meta["radii"].dtype)
            grad[:, ids], radii[:, ids] = meta["means2d"].grad, meta["radii"]
            self.densify_state.update(grad, radii, self.train.cameras.width, self.train.cameras.height)
        if s > d.refine_start and s % d.refine_every == 0:
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + 7 * s + 1)
            counts = refine(self.params, self.optimizers, self.densify_state, d, s, self.scene_scale, g,
                            size=spatial_size, split_fn=split_4d)
            self.history.append({"step": s, "event": "refine", **counts, "n": self.n})
        if s % d.reset_every == 0 and s > 0:
            reset_opacity(self.params, self.optimizers, 2.0 * d.prune_opacity)
            self.history.append({"step": s, "event": "opacity_reset", "n": self.n})

    @torch.no_grad()
    def evaluate(self, data: VideoViews) -> dict[str, float]:
        """Mean PSNR in dB of the current Gaussians over every frame and camera of ``data``, and its worst frame."""
        per_frame = []
        cams = data.cameras
        for f in range(data.n_frames):
            out, _ = self.render(float(data.times[f]), cams.viewmats.float(), cams.Ks.float())
            per_frame.append(sum(psnr(o, i) for o, i in zip(out, data.images[f])) / data.n_cameras)
        return {"psnr": sum(per_frame) / len(per_frame), "psnr_worst_frame": min(per_frame),
                "n_frames": data.n_frames, "n_cameras": data.n_cameras}

    def run(self, steps: int | None = None, *, progress: bool = True, desc: str = "fit 4D") -> None:
        """Train until step ``steps``, default ``config.steps``. A tqdm bar shows the running PSNR."""
        from tqdm import tqdm

        end = self.cfg.steps if steps is None else steps
        recent: list[float] = []
        t0 = time.perf_counter()
        with tqdm(total=end, initial=self.step, desc=desc, disable=not progress, dynamic_ncols=True,
                  unit="step") as bar:
            while self.step < end:
                out = self.train_step()
                recent = (recent + [out["psnr"]])[-50:]
                bar.update(1)
                if self.step % 10 == 0 or self.step == end:
                    bar.set_postfix(psnr=f"{sum(recent) / len(recent):.2f}", n=self.n)
                if self.step % 100 == 0:
                    self.history.append({"step": self.step, "event": "train", "n": self.n,
                                         "psnr": round(sum(recent) / len(recent), 3), "loss": round(out["loss"], 5)})
        self.wall_s += time.perf_counter() - t0


def spatial_size(params: Params) -> Tensor:
    """``[N]`` the largest standard deviation of each Gaussian's slice at its own time, in world units.

    The 4D scales mix metres and seconds. This is the spatial part: ``sqrt`` of the largest eigenvalue of the
    conditional covariance. The largest spatial axis bounds it above."""
    R = rotation_4d(params["quats_l"], params["quats_r"])
    s = torch.exp(params["scales"])
    cov = (R * s[:, None, :] ** 2) @ R.transpose(1, 2)
    cond = cov[:, :3, :3] - cov[:, :3, 3:] @ cov[:, 3:, :3] / cov[:, 3:, 3:]
    return torch.linalg.eigvalsh(cond)[:, -1].clamp(min=0).sqrt()


@torch.no_grad()
def split_4d(params: Params, optimizers: dict, state: DensifyState, mask: Tensor,
             generator: torch.Generator | None = None) -> int:
    """Replace each Gaussian where ``mask [N]`` is set by two drawn from its 4D Gaussian, in space and time.

    All four scales are divided by 1.6. It is :func:`framegraph.renderers.fit.densify.split` in 4D."""
    sel = torch.where(mask)[0]
    n = int(sel.numel())
    if n == 0:
        return 0
    scales = torch.exp(params["scales"][sel])  # [n, 4]
    R = rotation_4d(params["quats_l"][sel], params["quats_r"][sel])  # [n, 4, 4]
    noise = torch.randn(2, n, 4, generator=generator).to(scales)
    offsets = torch.einsum("nij,nj,bnj->bni", R, scales, noise)  # [2, n, 4]
    children = {k: torch.cat([v[sel], v[sel]]) for k, v in params.items()}
    children["means"] = (params["means"][sel][None] + offsets[..., :3]).reshape(2 * n, 3)
    children["times"] = (params["times"][sel][None] + offsets[..., 3]).reshape(2 * n)
    children["scales"] = torch.log(scales / 1.6).repeat(2, 1)
    keep_rows(params, optimizers, state, torch.where(~mask)[0])
    append_rows(params, optimizers, state, children)
    return n


@torch.no_grad()
def scene_points(scene_at: Callable[[float], ProceduralScene], times: Sequence[float], per_frame: int,
                 seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Initial points: ``per_frame`` surface points of ``scene_at(t)`` at each time.

    They are its SfM-like point cloud, from :meth:`ProceduralScene.sample_points`. Returns
    ``(points [M, 3], colors [M, 3], times [M])``."""
    pts, cols, ts = [], [], []
    for k, t in enumerate(times):
        p, c = scene_at(float(t)).sample_points(per_frame, seed=seed + k)
        pts.append(p)
        cols.append(c)
        ts.append(torch.full((p.shape[0],), float(t)))
    return torch.cat(pts), torch.cat(cols), torch.cat(ts)


__all__ = ["VideoViews", "render_video", "Fit4DConfig", "Fitter4D", "scene_points", "split_4d", "spatial_size",
           "PARAM_NAMES_4D"]
