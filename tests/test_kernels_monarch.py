"""Monarch attention: exactness on Monarch-structured softmax, Triton vs reference, causality, errors.

Without CUDA the Triton kernels run on CPU through Triton's interpreter; TRITON_INTERPRET must be set
before framegraph's kernel modules are imported (they are imported lazily, on first use).
"""
import math
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    # Triton's interpreter: read when triton (and each framegraph kernel module) is first imported.
    os.environ["TRITON_INTERPRET"] = "1"
    _standard = sys.modules.get("triton.language.standard")
    if _standard is not None and any(type(f).__name__ == "JITFunction" for f in vars(_standard).values()):
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 was set (by an earlier test module); run the kernel "
            "tests in their own process or set TRITON_INTERPRET=1 in conftest.py",
            allow_module_level=True,
        )

from framegraph.kernels.monarch_attention import (  # noqa: E402
    monarch_attention,
    monarch_factors,
    monarch_matrix,
    softmax_attention,
)
from framegraph.kernels.monarch_attention.reference import token_causal_mask  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu


def make_inputs(grid, B=1, H=2, D=16, Dv=16, dtype=torch.float32, seed=0, sharpness=1.5):
    g = torch.Generator().manual_seed(seed)
    N = math.prod(grid)
    q, k = (sharpness * torch.randn(B, H, N, D, generator=g) for _ in range(2))
    v = torch.randn(B, H, N, Dv, generator=g)
    return tuple(t.to(DEVICE, dtype) for t in (q, k, v))


def monarch_structured_inputs(grid, B=1, H=2, D=32, Dv=16, seed=0):
    """q, k whose scores split as ``a[l, j, k] + b[k, j, i]`` (query (l, j), key (k, i)), so that
    ``softmax(q k^T)`` factorises as ``L[j, k, l] R[k, j, i]``: half the channels pair the query with the
    key's row only, the other half the query's column with the key's column."""
    g = torch.Generator().manual_seed(seed)
    frames, height, width = grid
    M, b, half = frames * height, width, D // 2
    gain = D ** 0.25  # undo the 1 / sqrt(D) score scale, so the scores are O(1)
    u, r = torch.randn(B, H, M, b, half, generator=g), torch.randn(B, H, M, b, half, generator=g)
    w, p = torch.randn(B, H, 1, b, half, generator=g), torch.randn(B, H, M, 1, half, generator=g)
    q = torch.cat([u, w.expand(B, H, M, b, half)], dim=-1).reshape(B, H, M * b, D) * gain
    k = torch.cat([p.expand(B, H, M, b, half), r], dim=-1).reshape(B, H, M * b, D) * gain
    v = torch.randn(B, H, M * b, Dv, generator=g)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def dense_softmax(q, k, grid=None, block_causal=False):
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if block_causal:
        scores = scores.masked_fill(~token_causal_mask(grid, q.device), float("-inf"))
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("block_causal", [False, True])
@pytest.mark.parametrize("num_iters", [1, 3])
def test_exact_when_softmax_is_monarch_structured(block_causal, num_iters):
    grid = (3, 2, 8)
    q, k, v = monarch_structured_inputs(grid)
    factors = monarch_factors(q, k, grid, num_iters=num_iters, block_causal=block_causal)
    torch.testing.assert_close(monarch_matrix(factors), dense_softmax(q, k, grid, block_causal), rtol=1e-5, atol=1e-6)
    out = monarch_attention(q, k, v, grid=grid, num_iters=num_iters, block_causal=block_causal, backend="torch")
    expected = softmax_attention(q, k, v, grid, block_causal)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_triton_exact_when_softmax_is_monarch_structured():
    grid = (2, 2, 16)
    q, k, v = monarch_structured_inputs(grid, H=1)
    out = monarch_attention(q, k, v, grid=grid, num_iters=1, backend="triton")
    torch.testing.assert_close(out, softmax_attention(q, k, v), rtol=1e-5, atol=1e-5)


def test_monarch_matrix_is_a_row_stochastic_product_of_the_factors():
    grid = (2, 3, 8)
    q, k, v = make_inputs(grid)
    factors = monarch_factors(q, k, grid, num_iters=2)
    assert factors.L.shape == (1, 2, 8, 6, 6) and factors.R.shape == (1, 2, 6, 8, 8)
    dense = monarch_matrix(factors)
    assert dense.min() >= 0
    torch.testing.assert_close(dense.sum(-1), torch.ones(1, 2, 48, device=DEVICE), rtol=1e-5, atol=1e-6)
    out = monarch_attention(q, k, v, grid=grid, num_iters=2, backend="torch")
    torch.testing.assert_close(out, dense @ v, rtol=1e-5, atol=1e-5)


def test_alternating_updates_never_decrease_the_fitting_objective():
    """Each closed-form update maximises sum_rows <A, S> + entropy(A) over one factor: a monotone ascent."""
    grid = (2, 4, 8)
    q, k, _ = make_inputs(grid, sharpness=2.0)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    objective = []
    for num_iters in (1, 2, 3, 4):
        A = monarch_matrix(monarch_factors(q, k, grid, num_iters=num_iters))
        objective.append(((A * scores).sum() - torch.special.xlogy(A, A).sum()).item())
    assert all(b >= a - 1e-4 for a, b in zip(objective, objective[1:])), objective
    exact = dense_softmax(q, k)
    optimum = ((exact * scores).sum() - torch.special.xlogy(exact, exact).sum()).item()
    assert objective[-1] <= optimum + 1e-3


