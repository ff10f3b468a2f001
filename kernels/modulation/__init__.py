"""Fused elementwise ops of a DiT block: adaLN modulation and gated residual.

``norm_modulate(x, scale, shift)`` is ``norm(x) * (1 + scale) + shift`` in one pass. The norm is LayerNorm
without affine, or RMSNorm. A per-channel ``weight`` is optional. ``gate_residual(x, y, gate)`` is
``x + gate * y``. Both compute in fp32 and return ``x.dtype``. The Triton paths are the custom ops
``torch.ops.framegraph.norm_modulate`` and ``gate_residual``. They have fake implementations and backwards.
"""
from __future__ import annotations

import torch

from ..backend import Backend, check_broadcastable, check_float_dtype, check_same_device, resolve_backend
from . import reference

__all__ = ["norm_modulate", "gate_residual"]

NORMS = ("layer", "rms")


def norm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    *,
    norm: str = "layer",
    eps: float = 1e-6,
    weight: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Normalise ``x`` over channels, then modulate: ``norm(x) * weight * (1 + scale) + shift``.

    Args:
        x: ``[B, N, C]`` or ``[N, C]`` activations.
        scale, shift: broadcastable to ``x``. Typically ``[B, 1, C]``, per sample, or ``[B, N, C]``.
        norm: ``"layer"`` or ``"rms"``. ``"layer"`` divides ``x - mean`` by ``sqrt(var + eps)``.
            ``"rms"`` divides ``x`` by ``sqrt(mean(x^2) + eps)``.
        eps: added to the variance or mean square.
        weight: optional ``[C]`` per-channel gain applied after normalising. ``None`` means no affine,
            as in Sana's ``norm1`` and ``norm2``.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. ``"auto"`` is Triton on CUDA, torch elsewhere.

    Returns:
        ``[B, N, C]``, the shape of x, in ``x.dtype``.
    """
    op = "norm_modulate"
    _check_rows(op, x=x)
    if norm not in NORMS:
        raise ValueError(f"{op}: norm={norm!r}; expected one of {NORMS}")
    for name, t in (("scale", scale), ("shift", shift)):
        check_float_dtype(op, name, t)
        check_broadcastable(op, name, t, x.shape, "x.shape")
    if weight is not None:
        check_float_dtype(op, "weight", weight)
        if tuple(weight.shape) != (x.shape[-1],):
            raise ValueError(f"{op}: weight has shape {tuple(weight.shape)}; expected [C]=({x.shape[-1]},)")
    check_same_device(op, x=x, scale=scale, shift=shift, weight=weight)
    if resolve_backend(backend, x, op=op) == "torch":
        return reference.norm_modulate(x, scale, shift, norm=norm, eps=eps, weight=weight)
    return torch.ops.framegraph.norm_modulate(x, scale, shift, weight, norm == "rms", float(eps))


def gate_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, *, backend: Backend = "auto") -> torch.Tensor:
    """Gated residual ``x + gate * y``.

    Args:
        x: ``[B, N, C]`` or ``[N, C]`` residual stream. The result has its dtype.
        y: the branch output, the same shape as x.
        gate: broadcastable to ``x``, typically ``[B, 1, C]`` or ``[B, N, C]``.
    """
    op = "gate_residual"
    _check_rows(op, x=x, y=y)
    if y.shape != x.shape:
        raise ValueError(f"{op}: y has shape {tuple(y.shape)}; expected x's shape {tuple(x.shape)}")
    check_float_dtype(op, "gate", gate)
    check_broadcastable(op, "gate", gate, x.shape, "x.shape")
    check_same_device(op, x=x, y=y, gate=gate)
    if resolve_backend(backend, x, y, op=op) == "torch":
        return reference.gate_residual(x, y, gate)
    return torch.ops.framegraph.gate_residual(x, y, gate)


def _check_rows(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        check_float_dtype(op, name, t)
        if t.dim() not in (2, 3):
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} (rank {t.dim()}); expected [B, N, C] or [N, C]")


def _as_bnc(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """View ``t`` as ``[B, N, C]`` without copying, through zero strides. ``t`` broadcasts to ``shape``."""
    t = t.expand(shape)
    return t.unsqueeze(0) if t.dim() == 2 else t


# ----------------------------------------------------------------------------- custom ops: the Triton path


@torch.library.custom_op("framegraph::norm_modulate", mutates_args=())
def _norm_modulate_op(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None, rms: bool, eps: float
) -> torch.Tensor:
    from . import triton as kernels

    shape = x.shape
    y = kernels.norm_modulate(_as_bnc(x, shape), _as_bnc(scale, shape), _as_bnc(shift, shape), weight, rms, eps)
    return y.reshape(shape)


@_norm_modulate_op.register_fake
def _(x, scale, shift, weight, rms, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("framegraph::norm_modulate_backward", mutates_args=())
def _norm_modulate_backward_op(
    dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor | None, rms: bool, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from . import triton as kernels

    shape = x.shape
    dx, d_scale, d_weight = kernels.norm_modulate_backward(
        _as_bnc(dy, shape), _as_bnc(x, shape), _as_bnc(scale, shape), weight, rms, eps
    )
    d_weight = d_weight.reshape(shape) if weight is not None else x.new_empty(0, dtype=torch.float32)
    return dx.reshape(shape), d_scale.reshape(shape), d_weight


@_norm_modulate_backward_op.register_fake
def _(dy, x, scale, weight, rms, eps):
    d_weight = torch.empty_like(x, dtype=torch.float32) if weight is not None else x.new_empty(0, dtype=torch.float32)
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.float32), d_weight


def _norm_modulate_setup(ctx, inputs, output):
    x, scale, shift, weight, rms, eps = inputs
    ctx.save_for_backward(x, scale, weight)
    ctx.shift_shape, ctx.shift_dtype = shift.shape, shift.dtype
    ctx.rms, ctx.eps = rms, eps


def _norm_modulate_backward(ctx, dy):
    x, scale, weight = ctx.saved_tensors
    dx, d_scale, d_weight = _norm_modulate_backward_op(dy, x, scale, weight, ctx.rms, ctx.eps)
    d_scale = d_scale.sum_to_size(scale.shape).to(scale.dtype)
    d_shift = dy.float().sum_to_size(ctx.shift_shape).to(ctx.shift_dtype)
    if weight is not None:
        d_weight = d_weight.reshape(-1, x.shape[-1]).sum(dim=0).to(weight.dtype)
    else:
        d_weight = None
    return dx, d_scale, d_shift, d_weight, None, None


_norm_modulate_op.register_autograd(_norm_modulate_backward, setup_context=_norm_modulate_setup)


@torch.library.custom_op("framegraph::gate_residual", mutates_args=())
def _gate_residual_op(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    from . import triton as kernels

    shape = x.shape
    return kernels.gate_residual(_as_bnc(x, shape), _as_bnc(y, shape), _as_bnc(gate, shape)).reshape(shape)


@_gate_residual_op.register_fake
def _(x, y, gate):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("framegraph::gate_residual_backward", mutates_args=())
def _gate_residual_backward_op(
    d_out: torch.Tensor, y: torch.Tensor, gate: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from . import triton as kernels

    shape = y.shape
    dy, d_gate = kernels.gate_residual_backward(_as_bnc(d_out, shape), _as_bnc(y, shape), _as_bnc(gate, shape))
    return dy.reshape(shape), d_gate.reshape(shape)


@_gate_residual_backward_op.register_fake
def _(d_out, y, gate):
    return torch.empty_like(y), torch.empty_like(y, dtype=torch.float32)


def _gate_residual_setup(ctx, inputs, output):
    x, y, gate = inputs
    ctx.save_for_backward(y, gate)
    ctx.x_dtype = x.dtype


def _gate_residual_backward(ctx, d_out):
    y, gate = ctx.saved_tensors
    dy, d_gate = _gate_residual_backward_op(d_out, y, gate)
    return d_out.to(ctx.x_dtype), dy, d_gate.sum_to_size(gate.shape).to(gate.dtype)


_gate_residual_op.register_autograd(_gate_residual_backward, setup_context=_gate_residual_setup)
