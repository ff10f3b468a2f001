"""Fully fused small MLP in Triton: one program evaluates the whole network for ``BLOCK`` points.

The input block ``[BLOCK, IN]`` is loaded once. Each layer is a ``tl.dot`` against a weight matrix loaded whole:
``[IN, H]``, ``[H, H]`` or ``[H, OUT]``. They are a few KB, kept in registers or shared memory. The activations
never leave the chip until the output store. Widths are padded with zero rows and columns to powers of two
``>= 16``, ``tl.dot``'s minimum. That changes nothing in the result.

The maths is that of ``reference.mlp_forward``. It runs in fp32 with ``input_precision="ieee"``. So the two
agree to float rounding. TF32 would be faster on GPU but not comparable bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 64  # points per program
# 8 warps: the colour MLP fits in registers without spilling on sm_89, sm_90 and sm_120.
# docs/renderers.md says how this was chosen.
WARPS = 8


@triton.jit
def _fused_mlp_kernel(x_ptr, w_in_ptr, w_mid_ptr, w_out_ptr, y_ptr, N, IN, OUT,
                      IN_P: tl.constexpr, H: tl.constexpr, OUT_P: tl.constexpr, N_MID: tl.constexpr,
                      SIGMOID: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rmask = rows < N
    ci = tl.arange(0, IN_P)
    ch = tl.arange(0, H)
    co = tl.arange(0, OUT_P)
    x = tl.load(x_ptr + rows[:, None] * IN + ci[None, :], mask=rmask[:, None] & (ci[None, :] < IN), other=0.0)
    w_in = tl.load(w_in_ptr + ci[:, None] * H + ch[None, :], mask=ci[:, None] < IN, other=0.0)
    h = tl.maximum(tl.dot(x, w_in, input_precision="ieee"), 0.0)
    for i in tl.static_range(N_MID):
        w = tl.load(w_mid_ptr + i * H * H + ch[:, None] * H + ch[None, :])
        h = tl.maximum(tl.dot(h, w, input_precision="ieee"), 0.0)
    w_out = tl.load(w_out_ptr + ch[:, None] * OUT + co[None, :], mask=co[None, :] < OUT, other=0.0)
    y = tl.dot(h, w_out, input_precision="ieee")
    if SIGMOID:
        y = tl.sigmoid(y)
    tl.store(y_ptr + rows[:, None] * OUT + co[None, :], y, mask=rmask[:, None] & (co[None, :] < OUT))


def fused_mlp_fwd(x: Tensor, w_in: Tensor, w_mid: Tensor, w_out: Tensor, sigmoid: bool) -> Tensor:
    """``x [N, IN]``, ``w_in [IN, H]``, ``w_mid [n_mid, H, H]``, ``w_out [H, OUT]`` → ``[N, OUT]``. n_mid may be 0.

    All are float32 and contiguous. ``H`` is a power of two >= 16.
    """
    N, IN = x.shape
    H, OUT = w_out.shape
    if H < 16 or H & (H - 1):
        raise ValueError(f"fused_mlp: hidden width {H} must be a power of two >= 16")
    y = torch.empty((N, OUT), device=x.device, dtype=torch.float32)
    if N:
        w_mid_arg = w_mid if w_mid.numel() else w_out  # never read when N_MID == 0
        _fused_mlp_kernel[(triton.cdiv(N, BLOCK),)](
            x, w_in, w_mid_arg, w_out, y, N, IN, OUT,
            IN_P=max(16, triton.next_power_of_2(IN)), H=H, OUT_P=max(16, triton.next_power_of_2(OUT)),
            N_MID=w_mid.shape[0], SIGMOID=sigmoid, BLOCK=BLOCK, num_warps=WARPS,
        )
    return y
