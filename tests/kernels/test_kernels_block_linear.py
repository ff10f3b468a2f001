"""Block-causal linear attention: Triton kernels vs the torch reference, streaming, errors.

Without CUDA the Triton kernels run on CPU through Triton's interpreter; TRITON_INTERPRET must be set
before framegraph's kernel modules are imported (they are imported lazily, on first use).
"""

import pytest
import torch
from helpers import DEVICE

from framegraph.kernels.block_linear_attention import LinearAttentionState, block_linear_attention, zero_state
from framegraph.kernels.rope.reference import diffusers_apply_rotary_emb

gpu = pytest.mark.gpu


def make_inputs(B=2, H=2, N=64, D=32, Dv=16, dtype=torch.float32, seed=0, rope=True):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(DEVICE, dtype) for d in (D, D, Dv))
    table = None
    if rope:
        angles = torch.randn(1, 1, N, D // 2, generator=g).repeat_interleave(2, dim=-1).to(DEVICE)
        table = (angles.cos(), angles.sin())
    return q, k, v, table


def random_state(B, H, D, Dv, seed=1):
    g = torch.Generator().manual_seed(seed)
    return LinearAttentionState(
        kv=torch.randn(B, H, Dv, D, generator=g).to(DEVICE), k_sum=torch.rand(B, H, D, generator=g).to(DEVICE) * 4
    )


def assert_close(actual, expected, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "N, D, Dv, block_size, rope, with_state",
    [
        (64, 32, 16, 16, True, False),
        (64, 32, 16, 16, False, True),
        (72, 24, 20, 24, True, True),  # block not a power of two, padded head dims
        (48, 16, 32, 48, True, False),  # one block = whole sequence (diffusers' processor)
        (640, 16, 16, 320, True, True),  # several programs per block
    ],
)
def test_triton_matches_reference_forward_and_backward(N, D, Dv, block_size, rope, with_state):
    B = H = 1 if N > 256 else 2  # the interpreter's time grows with B * H * N
    q, k, v, table = make_inputs(B=B, H=H, N=N, D=D, Dv=Dv, rope=rope)
    out = _assert_backends_agree(q, k, v, table, random_state(B, H, D, Dv) if with_state else None, block_size)
    assert out.shape == (B, H, N, Dv) and out.dtype == q.dtype


def _assert_backends_agree(q, k, v, table, state, block_size):
    """Triton and torch agree on the output, the new state and the gradients of a random loss w.r.t. q, k, v
    (and the state, when given). Returns Triton's output."""
    results = {}
    for backend in ("triton", "torch"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        st = LinearAttentionState(*(t.clone().requires_grad_() for t in state)) if state is not None else None
        out, new_state = block_linear_attention(*leaves, block_size=block_size, rope=table, state=st, backend=backend)
        g = torch.Generator().manual_seed(5)
        loss = (out * torch.randn(out.shape, generator=g).to(DEVICE)).sum() + new_state.kv.sum() + new_state.k_sum.sum()
        wrt = leaves + (list(st) if st is not None else [])
        results[backend] = (out, new_state, torch.autograd.grad(loss, wrt))
    (o1, s1, g1), (o2, s2, g2) = results["triton"], results["torch"]
    assert_close(o1, o2)
    assert_close(s1.kv, s2.kv)
    assert_close(s1.k_sum, s2.k_sum)
    for a, b in zip(g1, g2):
        assert_close(a, b, rtol=1e-4, atol=1e-4)
    return o1


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_streaming_block_by_block_equals_full_sequence(backend):
    q, k, v, (cos, sin) = make_inputs(N=64, D=32, Dv=32)
    full, full_state = block_linear_attention(q, k, v, block_size=16, rope=(cos, sin), backend=backend)
    state, outs = None, []
    for start in (0, 16, 48):  # chunks of 1, 2 and 1 blocks
        stop = 64 if start == 48 else start + (32 if start == 16 else 16)
        chunk = slice(start, stop)
        out, state = block_linear_attention(
            q[:, :, chunk], k[:, :, chunk], v[:, :, chunk], block_size=16,
            rope=(cos[:, :, chunk], sin[:, :, chunk]), state=state, backend=backend,
        )
        assert state.kv.shape == (2, 2, 32, 32) and state.k_sum.shape == (2, 2, 32)  # constant memory
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.kv, full_state.kv, rtol=1e-5, atol=1e-5)


def test_block_causality_and_bidirectional_inside_block():
    q, k, v, table = make_inputs(N=48, rope=True)
    out, _ = block_linear_attention(q, k, v, block_size=16, rope=table, backend="torch")
    v2 = v.clone()
    v2[:, :, 40] += 1.0  # a token of the last block
    out2, _ = block_linear_attention(q, k, v2, block_size=16, rope=table, backend="torch")
    torch.testing.assert_close(out2[:, :, :32], out[:, :, :32])  # earlier blocks do not see it
    assert (out2[:, :, 32:40] - out[:, :, 32:40]).abs().max() > 1e-4  # earlier tokens of its block do


def test_matches_diffusers_sana_linear_attention_math():
    """block_size == N, fp32: the formula of diffusers' SanaLinearAttnProcessor3_0 (layout [B, H, C, N])."""
    q, k, v, (cos, sin) = make_inputs(N=32, D=16, Dv=16)
    out, _ = block_linear_attention(q, k, v, block_size=32, rope=(cos, sin), backend="torch")

    def rotate(x):  # diffusers' apply_rotary_emb on [B, H, N, D]
        return diffusers_apply_rotary_emb(x, cos, sin)

    query, key = torch.relu(q), torch.relu(k)
    query_rotate, key_rotate = rotate(query), rotate(key)
    query, key, query_rotate, key_rotate, value = (t.transpose(-1, -2)
                                                   for t in (query, key, query_rotate, key_rotate, v))
    z = 1 / (key.sum(dim=-1, keepdim=True).transpose(-2, -1) @ query + 1e-15)
    expected = (value @ key_rotate.transpose(-1, -2)) @ query_rotate * z
    torch.testing.assert_close(out, expected.transpose(-1, -2), rtol=1e-5, atol=1e-6)


def test_low_precision_inputs_accumulate_in_fp32():
    q, k, v, table = make_inputs(N=32, D=16, Dv=16)
    expected, _ = block_linear_attention(q, k, v, block_size=16, rope=table, backend="torch")
    out, state = block_linear_attention(*(t.bfloat16() for t in (q, k, v)), block_size=16, rope=table, backend="torch")
    assert out.dtype == torch.bfloat16 and state.kv.dtype == torch.float32
    torch.testing.assert_close(out.float(), expected, rtol=3e-2, atol=3e-2)


def test_custom_op_registration_passes_opcheck():
    q, k, v, (cos, sin) = make_inputs(B=1, H=1, N=32, D=16, Dv=16)
    kv0, k_sum0 = random_state(1, 1, 16, 16)
    args = (q.requires_grad_(), k, v, cos, sin, kv0, k_sum0, 16, 1e-15)
    torch.library.opcheck(torch.ops.framegraph.block_linear_attention.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_traces_under_torch_compile():
    q, k, v, table = make_inputs(B=1, H=1, N=32, D=16, Dv=16)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(q, k, v):
        out, state = block_linear_attention(q, k, v, block_size=16, rope=table, backend="triton")
        return out, state.kv

    out, _ = f(q, k, v)
    expected, _ = block_linear_attention(q, k, v, block_size=16, rope=table, backend="torch")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=torch.randn(2, 64, 32)), "rank 3"),
        (dict(k=torch.randn(2, 3, 64, 32)), "k has shape"),
        (dict(v=torch.randn(2, 3, 64, 16)), "v has shape"),
        (dict(block_size=24), "does not divide the sequence length N=64"),
        (dict(block_size=0), "block_size=0"),
        (dict(q=torch.randn(2, 2, 64, 32, dtype=torch.float64)), "float64"),
        (dict(rope=(torch.ones(1, 1, 63, 32), torch.ones(1, 1, 63, 32))), "rope cos"),
        (dict(state=zero_state(2, 2, 16, 32)), "state has kv"),
        (dict(backend="cuda"), "backend='cuda'"),
    ],
)
def test_bad_arguments_raise_clear_errors(change, message):
    q, k, v, _ = make_inputs(N=64, D=32, Dv=16, rope=False)
    kwargs = dict(q=q, k=k, v=v, block_size=16, rope=None, state=None, backend="torch")
    kwargs.update({key: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for key, t in change.items()})
    if kwargs["state"] is not None:
        kwargs["state"] = LinearAttentionState(*(t.to(DEVICE) for t in kwargs["state"]))
    q, k, v = kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v")
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        block_linear_attention(q, k, v, **kwargs)


