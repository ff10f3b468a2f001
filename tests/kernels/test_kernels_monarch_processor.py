"""MonarchAttnProcessor inside a tiny random WanTransformer3DModel (no downloads)."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers import WanTransformer3DModel
from helpers import DEVICE

from framegraph.kernels.processors import MonarchAttnProcessor, install_monarch_processors

FRAMES, HEIGHT, WIDTH = 3, 8, 32  # latent; patch (1, 2, 2) -> grid (3, 4, 16), 192 tokens
GRID = (FRAMES, HEIGHT // 2, WIDTH // 2)


def tiny_model():
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32,
    ).to(DEVICE).eval()


def model_inputs(frames=FRAMES):
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, frames, HEIGHT, WIDTH, generator=g).to(DEVICE)
    text = torch.randn(1, 5, 16, generator=g).to(DEVICE)
    return latents, torch.tensor([500], device=DEVICE), text


def relative_error(actual, expected):
    return ((actual - expected).norm() / expected.norm()).item()


@torch.no_grad()
def test_exact_fallback_equals_the_stock_model():
    model = tiny_model()
    inputs = model_inputs()
    expected = model(*inputs).sample
    processors = install_monarch_processors(model, exact=True)
    assert sorted(processors) == ["blocks.0.attn1", "blocks.1.attn1"]  # cross-attention keeps its processor
    assert type(model.blocks[0].attn2.processor).__name__ == "WanAttnProcessor"
    assert torch.equal(model(*inputs).sample, expected)


@torch.no_grad()
def test_monarch_output_is_close_to_the_stock_model():
    model = tiny_model()
    inputs = model_inputs()
    expected = model(*inputs).sample
    errors = []
    for num_iters in (1, 2):
        install_monarch_processors(model, num_iters=num_iters, backend="torch")
        errors.append(relative_error(model(*inputs).sample, expected))
    print(f"relative L2 error of the model output vs stock attention, num_iters 1, 2: {errors}")
    assert max(errors) < 0.1, errors


@torch.no_grad()
def test_grid_is_read_from_the_latents_or_given():
    model = tiny_model()
    inputs = model_inputs()
    derived = install_monarch_processors(model, backend="torch")
    out = model(*inputs).sample
    assert all(p.grid == GRID for p in derived.values())
    shorter = model_inputs(frames=2)
    model(*shorter)  # the hook follows the input's size
    assert all(p.grid == (2, *GRID[1:]) for p in derived.values())

    install_monarch_processors(model, grid=GRID, backend="torch")  # fixed grid, hook removed
    torch.testing.assert_close(model(*inputs).sample, out)
    with pytest.raises(ValueError, match=r"grid=\(3, 4, 16\) has 192 tokens; q has N=128"):
        model(*shorter)


@torch.no_grad()
def test_triton_backend_matches_torch_backend_in_the_model():
    model = tiny_model()
    inputs = model_inputs()
    install_monarch_processors(model, num_iters=1, block_causal=True, backend="torch")
    expected = model(*inputs).sample
    install_monarch_processors(model, num_iters=1, block_causal=True, backend="triton")
    torch.testing.assert_close(model(*inputs).sample, expected, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_block_causal_model_first_frames_ignore_later_frames():
    model = tiny_model()
    attn = model.blocks[0].attn1
    attn.set_processor(MonarchAttnProcessor(GRID, num_iters=2, block_causal=True, backend="torch"))
    hidden = torch.randn(1, 192, 32, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out = attn(hidden)
    changed = hidden.clone()
    changed[:, 128:] += 1.0  # the last frame
    torch.testing.assert_close(attn(changed)[:, :128], out[:, :128], rtol=0, atol=0)


def test_misuse_is_refused_with_clear_errors():
    with pytest.raises(ValueError, match="num_iters=0"):
        MonarchAttnProcessor(GRID, num_iters=0)
    with pytest.raises(ValueError, match="grid="):
        MonarchAttnProcessor((3, 4))
    model = tiny_model()
    attn = model.blocks[0].attn1
    attn.set_processor(MonarchAttnProcessor())
    with pytest.raises(ValueError, match="grid is unknown"):
        attn(torch.randn(1, 192, 32, device=DEVICE))
    with pytest.raises(ValueError, match="no self-attention WanAttnProcessor"):
        install_monarch_processors(torch.nn.Linear(2, 2))
