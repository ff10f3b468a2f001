"""Rectified flow, or flow matching: the interpolation, the few-step Euler sampler and the training losses.

The convention is that of SD3, SANA and diffusers' ``FlowMatchEulerDiscreteScheduler``, with ``t = sigma``::

    x_t = (1 - t) * x0 + t * eps          t in [0, 1]; t = 0 is data, t = 1 pure noise, eps ~ N(0, I)
    v   = d x_t / d t = eps - x0           what a model predicts ("velocity")
    x0  = x_t - t * v                      the data estimate implied by a velocity (exact on straight paths)

Sampling integrates ``dx/dt = v(x, t)`` from ``t = 1`` down to ``t = 0``.
It takes Euler steps over a timestep schedule, which may be shifted.
One step is ``x0 = eps - v(eps, 1)``.

Everything here is pure torch and model-agnostic.
A *velocity function* is any callable ``fn(x_t, t, **cond) -> v``, with ``v`` shaped like ``x_t``.
``t`` is a tensor of shape ``[B]``, one time per sample.
Or it is ``[B, T]``, one time per frame of a video laid out ``[B, C, T, ...]``. See :func:`expand_time`.
``AvatarDiT`` is such a function.

Training pieces:

- :func:`flow_matching_loss`: conditional flow matching, ``|| v_theta(x_t, t) - (eps - x0) ||^2``.
- :func:`distill_loss`: consistency distillation, LCM-style, in the flow parameterisation.
  The student's data estimate at ``t`` is pulled towards a frozen *target* network's data estimate.
  That estimate is taken at the point one teacher ODE step closer to the data. See its docstring.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "shift_time", "timestep_schedule", "expand_time", "interpolate", "velocity_target", "predict_x0",
    "sample_euler", "host_schedule", "sample_timesteps", "flow_matching_loss", "distill_loss",
]

VelocityFn = Callable[..., torch.Tensor]


# ----------------------------------------------------------------------------- conventions


def shift_time(t: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3 and SANA time shift: ``shift * t / (1 + (shift - 1) * t)``.

    ``shift > 1`` spends more steps and training samples at high noise, which larger latents need.
    ``shift = 1`` is the identity. The ends ``0`` and ``1`` are fixed.
    """
    if shift <= 0:
        raise ValueError(f"shift_time: shift={shift}; expected a positive number")
    return shift * t / (1 + (shift - 1) * t)


def timestep_schedule(steps: int, shift: float = 1.0, device=None) -> torch.Tensor:
    """``float32 [steps + 1]`` times from 1 down to 0: ``shift_time(linspace(1, 0, steps + 1), shift)``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"timestep_schedule: steps={steps!r}; expected an int >= 1")
    t = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return shift_time(t, shift).to(device=device, dtype=torch.float32)


def expand_time(t: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    """Broadcast a time to ``x``'s shape.

    ``[B]`` becomes ``[B, 1, 1, ...]``.
    ``[B, T]`` becomes ``[B, 1, T, 1, ...]``: per-frame times of a video ``x [B, C, T, ...]``.
    A scalar stays a scalar tensor.
    """
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    if t.dim() == 0:
        return t
    if t.dim() == 1:
        if t.shape[0] != x.shape[0]:
            raise ValueError(f"expand_time: t has shape {tuple(t.shape)}; expected [B]=({x.shape[0]},) "
                             f"for x {tuple(x.shape)}")
        return t.reshape((-1,) + (1,) * (x.dim() - 1))
    if t.dim() == 2:
        if x.dim() < 3 or t.shape[0] != x.shape[0] or t.shape[1] != x.shape[2]:
            raise ValueError(f"expand_time: t has shape {tuple(t.shape)}; expected [B, T] matching x [B, C, T, ...]="
                             f"{tuple(x.shape)}")
        return t.reshape(t.shape[0], 1, t.shape[1], *(1,) * (x.dim() - 3))
    raise ValueError(f"expand_time: t has shape {tuple(t.shape)}; expected a scalar, [B] or [B, T]")


def interpolate(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
    """``x_t = (1 - t) x0 + t noise``."""
    t = expand_time(t, x0)
    return (1 - t) * x0 + t * noise


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The flow-matching regression target ``noise - x0``."""
    return noise - x0


