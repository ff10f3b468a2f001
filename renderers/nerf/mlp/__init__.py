"""Small bias-free MLPs. :func:`mlp` dispatches to the fused Triton kernel on CUDA, or to the torch reference.

The Triton path is the custom op ``torch.ops.framegraph.nerf_fused_mlp``. Its forward is fused in one kernel.
Its backward is in torch. It recomputes the hidden activations, then does the usual matrix products. That is
correct for training, and fast where it matters most, in rendering.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from framegraph.kernels.backend import Backend, resolve_backend

from .reference import OUTPUT_ACTIVATIONS, init_weights, mlp_forward

__all__ = ["mlp", "mlp_forward", "init_weights", "OUTPUT_ACTIVATIONS"]

OP = "mlp"


def mlp(x: Tensor, weights: Sequence[Tensor], output_activation: str = "none", *, backend: Backend = "auto") -> Tensor:
    """``x [N, in]`` through bias-free ``weights`` → ``[N, out]``. Weights are ``[in, H], [H, H]*, [H, out]``.

    Hidden layers use ReLU. ``output_activation`` is ``"none"`` or ``"sigmoid"``. ``backend`` is ``"auto"``,
    ``"triton"`` or ``"torch"``. Auto is Triton on CUDA, torch elsewhere. Differentiable w.r.t. ``x`` and the
    weights on both backends.
    """
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise ValueError(f"{OP}: output_activation={output_activation!r}; expected one of {OUTPUT_ACTIVATIONS}")
    if len(weights) < 2:
        raise ValueError(f"{OP}: need at least 2 weight matrices (one hidden layer), got {len(weights)}")
    if x.dim() != 2 or x.shape[1] != weights[0].shape[0]:
        raise ValueError(f"{OP}: x has shape {list(x.shape)}; expected [N, {weights[0].shape[0]}]")
    if resolve_backend(backend, x, *weights, op=OP) == "torch":
        return mlp_forward(x, weights, output_activation)
    H = weights[0].shape[1]
    for i, w in enumerate(weights[1:-1], 1):
        if w.shape != (H, H):
            raise ValueError(f"{OP}: weights[{i}] has shape {list(w.shape)}; expected [{H}, {H}]")
    if weights[-1].shape[0] != H:
        raise ValueError(f"{OP}: last weight has shape {list(weights[-1].shape)}; expected [{H}, out]")
    w_mid = (torch.stack(list(weights[1:-1])) if len(weights) > 2
             else weights[0].new_zeros((0, H, H)))
    return _fused_mlp_op(x.float().contiguous(), weights[0].contiguous(), w_mid.contiguous(),
                         weights[-1].contiguous(), output_activation == "sigmoid")


@torch.library.custom_op("framegraph::nerf_fused_mlp", mutates_args=())
def _fused_mlp_op(x: Tensor, w_in: Tensor, w_mid: Tensor, w_out: Tensor, sigmoid: bool) -> Tensor:
    from . import triton as kernels

    return kernels.fused_mlp_fwd(x, w_in, w_mid, w_out, sigmoid)


@_fused_mlp_op.register_fake
def _(x, w_in, w_mid, w_out, sigmoid):
    return x.new_empty((x.shape[0], w_out.shape[1]))


def _setup_context(ctx, inputs, output):
    x, w_in, w_mid, w_out, sigmoid = inputs
    ctx.save_for_backward(x, w_in, w_mid, w_out, output)
    ctx.sigmoid = sigmoid


def _backward(ctx, grad_y):
    x, w_in, w_mid, w_out, y = ctx.saved_tensors
    # recompute the hidden activations (pre-ReLU masks included)
    hs = [torch.relu(x @ w_in)]
    for i in range(w_mid.shape[0]):
        hs.append(torch.relu(hs[-1] @ w_mid[i]))
    g = grad_y * y * (1 - y) if ctx.sigmoid else grad_y
    grad_w_out = hs[-1].t() @ g
    g = (g @ w_out.t()) * (hs[-1] > 0)
    grad_w_mid = torch.zeros_like(w_mid)
    for i in reversed(range(w_mid.shape[0])):
        grad_w_mid[i] = hs[i].t() @ g
        g = (g @ w_mid[i].t()) * (hs[i] > 0)
    grad_w_in = x.t() @ g
    grad_x = g @ w_in.t()
    return grad_x, grad_w_in, grad_w_mid, grad_w_out, None


_fused_mlp_op.register_autograd(_backward, setup_context=_setup_context)
