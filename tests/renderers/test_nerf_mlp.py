"""NeRF MLPs: the fused Triton kernel against its torch twin; SH encoding; trunc_exp."""
import math

import pytest
import torch

from framegraph.kernels.backend import triton_available
from framegraph.renderers.nerf import NerfField, sh_encode, trunc_exp
from framegraph.renderers.nerf.hash_encoding import HashGridConfig
from framegraph.renderers.nerf.mlp import init_weights, mlp, mlp_forward

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not triton_available(torch.device(DEV)),
                                  reason="triton (or its interpreter) not available")


@needs_triton
@pytest.mark.parametrize("sizes, act", [([32, 64, 16], "none"), ([31, 64, 64, 3], "sigmoid")],
                         ids=["density 32-64-16", "color 31-64-64-3"])
def test_fused_mlp_matches_torch_forward_and_backward(sizes, act):
    g = torch.Generator().manual_seed(0)
    weights = [w.to(DEV).requires_grad_() for w in init_weights(sizes, g)]
    x = torch.randn(100, sizes[0], generator=g).to(DEV).requires_grad_()  # 100: not a multiple of the block
    grad_y = torch.randn(100, sizes[-1], generator=g).to(DEV)
    results = []
    for backend in ("torch", "triton"):
        y = mlp(x, weights, act, backend=backend)
        results.append((y.detach(), torch.autograd.grad((y * grad_y).sum(), [x, *weights])))
    (y0, g0), (y1, g1) = results
    torch.testing.assert_close(y1, y0, atol=1e-5, rtol=1e-5)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@needs_triton
def test_field_gives_the_same_density_and_colour_on_both_backends():
    cfg = HashGridConfig(n_levels=4, log2_table_size=10, base_resolution=4, finest_resolution=32)
    field = NerfField(cfg, (-1, -1, -1, 1, 1, 1), generator=torch.Generator().manual_seed(1)).to(DEV)
    with torch.no_grad():
        field.grid["table"].normal_(0, 0.5)
    g = torch.Generator().manual_seed(2)
    x = (torch.rand(64, 3, generator=g) * 2 - 1).to(DEV)
    d = torch.nn.functional.normalize(torch.randn(64, 3, generator=g), dim=-1).to(DEV)
    s0, c0 = field(x, d, backend="torch")
    s1, c1 = field(x, d, backend="triton")
    torch.testing.assert_close(s1, s0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(c1, c0, atol=1e-5, rtol=1e-4)


def test_mlp_reference_is_relu_layers_without_biases():
    g = torch.Generator().manual_seed(3)
    w = init_weights([5, 16, 16, 2], g)
    x = torch.randn(7, 5, generator=g)
    want = torch.sigmoid(torch.relu(torch.relu(x @ w[0]) @ w[1]) @ w[2])
    torch.testing.assert_close(mlp_forward(x, w, "sigmoid"), want)
    with pytest.raises(ValueError, match="output_activation"):
        mlp(x, w, "tanh")
    with pytest.raises(ValueError, match=r"expected \[N, 5\]"):
        mlp(torch.randn(7, 4), w)


def test_sh_encoding_is_orthonormal_over_the_sphere():
    g = torch.Generator().manual_seed(4)
    d = torch.nn.functional.normalize(torch.randn(200_000, 3, generator=g, dtype=torch.float64), dim=-1)
    Y = sh_encode(d)
    assert Y.shape == (200_000, 16)
    gram = 4 * math.pi * (Y.T @ Y) / d.shape[0]  # Monte Carlo estimate of the integral of Y_i Y_j
    torch.testing.assert_close(gram, torch.eye(16, dtype=torch.float64), atol=0.03, rtol=0)
    # band 1 is linear in the direction: -y, z, -x scaled by sqrt(3 / 4 pi)
    c = math.sqrt(3 / (4 * math.pi))
    torch.testing.assert_close(Y[:, 1:4], c * torch.stack([-d[:, 1], d[:, 2], -d[:, 0]], -1))


def test_trunc_exp_clamps_its_gradient():
    x = torch.tensor([0.0, 10.0, 30.0], requires_grad=True)
    y = trunc_exp(x)
    torch.testing.assert_close(y.detach(), torch.exp(x.detach()))
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.exp(torch.tensor([0.0, 10.0, 15.0])))
