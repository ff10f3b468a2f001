"""``NerfModel``: config, field and occupancy grid. Rendering, and saving and loading as a directory.

A NeRF directory holds:

- ``config.json``: ``{"format": "framegraph-nerf", "version": 1, "aabb": [6], "grid": {n_levels,
  n_features, log2_table_size, base_resolution, finest_resolution}, "resolutions": [L], "dense": [L],
  "hidden": 64, "n_geo_features": 15, "step_size": float, "background": [3],
  "occupancy": {"resolution", "threshold", "decay"}}``.
  ``resolutions`` and ``dense`` are derived from ``grid`` and checked on load.
- ``model.safetensors``: the field's weights, float32. They are ``grid.table``, ``density.{0,1}`` and
  ``color.{0,1,2}``. Also ``occupancy.bits``, the occupancy bitfield, ``uint8 [ceil(R^3 / 8)]``.

:func:`load_nerf` raises :class:`NerfLoadError` naming the file and the problem.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from framegraph.kernels.backend import Backend
from framegraph.stream.files import write_json, written_whole

from ..cameras import read_json_object
from .field import NerfField
from .hash_encoding import HashGridConfig
from .marcher import EARLY_STOP, MarchCapacity, RenderResult, camera_rays, render_rays
from .occupancy import OccupancyGrid

FORMAT, VERSION = "framegraph-nerf", 1
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


class NerfLoadError(ValueError):
    """A NeRF directory that cannot be loaded. The message names the file and the problem."""


@dataclass
class NerfConfig:
    """Everything but the weights.

    Attributes:
        aabb: ``(xmin, ymin, zmin, xmax, ymax, zmax)`` world box holding the scene.
        grid: hash grid shape.
        hidden: width of both MLPs' hidden layers.
        n_geo_features: geometry features from the density MLP to the colour MLP.
        step_size: marching step in world units. Default: the box diagonal / 512.
        background: RGB behind the field, in [0, 1].
        occupancy_resolution / occupancy_threshold / occupancy_decay: see :class:`OccupancyGrid`.
    """

    aabb: Sequence[float] = (-1.0, -1.0, -1.0, 1.0, 1.0, 1.0)
    grid: HashGridConfig = field(default_factory=HashGridConfig)
    hidden: int = 64
    n_geo_features: int = 15
    step_size: float | None = None
    background: Sequence[float] = (0.0, 0.0, 0.0)
    occupancy_resolution: int = 128
    occupancy_threshold: float = 0.01
    occupancy_decay: float = 0.95

    def __post_init__(self):
        self.aabb = [float(v) for v in self.aabb]
        self.background = [float(v) for v in self.background]
        if self.step_size is None:
            ext = torch.tensor(self.aabb[3:]) - torch.tensor(self.aabb[:3])
            self.step_size = float(ext.norm()) / 512
        self.step_size = float(self.step_size)

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "aabb": list(self.aabb), "grid": self.grid.to_dict(),
            "resolutions": self.grid.resolutions, "dense": self.grid.dense, "hidden": self.hidden,
            "n_geo_features": self.n_geo_features, "step_size": self.step_size, "background": list(self.background),
            "occupancy": {"resolution": self.occupancy_resolution, "threshold": self.occupancy_threshold,
                          "decay": self.occupancy_decay},
        }

    @classmethod
    def from_dict(cls, d: dict) -> NerfConfig:
        """Inverse of :meth:`to_dict`. Raises ``KeyError``, ``TypeError`` or ``ValueError`` on bad fields."""
        occ = d.get("occupancy", {})
        return cls(aabb=d["aabb"], grid=HashGridConfig(**d["grid"]), hidden=int(d.get("hidden", 64)),
                   n_geo_features=int(d.get("n_geo_features", 15)), step_size=d.get("step_size"),
                   background=d.get("background", (0.0, 0.0, 0.0)),
                   occupancy_resolution=int(occ.get("resolution", 128)),
                   occupancy_threshold=float(occ.get("threshold", 0.01)),
                   occupancy_decay=float(occ.get("decay", 0.95)))


class NerfModel(nn.Module):
    """An instant-ngp style NeRF: :class:`NerfField`, :class:`OccupancyGrid` and :class:`NerfConfig`.

    ``model.render(viewmat, K, width, height)`` gives an image. :func:`fit` trains it. :meth:`save` and
    :func:`load_nerf` write and read a directory.
    """

    def __init__(self, config: NerfConfig | None = None, *, seed: int = 0, device="cpu"):
        super().__init__()
        self.config = config or NerfConfig()
        gen = torch.Generator().manual_seed(seed)
        c = self.config
        self.field = NerfField(c.grid, c.aabb, c.hidden, c.n_geo_features, generator=gen)
        self.occupancy = OccupancyGrid(c.aabb, c.occupancy_resolution, threshold=c.occupancy_threshold,
                                       decay=c.occupancy_decay)
        self.to(device)

    # nn.Module.to moves parameters and buffers; the occupancy grid is not a module, so move it too.
    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        dev = self.field.aabb.device
        if self.occupancy.device != dev:
            self.occupancy = self.occupancy.to(dev)
        return out

    @property
    def device(self) -> torch.device:
        return self.field.aabb.device

    @property
    def background(self) -> Tensor:
        return torch.tensor(self.config.background, dtype=torch.float32, device=self.device)

    def render_rays(self, origins: Tensor, dirs: Tensor, *, backend: Backend = "auto", use_occupancy: bool = True,
                    early_stop: float = EARLY_STOP, offsets: Tensor | None = None, chunk_steps: int = 64,
                    capacity: MarchCapacity | None = None, ray_batch: int = 0) -> RenderResult:
        """Composite rays ``[R, 3]`` through the field; see :func:`marcher.render_rays`. World rays, unit dirs."""
        return render_rays(lambda p, d: self.field(p, d, backend), origins, dirs, self.field.aabb,
                           self.config.step_size, occupancy=self.occupancy if use_occupancy else None,
                           background=self.background, early_stop=early_stop, chunk_steps=chunk_steps,
                           offsets=offsets, capacity=capacity, ray_batch=ray_batch)

    def march_capacity(self) -> MarchCapacity:
        """Fixed sizes for sync-free marching through this model. Pass them to :meth:`render` frame after frame."""
        return MarchCapacity.for_box(self.config.aabb, self.config.step_size)

    def render(self, viewmat: Tensor, K: Tensor, width: int, height: int, *, backend: Backend = "auto",
               chunk_rays: int = 1 << 14, use_occupancy: bool = True, early_stop: float = EARLY_STOP,
               capacity: MarchCapacity | None = None) -> Tensor:
        """Image ``[H, W, 3]`` float32 in [0, 1] for one OpenCV camera, rendered on the model's device.

        The camera is ``viewmat [4, 4]`` world-to-camera and ``K [3, 3]``. Wrap in ``torch.no_grad()`` unless
        training. ``capacity`` is None for the readable march. For the sync-free one it is
        :meth:`march_capacity`, kept across frames; see :func:`marcher.render_rays`."""
        o, d = camera_rays(viewmat.to(self.device), K.to(self.device), width, height)
        rgb = [self.render_rays(oc, dc, backend=backend, use_occupancy=use_occupancy, early_stop=early_stop,
                                capacity=capacity, ray_batch=i).rgb
               for i, (oc, dc) in enumerate(zip(o.split(chunk_rays), d.split(chunk_rays)))]
        return torch.cat(rgb).reshape(height, width, 3)

    def render_layers(self, viewmat: Tensor, K: Tensor, width: int, height: int, *, backend: Backend = "auto",
                      chunk_rays: int = 1 << 14, early_stop: float = EARLY_STOP,
                      capacity: MarchCapacity | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """As :meth:`render`, with the depth ``[H, W]`` and the opacity ``[H, W]``.

        The depth is the expected camera-z depth of what each pixel shows. It is the expected distance along the
        ray, ``Σ w t / Σ w``, times the ray's forward component. It is 0 where nothing was hit. The opacity is
        ``1 − T``."""
        o, d = camera_rays(viewmat.to(self.device), K.to(self.device), width, height)
        forward = viewmat.to(self.device)[2, :3].float()  # the camera's z axis in world coordinates
        rgb, depth, opacity = [], [], []
        for i, (oc, dc) in enumerate(zip(o.split(chunk_rays), d.split(chunk_rays))):
            r = self.render_rays(oc, dc, backend=backend, early_stop=early_stop, capacity=capacity, ray_batch=i)
            rgb.append(r.rgb)
            opacity.append(r.opacity)
            depth.append(r.depth / r.opacity.clamp_min(1e-10) * (dc @ forward))
        return (torch.cat(rgb).reshape(height, width, 3), torch.cat(depth).reshape(height, width),
                torch.cat(opacity).reshape(height, width))

    # ------------------------------------------------------------------ I/O
    def tensors(self) -> dict[str, Tensor]:
        """The safetensors payload: field weights and packed occupancy bits, on the CPU, contiguous."""
        out = {k: v.detach().cpu().contiguous() for k, v in self.field.state_dict().items()}
        out["occupancy.bits"] = self.occupancy.packed_bits()
        return out

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``. It is created if needed."""
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        write_json(d / CONFIG_NAME, self.config.to_dict())
        with written_whole(d / WEIGHTS_NAME) as tmp:
            save_file(self.tensors(), str(tmp), metadata={"format": FORMAT, "version": str(VERSION)})
        return d


