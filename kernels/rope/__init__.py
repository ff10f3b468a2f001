"""Rotary position embedding with diffusers' Sana-Video / Wan convention of interleaved channel pairs.

``apply_rope(x, cos, sin)`` rotates pairs ``(x[2i], x[2i+1])``. The angle's cosine is ``cos[..., 2i]``. Its
sine is ``sin[..., 2i+1]``. That is what diffusers' ``apply_rotary_emb`` inside ``SanaLinearAttnProcessor3_0``
computes with the tables of ``WanRotaryPosEmbed``. There each angle is repeated twice, with
``repeat_interleave_real=True``. It is *not* the rotate-half convention of GPT-NeoX / Llama. The Triton path
is the custom op ``torch.ops.framegraph.apply_rope``. Its gradient is w.r.t. ``x`` only. Rope tables are
constants.
"""
from __future__ import annotations

import torch

from ..backend import Backend, check_broadcastable, check_float_dtype, check_same_device, resolve_backend
from . import reference

__all__ = ["apply_rope"]

OP = "apply_rope"


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: Backend = "auto") -> torch.Tensor:
    """Rotate interleaved channel pairs of ``x``. The maths is fp32. The result is in ``x.dtype``.

    Args:
        x: ``[..., D]`` of rank 2 to 4, ``D`` even. Examples are ``[B, H, N, D]`` and diffusers'
            ``[B, N, H, D]``.
        cos, sin: broadcastable to ``x``, such as ``[1, 1, N, D]`` or ``[N, D]``.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. ``"auto"`` is Triton on CUDA, torch elsewhere.
    """
    check_float_dtype(OP, "x", x)
    if not 2 <= x.dim() <= 4:
        raise ValueError(f"{OP}: x has shape {tuple(x.shape)} (rank {x.dim()}); expected rank 2 to 4 [..., N, D]")
    if x.shape[-1] % 2:
        raise ValueError(f"{OP}: x has D={x.shape[-1]} channels; expected an even D (channels rotate in pairs)")
    for name, t in (("cos", cos), ("sin", sin)):
        check_broadcastable(OP, name, t, x.shape, "x.shape")
    check_same_device(OP, x=x, cos=cos, sin=sin)
    if resolve_backend(backend, x, op=OP) == "torch":
        return reference.apply_rope(x, cos, sin)
    return torch.ops.framegraph.apply_rope(x, cos, sin, False)


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


@torch.library.custom_op("framegraph::apply_rope", mutates_args=())
def _rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, transpose: bool) -> torch.Tensor:
    from . import triton as kernels

    return kernels.rope(_as_4d(x), _as_4d(cos), _as_4d(sin), transpose).reshape(x.shape)


@_rope_op.register_fake
def _(x, cos, sin, transpose):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    _, cos, sin, transpose = inputs
    ctx.save_for_backward(cos, sin)
    ctx.transpose = transpose


def _backward(ctx, grad):
    cos, sin = ctx.saved_tensors
    return _rope_op(grad, cos, sin, not ctx.transpose), None, None, None


_rope_op.register_autograd(_backward, setup_context=_setup_context)
