"""Fused DiT elementwise ops (norm_modulate, gate_residual): Triton vs reference vs diffusers' sequence."""

import pytest
import torch
from helpers import DEVICE

from framegraph.kernels.modulation import gate_residual, norm_modulate


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def forward_and_grads(fn, inputs, backend, **kwargs):
    leaves = [t.clone().requires_grad_() if t is not None else None for t in inputs]
    out = fn(*leaves[:3], backend=backend, **kwargs) if fn is gate_residual else fn(
        *leaves[:3], weight=leaves[3], backend=backend, **kwargs
    )
    grad_out = randn(*out.shape, seed=9)
    present = [t for t in leaves if t is not None]
    return out, torch.autograd.grad((out * grad_out).sum(), present)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("per_token", [False, True])
def test_norm_modulate_triton_matches_reference(norm, with_weight, per_token):
    B, N, C = 2, 20, 48
    x = randn(B, N, C) * 3 + 1
    scale = randn(B, N if per_token else 1, C, seed=1)
    shift = randn(B, N if per_token else 1, C, seed=2)
    weight = randn(C, seed=3) if with_weight else None
    out1, grads1 = forward_and_grads(norm_modulate, (x, scale, shift, weight), "triton", norm=norm)
    out2, grads2 = forward_and_grads(norm_modulate, (x, scale, shift, weight), "torch", norm=norm)
    assert out1.shape == x.shape and out1.dtype == x.dtype
    torch.testing.assert_close(out1, out2, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads1, grads2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_norm_modulate_matches_diffusers_block_sequence():
    """SanaVideoTransformerBlock: norm1(x) * (1 + scale_msa) + shift_msa with a non-affine LayerNorm."""
    x, scale, shift = randn(2, 16, 32), randn(2, 1, 32, seed=1), randn(2, 1, 32, seed=2)
    expected = torch.nn.LayerNorm(32, elementwise_affine=False, eps=1e-6).to(DEVICE)(x) * (1 + scale) + shift
    for backend in ("triton", "torch"):
        torch.testing.assert_close(norm_modulate(x, scale, shift, eps=1e-6, backend=backend), expected,
                                   rtol=1e-5, atol=1e-5)


def test_norm_modulate_accepts_rows_without_batch_and_keeps_dtype():
    x, scale, shift = randn(24, 32, dtype=torch.bfloat16), randn(32, seed=1), randn(1, 32, seed=2)
    out = norm_modulate(x, scale, shift, norm="rms", backend="torch")
    assert out.shape == (24, 32) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("gate_shape", [(2, 1, 40), (2, 12, 40), (40,)])
def test_gate_residual_triton_matches_reference(gate_shape):
    x, y, gate = randn(2, 12, 40), randn(2, 12, 40, seed=1), randn(*gate_shape, seed=2)
    out1, grads1 = forward_and_grads(gate_residual, (x, y, gate), "triton")
    out2, grads2 = forward_and_grads(gate_residual, (x, y, gate), "torch")
    torch.testing.assert_close(out1, out2)
    torch.testing.assert_close(out1, x + gate * y)
    for a, b in zip(grads1, grads2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_custom_ops_pass_opcheck():
    x, scale, shift, weight = randn(2, 8, 32), randn(2, 1, 32, seed=1), randn(2, 1, 32, seed=2), randn(32, seed=3)
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.framegraph.norm_modulate.default, (x, scale, shift, weight, True, 1e-6),
                          test_utils=utils)
    torch.library.opcheck(torch.ops.framegraph.gate_residual.default, (x, randn(2, 8, 32, seed=4), scale),
                          test_utils=utils)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: norm_modulate(randn(2, 3, 4, 8), randn(8), randn(8)), "rank 4"),
        (lambda: norm_modulate(randn(2, 4, 8), randn(2, 4, 9), randn(8)), "scale has shape"),
        (lambda: norm_modulate(randn(2, 4, 8), randn(8), randn(8), norm="batch"), "norm='batch'"),
        (lambda: norm_modulate(randn(2, 4, 8), randn(8), randn(8), weight=randn(7)), "weight has shape"),
        (lambda: norm_modulate(randn(2, 4, 8).long(), randn(8), randn(8)), "int64"),
        (lambda: gate_residual(randn(2, 4, 8), randn(2, 5, 8), randn(8)), "y has shape"),
        (lambda: gate_residual(randn(2, 4, 8), randn(2, 4, 8), randn(3, 1, 8)), "gate has shape"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.gpu
@pytest.mark.gpu
def test_gpu_bf16_norm_modulate_and_gate_residual():
    x = randn(2, 4096, 2240, dtype=torch.bfloat16)
    scale, shift = randn(2, 1, 2240, seed=1), randn(2, 1, 2240, seed=2)
    out = norm_modulate(x, scale, shift, backend="triton")
    ref = norm_modulate(x, scale, shift, backend="torch")
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    y = gate_residual(x, out, scale, backend="triton")
    torch.testing.assert_close(y.float(), gate_residual(x, out, scale, backend="torch").float(), rtol=2e-2, atol=2e-2)