def predict_x0(x_t: torch.Tensor, v: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
    """Data estimate ``x_t - t v``: the endpoint of a straight path through ``x_t`` with velocity ``v``."""
    return x_t - expand_time(t, x_t) * v


def _full_time(t: float, x: torch.Tensor, time_shape: tuple[int, ...] | None) -> torch.Tensor:
    """A scalar time, a Python number, as a tensor of ``time_shape``. The default shape is ``[B]``."""
    shape = time_shape if time_shape is not None else (x.shape[0],)
    return torch.full(shape, t, dtype=x.dtype, device=x.device)


def host_schedule(timesteps) -> list[float]:
    """A schedule as Python floats rounded to float32, the values the sampler's arithmetic uses.

    The schedule is a 1-D tensor or a sequence of numbers.
    The sampler keeps its schedule on the host.
    Reading a device tensor's values once per step would wait for the device inside every denoising step.
    That is a host sync.
    """
    if isinstance(timesteps, torch.Tensor):
        if timesteps.dim() != 1:
            raise ValueError(f"sample_euler: timesteps has shape {tuple(timesteps.shape)}; expected [steps + 1]")
        timesteps = timesteps.detach().cpu().tolist()  # once per call, before any step (callers pass lists)
    return [float(np.float32(v)) for v in timesteps]


# ----------------------------------------------------------------------------- sampling


def sample_euler(
    velocity_fn: VelocityFn,
    noise: torch.Tensor,
    *,
    steps: int = 4,
    shift: float = 1.0,
    timesteps: torch.Tensor | None = None,
    cond: Mapping | None = None,
    time_shape: tuple[int, ...] | None = None,
    renoise: bool = False,
    generator: torch.Generator | None = None,
    fresh: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Integrate the flow from noise at ``t = 1`` to data at ``t = 0`` with Euler steps.

    Args:
        velocity_fn: ``fn(x_t, t, **cond) -> v``, with ``t`` a tensor of ``time_shape``.
        noise: ``x_1``, of any shape ``[B, ...]``.
        steps: number of model evaluations. 1-4 for a distilled model, 20-50 for a teacher.
        shift: time shift of the schedule. See :func:`shift_time`.
        timesteps: explicit decreasing schedule ``[steps + 1]`` from 1 to 0. It overrides steps and shift.
            A tensor is read once and rounded to float32.
            A list of Python floats is used as given. :func:`host_schedule` makes one.
            The schedule stays on the host: no step reads a tensor back.
        cond: keyword arguments passed to ``velocity_fn`` on every call.
        time_shape: shape of the ``t`` tensor handed to ``velocity_fn``.
            The default is ``[B]``. Use ``[B, T]`` for per-frame times.
        renoise: consistency-model multistep sampling, as in LCM.
            Instead of the deterministic Euler step, it estimates ``x0 = x_t - t v``.
            Then it re-noises it to the next time with fresh noise from ``generator``.
            Both coincide for one step.
        fresh: with ``renoise``, the fresh noise of each re-noising step, in order, shaped like ``noise``, used
            instead of drawing it from ``generator``. A batch of sessions hands in what each one's generator drew.

    Returns:
        the sample at ``t = 0``, shaped like ``noise``.
    """
    if isinstance(timesteps, (list, tuple)):
        ts = [float(t) for t in timesteps]  # used as given (a compiled caller passes them: no numpy to trace)
    else:
        ts = host_schedule(_schedule_floats(steps, shift) if timesteps is None else timesteps)
    if len(ts) < 2:
        raise ValueError(f"sample_euler: timesteps has {len(ts)} value(s); expected [steps + 1] (>= 2 values)")
    cond = dict(cond or {})
    x = noise
    drawn = None if fresh is None else iter(fresh)
    for t, s in zip(ts[:-1], ts[1:]):
        v = velocity_fn(x, _full_time(t, x, time_shape), **cond)
        if renoise and s > 0:
            x0 = x - t * v
            eps = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype) if drawn is None \
                else next(drawn)
            x = (1 - s) * x0 + s * eps
        else:
            x = x + (s - t) * v  # float32 values: their difference is exact in a Python float, rounded as float32's
    return x


def _schedule_floats(steps: int, shift: float) -> list[float]:
    """:func:`timestep_schedule` computed on the host in float64. :func:`host_schedule` then rounds it to float32."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"timestep_schedule: steps={steps!r}; expected an int >= 1")
    if shift <= 0:
        raise ValueError(f"shift_time: shift={shift}; expected a positive number")
    ts = np.linspace(1.0, 0.0, steps + 1, dtype=np.float64)
    return (shift * ts / (1 + (shift - 1) * ts)).tolist()


# ----------------------------------------------------------------------------- training


def sample_timesteps(
    shape: tuple[int, ...],
    *,
    dist: str = "logit_normal",
    mean: float = 0.0,
    std: float = 1.0,
    shift: float = 1.0,
    repeat: int = 1,
    generator: torch.Generator | None = None,
    device=None,
) -> torch.Tensor:
    """Training times in ``(0, 1)``, then :func:`shift_time`.

    ``dist`` is ``"logit_normal"`` or ``"uniform"``.
    ``"logit_normal"`` is SD3's ``sigmoid(N(mean, std))``.
    ``repeat > 1`` repeats each value along the last dim, for one time per block of ``repeat`` frames.
    So ``shape=(B, T // repeat), repeat=block`` gives ``[B, T]``.
    """
    if dist == "logit_normal":
        t = torch.sigmoid(mean + std * torch.randn(shape, generator=generator, device=device))
    elif dist == "uniform":
        t = torch.rand(shape, generator=generator, device=device)
    else:
        raise ValueError(f"sample_timesteps: dist={dist!r}; expected 'logit_normal' or 'uniform'")
    t = shift_time(t, shift)
    return t.repeat_interleave(repeat, dim=-1) if repeat > 1 else t


def flow_matching_loss(
    model: VelocityFn,
    x0: torch.Tensor,
    cond: Mapping | None = None,
    *,
    t: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    time_shape: tuple[int, ...] | None = None,
    time_repeat: int = 1,
    dist: str = "logit_normal",
    shift: float = 1.0,
    weight: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Conditional flow matching: ``mean(weight * (model(x_t, t, **cond) - (noise - x0))^2)``.

    Args:
        model: velocity function ``fn(x_t, t, **cond)``.
        x0: clean data ``[B, ...]``. For video latents, ``[B, C, T, h, w]``.
        cond: keyword arguments for the model, its conditioning.
            For ``AvatarDiT`` also ``clean=x0``, to train with a clean past. That is teacher forcing.
        t: times, ``[B]`` or ``[B, T]``.
            By default they are drawn by :func:`sample_timesteps`.
            That draw uses ``time_shape``, ``time_repeat``, ``dist`` and ``shift``. ``time_shape`` defaults to ``[B]``.
        noise: ``eps`` shaped like x0. The default is ``randn``.
            A noise *coupled* to x0 trains on that coupling.
            The loss is then zero for the coupling's exact velocity field.
        weight: optional weights broadcastable to x0, such as a mouth-region mask or per-sample weights.

    Returns:
        the scalar loss.
        Its minimum over velocity fields is the conditional variance of ``noise - x0`` given ``x_t``.
        That is not zero unless the coupling is deterministic. So compare losses, and don't expect 0.
    """
    cond = dict(cond or {})
    if noise is None:
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    if t is None:
        t = sample_timesteps(time_shape or (x0.shape[0],), dist=dist, shift=shift, repeat=time_repeat,
                             generator=generator, device=x0.device).to(x0.dtype)
    x_t = interpolate(x0, noise, t)
    err = (model(x_t, t, **cond) - velocity_target(x0, noise)).pow(2)
    if weight is not None:
        err = err * weight
    return err.mean()


def distill_loss(
    student: VelocityFn,
    teacher: VelocityFn,
    x0: torch.Tensor,
    cond: Mapping | None = None,
    *,
    target: VelocityFn | None = None,
    intervals: int = 32,
    skip: int = 1,
    shift: float = 1.0,
    teacher_steps: int = 1,
    time_shape: tuple[int, ...] | None = None,
    time_repeat: int = 1,
    noise: torch.Tensor | None = None,
    huber_c: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Consistency distillation: Latent Consistency Models, written in the flow parameterisation.

    The consistency function of a velocity model is its data estimate, ``f(x, t) = x - t v(x, t)``.
    ``f(x, 0) = x`` holds by construction.
    That is LCM's boundary condition, with ``c_skip = 1, c_out = -t``.
    Take a grid ``tau_0 = 0 < tau_1 < ... < tau_N = 1``, with ``N = intervals``, shifted by ``shift``.
    Draw ``n`` uniformly in ``skip..N``. Let ``t = tau_n`` and ``s = tau_{n - skip}``::

        x_t    = (1 - t) x0 + t eps
        x_s    = x_t + teacher ODE solve from t to s     (``teacher_steps`` Euler steps; no grad)
        loss   = d( f_student(x_t, t),  stopgrad f_target(x_s, s) )

    ``d`` is the squared error.
    With ``huber_c`` it is LCM's pseudo-Huber ``sqrt(e^2 + c^2) - c`` per element.
    ``target`` is the EMA of the student, as in LCM.
    ``None`` uses the student itself under ``no_grad``.
    That is the "stop-gradient" variant of improved consistency training.
    A student trained to zero loss maps any ``x_t`` to the teacher's ODE endpoint.
    So it samples in 1-4 steps with :func:`sample_euler`. ``renoise=True`` is LCM's multistep sampler.
    Classifier-free guidance belongs inside ``teacher``.
    That is a wrapper that mixes conditional and unconditional velocities.

    Args:
        student, teacher, target: velocity functions ``fn(x_t, t, **cond)``.
        x0: data ``[B, ...]``.
        cond: model keyword arguments. Use ``clean=x0`` for teacher forcing.
        time_shape / time_repeat: shape of the drawn grid indices. The default is ``[B]``.
            Use ``(B, T // k)`` with ``time_repeat=k`` for one time per block of ``k`` frames.

    Returns:
        the scalar loss. It is exactly zero when student, target and teacher are one field with straight paths.
    """
    if intervals < 1 or not 1 <= skip <= intervals:
        raise ValueError(f"distill_loss: intervals={intervals}, skip={skip}; expected 1 <= skip <= intervals")
    cond = dict(cond or {})
    shape = time_shape or (x0.shape[0],)
    grid = shift_time(torch.linspace(0.0, 1.0, intervals + 1, dtype=torch.float64), shift).to(x0.device, x0.dtype)
    n = torch.randint(skip, intervals + 1, shape, generator=generator, device=grid.device)
    if time_repeat > 1:
        n = n.repeat_interleave(time_repeat, dim=-1)
    t, s = grid[n], grid[n - skip]
    if noise is None:
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    x_t = interpolate(x0, noise, t)
    with torch.no_grad():
        x_s = x_t
        for i in range(teacher_steps):
            a = t + (s - t) * (i / teacher_steps)
            b = t + (s - t) * ((i + 1) / teacher_steps)
            x_s = x_s + expand_time(b - a, x_s) * teacher(x_s, a, **cond)
        target_fn = target if target is not None else student
        goal = predict_x0(x_s, target_fn(x_s, s, **cond), s)
    pred = predict_x0(x_t, student(x_t, t, **cond), t)
    err = pred - goal
    if huber_c is None:
        return err.pow(2).mean()
    return (torch.sqrt(err.pow(2) + huber_c**2) - huber_c).mean()
