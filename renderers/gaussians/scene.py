"""A 3D Gaussian scene in memory, and the checks around it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

DeviceLike = str | torch.device


class SceneError(ValueError):
    """A scene file or tensor set that can't be used. The message names the file and the problem."""


class SceneTooLargeError(SceneError, MemoryError):
    """A scene that would not fit the target device's free memory."""


class TensorScene:
    """What the 3DGS and 4DGS scenes share: per-Gaussian tensors, ``TENSORS``, with ``means [N, 3]`` first.

    They are checked for shape, counted and moved to a device together. A move is refused if they would not fit."""

    TENSORS: ClassVar[tuple[str, ...]]

    def _check_shapes(self, expected: dict[str, tuple[int, ...]]) -> int:
        """Raise :class:`SceneError` unless each tensor named in ``expected`` has its shape. ``-1`` is N.

        Returns N."""
        n = self.means.shape[0] if isinstance(self.means, Tensor) and self.means.dim() == 2 else -1
        for name, shape in expected.items():
            t, want = getattr(self, name), tuple(n if d == -1 else d for d in shape)
            if not isinstance(t, Tensor) or tuple(t.shape) != want or n < 0:
                got = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise SceneError(f"{type(self).__name__}.{name} must have shape {list(want)}, got {got}")
        return n

    @property
    def n(self) -> int:
        """Number of Gaussians."""
        return self.means.shape[0]

    @property
    def device(self) -> torch.device:
        return self.means.device

    def check_fits(self, device: DeviceLike) -> None:
        """Raise :class:`SceneTooLargeError` if the scene would not fit ``device``."""
        raise NotImplementedError

    def to(self, device: DeviceLike, dtype: torch.dtype | None = None):
        """A copy on ``device``. Refused, with the numbers, if it would not fit there."""
        device = torch.device(device)
        if device != self.device:
            self.check_fits(device)
        return replace(self, **{k: getattr(self, k).to(device=device, dtype=dtype) for k in self.TENSORS})


@dataclass
class GaussianScene(TensorScene):
    """Activated 3DGS parameters, ready for :func:`rasterize`.

    Attributes:
        means: ``[N, 3]`` world-space centres.
        quats: ``[N, 4]`` unit quaternions, order w, x, y, z.
        scales: ``[N, 3]`` standard deviations. The PLY's ``scale_*`` are their logs.
        opacities: ``[N]`` in [0, 1]. The PLY's ``opacity`` is their logit.
        sh: ``[N, K, 3]`` SH coefficients, K = (sh_degree + 1) ** 2. ``sh[:, 0]`` is the PLY's ``f_dc``.
            ``sh[:, 1:]`` is its ``f_rest``, which is channel-major there.
        raw: the pre-activation float32 values a loader read, numpy on the CPU. Saving an unedited scene writes
            back the same bits. Not part of equality. Edited Gaussians are re-encoded from the tensors.
    """

    means: Tensor
    quats: Tensor
    scales: Tensor
    opacities: Tensor
    sh: Tensor
    raw: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    TENSORS: ClassVar[tuple[str, ...]] = ("means", "quats", "scales", "opacities", "sh")

    def __post_init__(self) -> None:
        n = self._check_shapes({"means": (-1, 3), "quats": (-1, 4), "scales": (-1, 3), "opacities": (-1,)})
        if self.sh.dim() != 3 or self.sh.shape[0] != n or self.sh.shape[2] != 3:
            raise SceneError(f"GaussianScene.sh must have shape [{n}, K, 3], got {list(self.sh.shape)}")
        if self.sh.shape[1] not in (1, 4, 9, 16):
            raise SceneError(f"GaussianScene.sh has K={self.sh.shape[1]} coefficients; expected 1, 4, 9 or 16")

    @property
    def sh_degree(self) -> int:
        """Spherical-harmonic degree, 0..3."""
        return math.isqrt(self.sh.shape[1]) - 1

    def check_fits(self, device: DeviceLike) -> None:
        check_fits(self.n, device, self.sh_degree)

    def rasterize_args(self) -> dict[str, Any]:
        """Keyword arguments for :func:`rasterize`: ``rasterize(**scene.rasterize_args(), viewmats=..., ...)``."""
        return {"means": self.means, "quats": self.quats, "scales": self.scales,
                "opacities": self.opacities, "colors": self.sh, "sh_degree": self.sh_degree}


def random_scene(
    n: int,
    sh_degree: int = 3,
    *,
    seed: int = 0,
    extent: float = 1.0,
    scale_range: tuple = (0.02, 0.15),
    device: DeviceLike = "cpu",
    dtype: torch.dtype = torch.float32,
) -> GaussianScene:
    """A reproducible random scene: ``n`` Gaussians in a cube of half-size ``extent`` at the origin."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = math.log(scale_range[0]), math.log(scale_range[1])
    K = (sh_degree + 1) ** 2
    sh = torch.randn(n, K, 3, generator=g) * 0.3
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) / 0.28209479177387814  # base colour in [0, 1]
    scene = GaussianScene(
        means=(torch.rand(n, 3, generator=g) * 2 - 1) * extent,
        quats=torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1),
        scales=torch.exp(torch.rand(n, 3, generator=g) * (hi - lo) + lo) * extent,
        opacities=torch.rand(n, generator=g) * 0.9 + 0.05,
        sh=sh,
    )
    return scene.to(device, dtype)


# Memory estimate per Gaussian: parameters (3 + 4 + 3 + 1 + 3K floats) plus per-camera
# projection outputs, colours and tile intersections while rendering one camera.
_RENDER_BYTES_PER_GAUSSIAN = 160


def bytes_per_gaussian(sh_degree: int = 3) -> int:
    """Estimated bytes one Gaussian needs to be held and rendered, for one camera."""
    K = (sh_degree + 1) ** 2
    return 4 * (11 + 3 * K) + _RENDER_BYTES_PER_GAUSSIAN


def available_bytes(device: DeviceLike) -> int:
    """Free memory on ``device`` in bytes. On CUDA, free device memory. On a CPU, available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is a dependency
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_fits(
    n_gaussians: int,
    device: DeviceLike,
    sh_degree: int = 3,
    *,
    available: int | None = None,
    source: str = "scene",
) -> int:
    """Refuse, before allocating, a scene that would not fit ``device``.

    Returns the estimated bytes needed. Raises :class:`SceneTooLargeError` naming the Gaussian count, the bytes
    needed and the bytes free. ``available`` overrides the free-memory query, for tests and planning.
    """
    need = int(n_gaussians) * bytes_per_gaussian(sh_degree)
    return refuse_if_too_large(need, device, available, f"{source}: {n_gaussians:,} Gaussians (SH degree {sh_degree})")


def refuse_if_too_large(need: int, device: DeviceLike, available: int | None, what: str) -> int:
    """Raise :class:`SceneTooLargeError` if ``need`` bytes exceed the free memory of ``device``. Returns ``need``.

    ``available``, when given, is that free memory. The message reads "``what`` need about ... MiB on ..., but
    only ... MiB is free"."""
    free = available_bytes(device) if available is None else int(available)
    if need > free:
        raise SceneTooLargeError(f"{what} need about {need / 2**20:,.1f} MiB on {torch.device(device)}, "
                                 f"but only {free / 2**20:,.1f} MiB is free")
    return need
