"""adaLN modulation and gated residual of a DiT block in pure torch. The readable twin of ``triton.py``.

This is the unfused sequence diffusers' ``SanaVideoTransformerBlock`` runs. First the norm, then
``* (1 + scale) + shift``. Later ``x + gate * y``. It is written in fp32 and rounded once to the input dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def norm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    norm: str = "layer",
    eps: float = 1e-6,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift`` over the last dim of ``x [..., C]``. The result is in ``x.dtype``."""
    x32 = x.float()
    if norm == "layer":
        # (x - mean) / sqrt(var + eps), no affine; int(): a constant for the ONNX tracer, whose other axes may vary
        normed = F.layer_norm(x32, (int(x.shape[-1]),), eps=eps)
    else:  # "rms"
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        normed = normed * weight.float()
    return (normed * (1 + scale.float()) + shift.float()).to(x.dtype)


def gate_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x + gate * y``. The result is in ``x.dtype``."""
    return (x.float() + gate.float() * y.float()).to(x.dtype)