def test_triton_on_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, _ = make_inputs(N=16, D=16, Dv=16, rope=False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        block_linear_attention(q.cpu(), k.cpu(), v.cpu(), block_size=16, backend="triton")


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_half_precision_matches_fp32_reference(dtype):
    q, k, v, table = make_inputs(B=2, H=4, N=1024, D=112, Dv=112, dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = block_linear_attention(*leaves, block_size=256, rope=table, backend="triton")
    ref_leaves = [t.float().clone().requires_grad_() for t in (q, k, v)]
    ref, _ = block_linear_attention(*ref_leaves, block_size=256, rope=table, backend="torch")
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    grad = torch.randn_like(ref)
    out.backward(grad.to(dtype))
    ref.backward(grad)
    for a, b in zip(leaves, ref_leaves):
        rel = (a.grad.float() - b.grad).norm() / b.grad.norm()
        assert rel < 2e-2


@gpu
def test_gpu_cuda_graph_capture_replays():
    q, k, v, table = make_inputs(B=1, H=2, N=256, D=64, Dv=64, dtype=torch.bfloat16)
    block_linear_attention(q, k, v, block_size=64, rope=table)  # warm-up compiles the kernels
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = block_linear_attention(q, k, v, block_size=64, rope=table)
    q.copy_(torch.randn_like(q))
    graph.replay()
    expected, _ = block_linear_attention(q, k, v, block_size=64, rope=table)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("with_state", [False, True])
def test_triton_wide_heads_split_the_state_into_value_slices(with_state):
    """Heads > 64 run the production tiles (sm_89's on CPU): the state is split into BV-row slices over a grid
    axis (forward, G of the backward) or a loop (dq, dk), with Dv not a multiple of BV (masked last slice)."""
    from framegraph.kernels.block_linear_attention import triton as kernels

    B = H = 1
    N, D, Dv, block_size = 64, 128, 72, 32
    configs = kernels.launch_configs(D, Dv, block_size, torch.float32, 89)
    assert {name: cfg["BV"] for name, cfg in configs.items()} == dict(
        sums=128, output=64, query_grad=32, query_state_grad=128, key_grad=16)
    q, k, v, table = make_inputs(B=B, H=H, N=N, D=D, Dv=Dv)
    _assert_backends_agree(q, k, v, table, random_state(B, H, D, Dv) if with_state else None, block_size)