@pytest.mark.parametrize(
    "grid, D, Dv, num_iters, block_causal",
    [
        ((2, 4, 16), 16, 16, 1, False),
        ((3, 2, 20), 24, 20, 2, True),  # width and head dims not powers of two
        ((2, 3, 16), 32, 16, 3, True),
    ],
)
def test_triton_matches_reference(grid, D, Dv, num_iters, block_causal):
    q, k, v = make_inputs(grid, D=D, Dv=Dv)
    kwargs = dict(grid=grid, num_iters=num_iters, block_causal=block_causal)
    out = monarch_attention(q, k, v, backend="triton", **kwargs)
    expected = monarch_attention(q, k, v, backend="torch", **kwargs)
    assert out.shape == (1, 2, math.prod(grid), Dv) and out.dtype == q.dtype
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_triton_accepts_strided_inputs_and_backpropagates_through_the_reference():
    grid = (2, 2, 16)
    q, k, v = make_inputs(grid, H=1)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, N, H, D] memory, as diffusers' layout
    grads = {}
    for backend in ("triton", "torch"):
        leaves = [t.clone().requires_grad_() for t in (q_strided, k, v)]
        out = monarch_attention(*leaves, grid=grid, num_iters=2, block_causal=True, backend=backend)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        grads[backend] = (out, torch.autograd.grad((out * weights).sum(), leaves))
    (o1, g1), (o2, g2) = grads["triton"], grads["torch"]
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_block_causal_never_lets_a_token_see_future_frames(backend):
    grid = (3, 2, 16)
    q, k, v = make_inputs(grid, H=1)
    per_frame = 2 * 16
    out = monarch_attention(q, k, v, grid=grid, num_iters=2, block_causal=True, backend=backend)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 2 * per_frame:] += 3.0 * torch.randn_like(k2[:, :, 2 * per_frame:])  # change the last frame only
    v2[:, :, 2 * per_frame:] += 1.0
    out2 = monarch_attention(q, k2, v2, grid=grid, num_iters=2, block_causal=True, backend=backend)
    torch.testing.assert_close(out2[:, :, : 2 * per_frame], out[:, :, : 2 * per_frame], rtol=0, atol=0)
    assert (out2[:, :, 2 * per_frame:] - out[:, :, 2 * per_frame:]).abs().max() > 1e-3

    if backend == "torch":  # and the fitted matrix is zero above the frame-causal mask
        dense = monarch_matrix(monarch_factors(q, k, grid, num_iters=2, block_causal=True))
        assert dense.masked_select(~token_causal_mask(grid, q.device)).abs().max() == 0


def test_low_precision_inputs_accumulate_in_fp32():
    grid = (2, 2, 8)
    q, k, v = make_inputs(grid)
    expected = monarch_attention(q, k, v, grid=grid, backend="torch")
    out = monarch_attention(*(t.bfloat16() for t in (q, k, v)), grid=grid, backend="torch")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=3e-2, atol=3e-2)


def test_custom_op_registration_passes_opcheck():
    grid = (2, 1, 16)
    q, k, v = make_inputs(grid, H=1)
    args = (q.requires_grad_(), k, v, *grid, 1, True)
    torch.library.opcheck(
        torch.ops.framegraph.monarch_attention.default, args,
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )


def test_traces_under_torch_compile():
    grid = (2, 1, 16)
    q, k, v = make_inputs(grid, H=1)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(q, k, v):
        return monarch_attention(q, k, v, grid=grid, num_iters=1, backend="triton")

    torch.testing.assert_close(f(q, k, v), monarch_attention(q, k, v, grid=grid, backend="torch"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(grid=(2, 4, 7)), r"grid=\(2, 4, 7\) has 56 tokens; q has N=64"),
        (dict(grid=(2, 32)), "expected \\(frames, height, width\\)"),
        (dict(grid=(2, 0, 32)), "three positive ints"),
        (dict(q=torch.randn(2, 64, 32)), "rank 3"),
        (dict(k=torch.randn(2, 3, 64, 32)), "k has 3 heads .* q has 2 heads"),
        (dict(v=torch.randn(2, 3, 64, 16)), "v has 3 heads"),
        (dict(k=torch.randn(2, 2, 32, 32)), "k has N=32 tokens"),
        (dict(k=torch.randn(2, 2, 64, 16)), "k has head dim 16"),
        (dict(q=torch.randn(2, 2, 64, 32, dtype=torch.float64)), "float64"),
        (dict(num_iters=0), "num_iters=0"),
        (dict(block_causal=1), "block_causal=1"),
        (dict(backend="cuda"), "backend='cuda'"),
    ],
)
def test_bad_arguments_raise_clear_errors(change, message):
    q, k, v = make_inputs((2, 4, 8), B=2, D=32)
    kwargs = dict(q=q, k=k, v=v, grid=(2, 4, 8), num_iters=1, block_causal=False, backend="torch")
    kwargs.update({key: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for key, t in change.items()})
    with pytest.raises((ValueError, TypeError), match=message):
        monarch_attention(kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v"), **kwargs)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_half_precision_matches_fp32_reference(dtype):
    grid = (4, 16, 32)
    q, k, v = make_inputs(grid, B=2, H=4, D=128, Dv=128, sharpness=1.0)
    expected = monarch_attention(q, k, v, grid=grid, num_iters=2, block_causal=True, backend="torch")
    out = monarch_attention(*(t.to(dtype) for t in (q, k, v)), grid=grid, num_iters=2, block_causal=True, backend="triton")
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
