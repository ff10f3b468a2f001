"""A 4D Gaussian scene in memory, as activated parameters, and a random one for tests."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.renderers.gaussians.scene import SceneError, TensorScene, refuse_if_too_large

DeviceLike = str | torch.device

DEFAULT_TIME_DURATION = (-0.5, 0.5)  # fudan-zvg's default ``--time_duration``


@dataclass
class Gaussian4DScene(TensorScene):
    """Activated 4DGS parameters, ready for :func:`rasterize_4d`. Semantics are fudan-zvg's, ``rot_4d=True``.

    Attributes:
        means: ``[N, 3]`` spatial means ``mu_xyz``. The checkpoint's ``_xyz``.
        times: ``[N]`` temporal means ``mu_t``, in the scene's time units. The checkpoint's ``_t``.
        scales: ``[N, 4]`` standard deviations along the Gaussian's 4 axes. ``_scaling`` and ``_scaling_t``
            are their logs.
        quats_l, quats_r: ``[N, 4]`` unit quaternions of the left and right isoclinic rotations, order
            w, x, y, z. The 4D rotation is ``L(q_l) @ R(q_r)``. The checkpoint's ``_rotation``, ``_rotation_r``.
        opacities: ``[N]`` in [0, 1]. ``_opacity`` is their logit.
        sh: ``[N, K, 3]`` colour coefficients, ``K = (sh_degree_t + 1) * (sh_degree + 1) ** 2``.
            Block ``k`` of ``(sh_degree + 1) ** 2`` SH coefficients is weighted by
            ``cos(2 pi k (mu_t - t) / duration)``.
        sh_degree_t: degree of the temporal cosine basis. 0 is a colour constant in time.
        time_duration: ``(t0, t1)``, the scene's time span, fudan-zvg's ``time_duration``. Its length
            normalises the temporal basis. It is the loop period of a render stage.
    """

    means: Tensor
    times: Tensor
    scales: Tensor
    quats_l: Tensor
    quats_r: Tensor
    opacities: Tensor
    sh: Tensor
    sh_degree_t: int = 0
    time_duration: tuple[float, float] = DEFAULT_TIME_DURATION

    TENSORS: ClassVar[tuple[str, ...]] = ("means", "times", "scales", "quats_l", "quats_r", "opacities", "sh")

    def __post_init__(self) -> None:
        n = self._check_shapes({"means": (-1, 3), "times": (-1,), "scales": (-1, 4), "quats_l": (-1, 4),
                                "quats_r": (-1, 4), "opacities": (-1,)})
        if self.sh.dim() != 3 or self.sh.shape[0] != n or self.sh.shape[2] != 3:
            raise SceneError(f"Gaussian4DScene.sh must have shape [{n}, K, 3], got {list(self.sh.shape)}")
        if not isinstance(self.sh_degree_t, int) or self.sh_degree_t < 0:
            raise SceneError(f"Gaussian4DScene.sh_degree_t must be an int >= 0, got {self.sh_degree_t!r}")
        per_block, rest = divmod(self.sh.shape[1], self.sh_degree_t + 1)
        if rest or per_block not in (1, 4, 9, 16):
            raise SceneError(
                f"Gaussian4DScene.sh has K={self.sh.shape[1]} coefficients; with sh_degree_t={self.sh_degree_t} "
                f"expected {(self.sh_degree_t + 1)} blocks of 1, 4, 9 or 16"
            )
        t0, t1 = (float(v) for v in self.time_duration)
        if not t1 > t0:
            raise SceneError(f"Gaussian4DScene.time_duration must be (t0, t1) with t1 > t0, got {self.time_duration}")
        self.time_duration = (t0, t1)

    @property
    def sh_degree(self) -> int:
        """Spatial spherical-harmonic degree, 0..3."""
        return math.isqrt(self.sh.shape[1] // (self.sh_degree_t + 1)) - 1

    @property
    def duration(self) -> float:
        """``t1 - t0`` of :attr:`time_duration`."""
        return self.time_duration[1] - self.time_duration[0]

    def check_fits(self, device: DeviceLike) -> None:
        check_fits_4d(self.n, device, self.sh.shape[1])

    def rasterize_args(self) -> dict[str, Any]:
        """Keyword arguments for :func:`rasterize_4d`: ``rasterize_4d(**scene.rasterize_args(), t=..., ...)``."""
        return {"means": self.means, "times": self.times, "scales": self.scales, "quats_l": self.quats_l,
                "quats_r": self.quats_r, "opacities": self.opacities, "colors": self.sh,
                "sh_degree": self.sh_degree, "sh_degree_t": self.sh_degree_t, "duration": self.duration}


def random_scene_4d(
    n: int,
    sh_degree: int = 1,
    sh_degree_t: int = 1,
    *,
    seed: int = 0,
    extent: float = 1.0,
    time_duration: tuple[float, float] = (0.0, 1.0),
    scale_range: tuple = (0.03, 0.15),
    device: DeviceLike = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Gaussian4DScene:
    """A reproducible random 4D scene: ``n`` Gaussians in a cube of half-size ``extent``.

    Times spread over ``time_duration``. Temporal scales are a tenth to a third of the duration."""
    g = torch.Generator().manual_seed(seed)
    t0, t1 = time_duration
    T = t1 - t0
    lo, hi = math.log(scale_range[0]), math.log(scale_range[1])
    K = (sh_degree + 1) ** 2 * (sh_degree_t + 1)
    sh = torch.randn(n, K, 3, generator=g) * 0.2
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) / 0.28209479177387814
    scales = torch.empty(n, 4)
    scales[:, :3] = torch.exp(torch.rand(n, 3, generator=g) * (hi - lo) + lo) * extent
    scales[:, 3] = (torch.rand(n, generator=g) * (1 / 3 - 1 / 10) + 1 / 10) * T
    scene = Gaussian4DScene(
        means=(torch.rand(n, 3, generator=g) * 2 - 1) * extent,
        times=t0 + torch.rand(n, generator=g) * T,
        scales=scales,
        quats_l=F.normalize(torch.randn(n, 4, generator=g), dim=-1),
        quats_r=F.normalize(torch.randn(n, 4, generator=g), dim=-1),
        opacities=torch.rand(n, generator=g) * 0.9 + 0.05,
        sh=sh,
        sh_degree_t=sh_degree_t,
        time_duration=time_duration,
    )
    return scene.to(device, dtype)


_RENDER_BYTES_PER_GAUSSIAN = 220  # slice outputs, projection, colours and tile keys for one camera


def bytes_per_gaussian_4d(n_coeffs: int = 16) -> int:
    """Estimated bytes one 4D Gaussian needs to be held and rendered, for one camera."""
    return 4 * (3 + 1 + 4 + 4 + 4 + 1 + 3 * n_coeffs) + _RENDER_BYTES_PER_GAUSSIAN


def check_fits_4d(n_gaussians: int, device: DeviceLike, n_coeffs: int = 16, *, available: int | None = None,
                  source: str = "4D scene") -> int:
    """Refuse, before allocating, a 4D scene that would not fit ``device``. Returns the bytes needed."""
    need = int(n_gaussians) * bytes_per_gaussian_4d(n_coeffs)
    return refuse_if_too_large(need, device, available,
                               f"{source}: {n_gaussians:,} 4D Gaussians ({n_coeffs} colour coefficients each)")
