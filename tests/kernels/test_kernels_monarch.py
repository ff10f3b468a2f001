"""Monarch attention: exactness on Monarch-structured softmax, Triton vs reference (forward and backward),
causality, custom-op registration, errors.

Without CUDA the Triton kernels run on CPU through Triton's interpreter; TRITON_INTERPRET must be set
before framegraph's kernel modules are imported (they are imported lazily, on first use).
"""
import math

import pytest
import torch
from helpers import DEVICE

from framegraph.kernels.monarch_attention import (
    monarch_attention,
    monarch_factors,
    monarch_matrix,
    softmax_attention,
)
from framegraph.kernels.monarch_attention.reference import token_causal_mask

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


def triton_and_reference_grads(q, k, v, seed=3, **kwargs):
    """``{backend: (out, (dq, dk, dv))}`` for a random upstream gradient, Triton backward vs autograd."""
    weights = torch.randn(*q.shape[:3], v.shape[-1], generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    results = {}
    for backend in ("triton", "torch"):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = monarch_attention(*leaves, backend=backend, **kwargs)
        results[backend] = (out, torch.autograd.grad((out * weights).sum(), leaves))
    return results


def assert_grads_match(results, rtol=1e-4, atol=1e-5):
    (o1, g1), (o2, g2) = results["triton"], results["torch"]
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    for name, a, b in zip(("dq", "dk", "dv"), g1, g2):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize(
    "grid, B, H, D, Dv, num_iters, block_causal",
    [
        ((2, 4, 4), 1, 1, 16, 16, 1, False),
        ((2, 4, 4), 1, 1, 16, 16, 1, True),
        ((2, 4, 4), 1, 1, 16, 16, 2, True),
        ((2, 1, 4), 2, 2, 16, 16, 2, False),  # B > 1, H > 1
        ((3, 2, 5), 1, 1, 32, 16, 2, True),  # non-square blocks (M = 6 rows of b = 5), D != Dv
        ((2, 2, 4), 1, 1, 32, 32, 3, True),
    ],
)
def test_triton_backward_matches_autograd_through_the_reference(grid, B, H, D, Dv, num_iters, block_causal):
    q, k, v = make_inputs(grid, B=B, H=H, D=D, Dv=Dv)
    results = triton_and_reference_grads(q, k, v, grid=grid, num_iters=num_iters, block_causal=block_causal)
    assert_grads_match(results)


@pytest.mark.slow
@pytest.mark.parametrize(
    "grid, num_iters, block_causal",
    [
        ((2, 9, 2), 2, True),  # M = 18 rows: two row tiles, a frame boundary inside the first
        ((1, 2, 17), 2, False),  # b = 17 columns: two column tiles
    ],
)
def test_triton_backward_with_several_tiles_per_row_and_column(monkeypatch, grid, num_iters, block_causal):
    from framegraph.kernels.monarch_attention import triton as kernels

    monkeypatch.setattr(kernels, "MAX_TILE", 16)  # tl.dot's minimum: every loop runs over several tiles
    q, k, v = make_inputs(grid, H=1)
    results = triton_and_reference_grads(q, k, v, grid=grid, num_iters=num_iters, block_causal=block_causal)
    assert_grads_match(results)


def test_triton_forward_and_backward_accept_strided_inputs():
    grid = (2, 1, 4)
    q, k, v = make_inputs(grid, H=2)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, N, H, D] memory, as diffusers' layout
    v_strided = v[..., :8]  # a view with row stride 16, Dv = 8 padded inside the kernels
    results = triton_and_reference_grads(q_strided, k, v_strided, grid=grid, num_iters=2, block_causal=True)
    assert_grads_match(results)