def is_nerf_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` looks like a NeRF directory: it has a ``config.json`` naming our format.

    For commands that take either a NeRF directory or a Gaussian-splatting file."""
    cfg = Path(path) / CONFIG_NAME
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def load_nerf(directory: str | os.PathLike, device="cpu") -> NerfModel:
    """Load a NeRF directory written by :meth:`NerfModel.save`.

    Raises :class:`NerfLoadError` naming the file and what is wrong. That may be a missing directory, config or
    weights. Or a config that is not JSON, or lacks or mistypes fields. Or weights that are not safetensors,
    miss tensors or have unexpected ones. Or weights of the wrong shape or dtype for the config.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    if not d.is_dir():
        raise NerfLoadError(f"{d}: not a directory (a NeRF directory holds {CONFIG_NAME} and {WEIGHTS_NAME})")
    cfg_path, w_path = d / CONFIG_NAME, d / WEIGHTS_NAME
    if not cfg_path.is_file():
        raise NerfLoadError(f"{cfg_path}: missing (a NeRF directory holds {CONFIG_NAME} and {WEIGHTS_NAME})")
    doc = read_json_object(cfg_path, lambda problem: NerfLoadError(f"{cfg_path}: {problem}"))
    if doc.get("format", FORMAT) != FORMAT:
        raise NerfLoadError(f"{cfg_path}: format is {doc.get('format')!r}; expected {FORMAT!r}")
    if doc.get("version", VERSION) != VERSION:
        raise NerfLoadError(f"{cfg_path}: version {doc.get('version')!r} is not supported (expected {VERSION})")
    try:
        config = NerfConfig.from_dict(doc)
        if len(config.aabb) != 6 or len(config.background) != 3:
            raise ValueError(f"aabb needs 6 numbers and background 3, got {len(config.aabb)} and "
                             f"{len(config.background)}")
    except KeyError as e:
        raise NerfLoadError(f"{cfg_path}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise NerfLoadError(f"{cfg_path}: bad value ({e})") from None
    for key in ("resolutions", "dense"):
        derived = getattr(config.grid, key)
        if key in doc and doc[key] != derived:
            raise NerfLoadError(f"{cfg_path}: {key!r} is {doc[key]} but the grid settings give {derived}")
    if not w_path.is_file():
        raise NerfLoadError(f"{w_path}: missing (the weights of the NeRF in {d})")
    try:
        tensors = load_file(str(w_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise NerfLoadError(f"{w_path}: not a readable safetensors file ({e})") from None

    try:
        model = NerfModel(config)
    except ValueError as e:
        raise NerfLoadError(f"{cfg_path}: bad value ({e})") from None
    expected = {k: v for k, v in model.field.state_dict().items()}
    expected_bits = (config.occupancy_resolution ** 3 + 7) // 8
    missing = sorted(set(expected) - set(tensors)) + ([] if "occupancy.bits" in tensors else ["occupancy.bits"])
    unexpected = sorted(set(tensors) - set(expected) - {"occupancy.bits"})
    if missing:
        raise NerfLoadError(f"{w_path}: missing tensors {missing}")
    if unexpected:
        raise NerfLoadError(f"{w_path}: unexpected tensors {unexpected}")
    for k, ref in expected.items():
        t = tensors[k]
        if t.shape != ref.shape or t.dtype != torch.float32:
            raise NerfLoadError(f"{w_path}: tensor {k!r} is {t.dtype} {list(t.shape)}; the config expects "
                                f"float32 {list(ref.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise NerfLoadError(f"{w_path}: tensor {k!r} contains NaN or Inf")
    bits = tensors["occupancy.bits"]
    if bits.dtype != torch.uint8 or bits.shape != (expected_bits,):
        raise NerfLoadError(f"{w_path}: tensor 'occupancy.bits' is {bits.dtype} {list(bits.shape)}; a "
                            f"{config.occupancy_resolution}^3 grid expects uint8 [{expected_bits}]")
    model.field.load_state_dict({k: tensors[k] for k in expected})
    model.occupancy.load_packed_bits(bits)
    return model.to(device)
