"""One backend choice for every fast op, kernel or renderer: ``framegraph.kernels.backend``.

Each public op takes ``backend: Backend = "auto"`` and turns a bad value, or ``"triton"`` where Triton
cannot run, into the same error, naming the op.
"""
import typing

import pytest
import torch

from framegraph.kernels import backend as fb
from framegraph.kernels.block_linear_attention import block_linear_attention
from framegraph.kernels.modulation import gate_residual, norm_modulate
from framegraph.kernels.monarch_attention import monarch_attention
from framegraph.kernels.rope import apply_rope
from framegraph.renderers.cameras import intrinsics, look_at
from framegraph.renderers.gaussians import random_scene, rasterize
from framegraph.renderers.gaussians4d import random_scene_4d, rasterize_4d
from framegraph.renderers.nerf.hash_encoding import HashGridConfig, hash_encode
from framegraph.renderers.nerf.mlp import init_weights, mlp


def _camera():
    return look_at((3.0, 0.5, 1.0), (0.0, 0.0, 0.0))[None], intrinsics(16, 12, fov_deg=60)[None]


def _calls():
    """(op name in errors, public function, its call on small valid CPU inputs with a given backend)."""
    q = torch.randn(1, 1, 16, 8)
    x = torch.randn(2, 4, 8)
    cfg = HashGridConfig(n_levels=2, n_features=2, log2_table_size=8, base_resolution=4, finest_resolution=8)
    viewmats, Ks = _camera()
    scene, scene4d = random_scene(8, 1, seed=0), random_scene_4d(8, 1, 1, seed=0)
    return [
        ("block_linear_attention", block_linear_attention,
         lambda b: block_linear_attention(q, q, q, block_size=8, backend=b)),
        ("monarch_attention", monarch_attention, lambda b: monarch_attention(q, q, q, grid=(1, 4, 4), backend=b)),
        ("norm_modulate", norm_modulate, lambda b: norm_modulate(x, x, x, backend=b)),
        ("gate_residual", gate_residual, lambda b: gate_residual(x, x, x, backend=b)),
        ("apply_rope", apply_rope, lambda b: apply_rope(x, torch.ones(8), torch.zeros(8), backend=b)),
        ("hash_encode", hash_encode,
         lambda b: hash_encode(torch.rand(5, 3), torch.zeros(cfg.n_entries, cfg.n_features), cfg, backend=b)),
        ("mlp", mlp, lambda b: mlp(torch.randn(5, 4), init_weights([4, 16, 3]), backend=b)),
        ("rasterize", rasterize,
         lambda b: rasterize(**scene.rasterize_args(), viewmats=viewmats, Ks=Ks, width=16, height=12, backend=b)),
        ("rasterize_4d", rasterize_4d,
         lambda b: rasterize_4d(**scene4d.rasterize_args(), t=0.5, viewmats=viewmats, Ks=Ks, width=16, height=12,
                                backend=b)),
    ]


CALLS = _calls()
IDS = [name for name, _, _ in CALLS]


@pytest.mark.parametrize("name, fn, call", CALLS, ids=IDS)
def test_every_fast_op_types_backend_as_one_literal(name, fn, call):
    assert typing.get_type_hints(fn)["backend"] == fb.Backend
    assert typing.get_args(fb.Backend) == ("auto", "triton", "torch")


@pytest.mark.parametrize("name, fn, call", CALLS, ids=IDS)
def test_every_fast_op_rejects_a_bad_backend_with_one_message(name, fn, call):
    with pytest.raises(ValueError) as info:
        call("cuda")
    assert str(info.value) == f"{name}: backend='cuda'; expected one of ('auto', 'triton', 'torch')"


@pytest.mark.parametrize("name, fn, call", CALLS, ids=IDS)
def test_triton_on_cpu_without_the_interpreter_is_refused_alike(name, fn, call, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if not fb.triton_installed():
        pytest.skip("triton is not installed")
    with pytest.raises(ValueError, match=rf"^{name}: backend='triton' needs CUDA tensors, got tensors on \['cpu'\]"):
        call("triton")
    assert call("auto") is not None  # "auto" falls back to the torch reference on CPU


def test_triton_available_says_where_the_kernels_run(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fb.triton_available("cpu") == fb.triton_installed()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not fb.triton_available(torch.device("cpu"))
    assert fb.triton_available("cuda") == (fb.triton_installed() and torch.cuda.is_available())