def test_triton_backward_keeps_future_frames_out_of_past_gradients():
    """With block_causal, a loss on frame 0's outputs has no gradient into later frames' q, k, v."""
    grid = (2, 2, 4)
    q, k, v = (t.requires_grad_() for t in make_inputs(grid, H=1))
    out = monarch_attention(q, k, v, grid=grid, num_iters=2, block_causal=True, backend="triton")
    per_frame = 2 * 4
    dq, dk, dv = torch.autograd.grad(out[:, :, :per_frame].sum(), (q, k, v))
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert grad[:, :, per_frame:].abs().max() == 0, name
        assert grad[:, :, :per_frame].abs().max() > 0, name


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
    grid = (2, 1, 4)
    q, k, v = make_inputs(grid, H=2)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # strided: the fakes must still match the kernels' outputs
    args = (q.requires_grad_(), k, v, *grid, 2, True)
    torch.library.opcheck(
        torch.ops.framegraph.monarch_attention.default, args,
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )
    _, lse_l, a_r, c_r = torch.ops.framegraph.monarch_attention(*args)
    assert lse_l.shape == (2, 1, 2, 4, 2) and a_r.shape == (1, 1, 2, 8, 16) and c_r.shape == (1, 1, 2, 8)
    d_out = torch.randn_like(v)
    backward_args = (d_out, q.detach(), k, v, lse_l, a_r, c_r, *grid, 2, True)
    torch.library.opcheck(
        torch.ops.framegraph.monarch_attention_backward.default, backward_args,
        test_utils=("test_schema", "test_faketensor"),
    )


def test_forward_and_backward_trace_under_torch_compile():
    grid = (2, 2, 4)
    q, k, v = make_inputs(grid, H=1)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(q, k, v):
        return monarch_attention(q, k, v, grid=grid, num_iters=1, block_causal=True, backend="triton")

    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = f(*leaves)
    grads = torch.autograd.grad(out.square().sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = monarch_attention(*ref_leaves, grid=grid, num_iters=1, block_causal=True, backend="torch")
    expected_grads = torch.autograd.grad(expected.square().sum(), ref_leaves)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


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
    out = monarch_attention(*(t.to(dtype) for t in (q, k, v)), grid=grid, num_iters=2, block_causal=True,
                            backend="triton")
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_backward_matches_fp32_reference(dtype):
    grid = (4, 8, 16)
    q, k, v = make_inputs(grid, B=2, H=2, D=64, Dv=64, sharpness=1.0)
    kwargs = dict(grid=grid, num_iters=2, block_causal=True)
    results = triton_and_reference_grads(q, k, v, **kwargs)
    if dtype == torch.float32:
        assert_grads_match(results, rtol=1e-3, atol=1e-4)  # tf32-free ieee dots, different summation order
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = monarch_attention(*leaves, backend="triton", **kwargs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    grads = torch.autograd.grad((out.float() * weights).sum(), leaves)
    for a, b in zip(grads, results["torch"][1]):
        assert a.dtype == dtype
        torch.testing.assert_close(a.float(), b, rtol=5e-2, atol=5e-2 * b.abs().max().item())


@gpu
def test_gpu_forward_and_backward_capture_in_a_cuda_graph():
    grid = (2, 4, 16)
    q, k, v = (t.requires_grad_() for t in make_inputs(grid, B=1, H=2, D=32, Dv=32))

    def step(q, k, v):
        return monarch_attention(q, k, v, grid=grid, num_iters=2, block_causal=True, backend="triton")

    graphed = torch.cuda.make_graphed_callables(step, (q, k, v))
    out = graphed(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = step(q, k, v)
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    torch.testing.assert_close(out, expected)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b)


def test_triton_wide_heads_fp32_use_narrower_loop_steps_than_program_tiles():
    """Heads > 64 in fp32: programs of 32 rows / columns stepping through 16 at a time (BJ != BI, BL != BK:
    the production tiles of ``tiles``, chosen so no kernel spills), forward and backward (all 16)."""
    from framegraph.kernels.monarch_attention import triton as kernels

    grid = (2, 9, 20)  # M = 18 rows and b = 20 columns: one 32-wide program, two 16-wide steps
    cfg = kernels.tiles(72, 72, torch.float32, grid, 89)
    assert (cfg["BJ"], cfg["BI"], cfg["BL"], cfg["BK"]) == (32, 16, 32, 16)
    q, k, v = make_inputs(grid, H=1, D=72, Dv=72)
    results = triton_and_reference_grads(q, k, v, grid=grid, num_iters=2, block_causal=True)
    assert_grads_match(results)
