"""Rays, fixed-step ray marching with empty-space skipping, and volume rendering, in readable torch.

Rays come from OpenCV cameras, as in ``renderers/cameras.py``. Pixel row i, col j looks through
``(j + 0.5, i + 0.5)``. Directions are unit length in world space, so ``t`` is a world distance.

Marching: a ray enters the AABB at ``t_near`` and leaves at ``t_far``. Sample ``k`` sits at
``t_k = t_near + (k + u) * step_size``, for every ``t_k < t_far``. ``u`` is in [0, 1). It is 0.5 when rendering
and random per ray while training. Each sample represents the interval ``delta = step_size`` around it.

Volume rendering follows Max 1995 and NeRF:

- ``alpha_k = 1 - exp(-sigma_k * delta)``.
- ``T_k = prod_{m<k} (1 - alpha_m)``, ``w_k = T_k * alpha_k``.
- colour ``sum_k w_k c_k + T_final * background``.

Two things skip work without changing what the sum means:

- **empty-space skipping**: samples in unoccupied cells of an :class:`OccupancyGrid` are never evaluated.
  Their sigma is taken as 0.
- **early ray termination**: a sample whose transmittance ``T_k`` is below ``early_stop`` contributes nothing.
  The default is 1e-4. Once a ray's transmittance falls below it, the ray is dropped from later chunks of
  steps. The image changes by at most ``early_stop`` per channel. Colours are in [0, 1].

Samples are processed ``chunk_steps`` steps at a time for all live rays. The result does not depend on the
chunking.

The readable march sizes everything by the data: the longest ray, the live rays, the samples to evaluate. That
reads values back to the host every chunk. The sync-free march computes the same sums with fixed shapes. It runs
with ``capacity``, a :class:`MarchCapacity`. Every ray marches a fixed number of steps. The samples to evaluate
are packed into a fixed capacity. All steps run in one chunk, so no ray is dropped early.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..capacity import Capacity
from .occupancy import OccupancyGrid

EARLY_STOP = 1e-4

FieldFn = Callable[[Tensor, Tensor], tuple]  # (points [M, 3], dirs [M, 3]) -> (sigma [M], rgb [M, 3])


def camera_rays(viewmat: Tensor, K: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """World-space rays of every pixel of an OpenCV camera.

    Args:
        viewmat: ``[4, 4]`` world-to-camera. X right, y down, z forward.
        K: ``[3, 3]`` intrinsics in pixels.
    Returns:
        ``origins [H * W, 3]`` and unit ``dirs [H * W, 3]``, row-major over pixels.
    """
    viewmat, K = viewmat.float(), K.float()
    dev = viewmat.device
    ys, xs = torch.meshgrid(torch.arange(height, device=dev, dtype=torch.float32) + 0.5,
                            torch.arange(width, device=dev, dtype=torch.float32) + 0.5, indexing="ij")
    cam = torch.stack([(xs - K[0, 2]) / K[0, 0], (ys - K[1, 2]) / K[1, 1], torch.ones_like(xs)], dim=-1)
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    dirs = cam.reshape(-1, 3) @ R  # R^T d for row vectors
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    origin = -(R.t() @ t)
    return origin.expand_as(dirs).contiguous(), dirs.contiguous()


def ray_aabb(origins: Tensor, dirs: Tensor, aabb: Tensor, near: float = 0.0) -> tuple[Tensor, Tensor]:
    """Entry and exit distances ``[R]`` of rays with a box, by the slab method. ``t_far <= t_near`` is a miss.

    ``t_near`` is at least ``near``. So cameras inside the box start at their centre.
    """
    inv = 1.0 / torch.where(dirs.abs() < 1e-12, torch.full_like(dirs, 1e-12), dirs)
    t0 = (aabb[:3] - origins) * inv
    t1 = (aabb[3:] - origins) * inv
    t_near = torch.minimum(t0, t1).amax(dim=-1).clamp(min=near)
    t_far = torch.maximum(t0, t1).amin(dim=-1)
    return t_near, t_far


@dataclass
class RenderResult:
    """What :func:`render_rays` returns.

    Attributes:
        rgb: ``[R, 3]`` composited colour, background included.
        opacity: ``[R]`` accumulated opacity ``1 - T_final``.
        depth: ``[R]`` expected distance ``sum w_k t_k``. 0 where nothing was hit.
        n_evaluated: samples at which the field was evaluated, after skipping and termination.
        n_candidates: samples inside the AABB before any skipping. Both are 0-d tensors from the sync-free march.
    """

    rgb: Tensor
    opacity: Tensor
    depth: Tensor
    n_evaluated: int | Tensor
    n_candidates: int | Tensor


class MarchCapacity:
    """The fixed sizes of a sync-free march, kept across frames. That is :func:`render_rays` with ``capacity``.

    Args:
        max_steps: steps marched per ray, whatever the ray. It is at least the longest chord of the AABB over
            ``step_size``; see :meth:`for_box`. So no ray is cut short.
        headroom, quantum: of the sample capacities. See :class:`~framegraph.renderers.capacity.Capacity`.

    Each batch of rays of a frame has its own :class:`~framegraph.renderers.capacity.Capacity`: the samples the
    field evaluates. A frame whose samples overflow it leaves the last of them unevaluated for that frame. In ray
    order, those are the rays of the last rows. They count as empty space. The next frames get room for them.
    """

    def __init__(self, max_steps: int, *, headroom: float = 1.5, quantum: int = 256):
        self.max_steps, self.headroom, self.quantum = int(max_steps), headroom, quantum
        self.samples: dict[int, Capacity] = {}

    @classmethod
    def for_box(cls, aabb, step_size: float, **kw) -> MarchCapacity:
        """For an AABB ``(xmin, ymin, zmin, xmax, ymax, zmax)`` and a step size. Python numbers: no read back."""
        diagonal = math.dist(aabb[:3], aabb[3:])
        return cls(math.ceil(diagonal / step_size * (1 + 1e-6)) + 1, **kw)

    def of(self, ray_batch: int) -> Capacity:
        if ray_batch not in self.samples:
            self.samples[ray_batch] = Capacity(self.headroom, self.quantum)
        return self.samples[ray_batch]

    @property
    def overflows(self) -> int:
        return sum(c.overflows for c in self.samples.values())


def _evaluate_selected(field_fn: FieldFn, pts: Tensor, dirs: Tensor, todo: Tensor, step_size: float
                       ) -> tuple[Tensor, Tensor, int]:
    """Optical thickness ``tau [R, S]`` and colour ``[R, S, 3]`` of the ``todo [R, S]`` samples at ``pts [R, S, 3]``.

    They are 0 elsewhere. It evaluates exactly those samples, by ``nonzero``: a host sync. It also returns their
    number."""
    sel = todo.nonzero(as_tuple=True)
    tau = torch.zeros(todo.shape, device=pts.device, dtype=pts.dtype)
    col = torch.zeros(todo.shape + (3,), device=pts.device, dtype=pts.dtype)
    if sel[0].numel():
        sigma_s, rgb_s = field_fn(pts[sel], dirs[sel[0]])
        tau = tau.index_put(sel, sigma_s.to(pts.dtype) * step_size)
        col = col.index_put(sel, rgb_s.to(pts.dtype))
    return tau, col, sel[0].numel()


def _evaluate_fixed(field_fn: FieldFn, pts: Tensor, dirs: Tensor, todo: Tensor, step_size: float,
                    capacity: Capacity) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_evaluate_selected` without a host sync.

    The ``todo`` samples are packed, in row-major order, into ``capacity`` slots. Slot ``s`` finds its sample by
    ``searchsorted`` in the running count. The field runs on all slots, and unused ones are dropped. Samples
    past the capacity are left out, as empty. Returns the count as a 0-d tensor."""
    R, S = todo.shape
    ends = torch.cumsum(todo.reshape(-1), 0)  # [R * S] running count of samples to evaluate
    count = ends[-1]
    cap = capacity.size(count, limit=R * S)
    sample = torch.searchsorted(ends, torch.arange(cap, device=pts.device), right=True)  # R * S past the count
    used = sample < R * S
    sample = sample.clamp(max=R * S - 1)
    sigma_s, rgb_s = field_fn(pts.reshape(-1, 3)[sample], dirs[sample // S])
    tau = torch.zeros(R * S, device=pts.device, dtype=pts.dtype).index_add(
        0, sample, torch.where(used, sigma_s.to(pts.dtype) * step_size, 0.0))
    col = torch.zeros(R * S, 3, device=pts.device, dtype=pts.dtype).index_add(
        0, sample, torch.where(used[:, None], rgb_s.to(pts.dtype), 0.0))
    return tau.reshape(R, S), col.reshape(R, S, 3), count


def render_rays(field_fn: FieldFn, origins: Tensor, dirs: Tensor, aabb: Tensor, step_size: float, *,
                occupancy: OccupancyGrid | None = None, background: Tensor | None = None,
                early_stop: float = EARLY_STOP, chunk_steps: int = 64, offsets: Tensor | None = None,
                near: float = 0.0, capacity: MarchCapacity | None = None, ray_batch: int = 0) -> RenderResult:
    """March and composite rays ``origins, dirs [R, 3]`` through ``field_fn`` inside ``aabb [6]``.

    Args:
        field_fn: ``(points [M, 3], dirs [M, 3]) -> (sigma [M], rgb [M, 3])``.
        step_size: fixed distance between samples, in world units.
        occupancy: skip samples in its unoccupied cells. None: evaluate every sample.
        background: ``[3]`` colour behind the field. None: black.
        early_stop: transmittance below which samples no longer count. 0 disables termination.
        chunk_steps: steps marched per round for all live rays.
        offsets: ``[R]`` sample offsets ``u`` in [0, 1). None: 0.5, the interval midpoints.
        near: minimum distance along each ray.
        capacity: None gives the readable march, sized by the data. It reads back the longest ray, whether rays
            are still live, and which samples to evaluate. Those are host syncs every chunk. A
            :class:`MarchCapacity`, kept across frames, gives the sync-free march. Every ray marches one chunk
            of ``capacity.max_steps`` steps; ``chunk_steps`` is ignored. Its samples are packed into a fixed
            capacity by :func:`_evaluate_fixed`. No ray leaves early. So the field is also evaluated behind
            where a ray terminates. Those samples get weight 0. The image is the same up to float rounding,
            unless the capacity overflows. Memory is about rays x ``max_steps`` x 16 floats.
            ``n_evaluated`` and ``n_candidates`` are then 0-d tensors, not read back.
        ray_batch: which batch of the frame's rays this is. It keys the capacities.

    Differentiable w.r.t. whatever ``field_fn`` depends on.
    """
    R = origins.shape[0]
    dev, dt = origins.device, origins.dtype
    t_near, t_far = ray_aabb(origins, dirs, aabb, near)
    n_steps = torch.ceil((t_far - t_near) / step_size).clamp(min=0)  # candidates per ray (upper bound)
    u = torch.full((R,), 0.5, device=dev, dtype=dt) if offsets is None else offsets
    if capacity is None:
        K = int(n_steps.max()) if R else 0
    else:
        K = chunk_steps = capacity.max_steps if R else 0
    optical = torch.zeros(R, device=dev, dtype=dt)  # optical depth so far: sum of sigma * delta; T = exp(-it)
    rgb = torch.zeros(R, 3, device=dev, dtype=dt)
    depth = torch.zeros(R, device=dev, dtype=dt)
    n_eval = n_cand = 0
    stop = -math.log(early_stop) if early_stop > 0 else math.inf  # T < early_stop  <=>  optical depth > stop
    for k0 in range(0, K, chunk_steps):
        live = optical.detach() <= stop
        if capacity is None and not bool(live.any()):
            break
        ks = torch.arange(k0, min(k0 + chunk_steps, K), device=dev, dtype=dt)
        t = t_near[:, None] + (ks[None, :] + u[:, None]) * step_size  # [R, C]
        valid = t < t_far[:, None]
        n_cand = n_cand + (int(valid.sum()) if capacity is None else valid.sum())
        todo = valid & live[:, None]
        pts = origins[:, None, :] + t[..., None] * dirs[:, None, :]
        if occupancy is not None:
            todo = todo & occupancy.is_occupied(pts.reshape(-1, 3)).reshape(todo.shape)
        if capacity is None:
            tau, col, n = _evaluate_selected(field_fn, pts, dirs, todo, step_size)
        else:
            tau, col, n = _evaluate_fixed(field_fn, pts, dirs, todo, step_size, capacity.of(ray_batch))
        n_eval = n_eval + n
        before = optical[:, None] + torch.cumsum(tau, dim=1) - tau  # optical depth in front of each sample
        counted = before.detach() <= stop  # a prefix of the ray's samples: T_k >= early_stop
        tau = torch.where(counted, tau, torch.zeros_like(tau))
        w = torch.exp(-before) * (1 - torch.exp(-tau))
        rgb = rgb + (w[..., None] * col).sum(dim=1)
        depth = depth + (w * t).sum(dim=1)
        optical = optical + tau.sum(dim=1)
    T_final = torch.exp(-optical)  # after the last counted sample (< early_stop if the ray terminated)
    opacity = 1 - T_final
    if background is not None:
        rgb = rgb + T_final[:, None] * background.to(dev, dt)
    return RenderResult(rgb, opacity, depth, n_eval, n_cand)
