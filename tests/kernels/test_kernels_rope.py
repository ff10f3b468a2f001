"""apply_rope: Triton vs reference vs diffusers' Sana-Video apply_rotary_emb (interleaved pairs)."""

import pytest
import torch
from helpers import DEVICE

from framegraph.kernels.rope import apply_rope
from framegraph.kernels.rope.reference import diffusers_apply_rotary_emb


def sana_video_rope_tables(frames=2, height=4, width=4, head_dim=32):
    from diffusers.models.transformers.transformer_sana_video import WanRotaryPosEmbed

    rope = WanRotaryPosEmbed(head_dim, (1, 1, 1), max_seq_len=64)
    cos, sin = rope(torch.zeros(1, 1, frames, height, width))  # [1, N, 1, D], float64
    return cos.float().to(DEVICE), sin.float().to(DEVICE)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_matches_diffusers_apply_rotary_emb_on_sana_video_tables(backend):
    cos, sin = sana_video_rope_tables()
    x = torch.randn(2, cos.shape[1], 3, 32, generator=torch.Generator().manual_seed(0)).to(DEVICE)  # [B, N, H, D]
    torch.testing.assert_close(apply_rope(x, cos, sin, backend=backend), diffusers_apply_rotary_emb(x, cos, sin))


@pytest.mark.parametrize("shape, table_shape", [((2, 3, 20, 24), (1, 1, 20, 24)), ((20, 16), (20, 16)),
                                                ((3, 20, 16), (20, 16))])
def test_triton_matches_reference_forward_and_backward(shape, table_shape):
    g = torch.Generator().manual_seed(1)
    angles = torch.randn(*table_shape[:-1], table_shape[-1] // 2, generator=g).repeat_interleave(2, -1).to(DEVICE)
    x = torch.randn(*shape, generator=g).to(DEVICE)
    grad = torch.randn(*shape, generator=g).to(DEVICE)
    results = []
    for backend in ("triton", "torch"):
        leaf = x.clone().requires_grad_()
        out = apply_rope(leaf, angles.cos(), angles.sin(), backend=backend)
        results.append((out, torch.autograd.grad((out * grad).sum(), leaf)[0]))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_rotation_is_norm_preserving_and_non_contiguous_input_works():
    cos, sin = sana_video_rope_tables()
    x = torch.randn(2, 3, cos.shape[1], 32).to(DEVICE).transpose(1, 2)  # [B, N, H, D] view, not contiguous
    out = apply_rope(x, cos, sin, backend="triton")
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out, diffusers_apply_rotary_emb(x, cos, sin))


@pytest.mark.parametrize(
    "x, table, message",
    [
        (torch.randn(4, 15), torch.ones(4, 15), "even D"),
        (torch.randn(4, 16), torch.ones(5, 16), "cos has shape"),
        (torch.randn(16), torch.ones(16), "rank 1"),
        (torch.randn(4, 16).int(), torch.ones(4, 16), "int32"),
    ],
)
def test_bad_arguments_raise_clear_errors(x, table, message):
    with pytest.raises((ValueError, TypeError), match=message):
        apply_rope(x, table, table)
