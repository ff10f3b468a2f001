"""NeRF hash encoding: the reference's defining properties, and the Triton kernels against it."""
import math

import pytest
import torch

from framegraph.kernels.backend import triton_available
from framegraph.renderers.nerf.hash_encoding import (
    HashGridConfig,
    hash_encode,
    hash_encode_reference,
    hash_encode_vectorized,
    level_corners,
    spatial_hash,
)

needs_triton = pytest.mark.skipif(not triton_available(torch.device("cpu")) and not torch.cuda.is_available(),
                                  reason="triton (or its interpreter) not available")
SMALL = HashGridConfig(n_levels=6, n_features=2, log2_table_size=10, base_resolution=3, finest_resolution=40)


def test_default_grid_is_instant_ngp_shaped():
    cfg = HashGridConfig()
    assert (cfg.n_levels, cfg.n_features, cfg.table_size) == (16, 2, 1 << 19)
    res = cfg.resolutions
    assert res[0] == 16 and res[-1] == 2048 and res == sorted(res)
    b = math.exp((math.log(2048) - math.log(16)) / 15)
    assert cfg.growth_factor == pytest.approx(b)
    for l, r in enumerate(res):  # N_l = floor(N_min * b^l)
        assert r == math.floor(16 * b ** l + 1e-6)
    # coarse levels fit in the table and are dense; the rest are hashed into exactly T rows
    assert cfg.dense == [(r + 1) ** 3 <= 1 << 19 for r in res]
    assert cfg.dense == [True] * 5 + [False] * 11  # 16, 22, 30, 42, 58 dense; 80 (81^3 > 2^19) on hashed
    assert cfg.level_sizes == [(r + 1) ** 3 if d else 1 << 19 for r, d in zip(res, cfg.dense)]
    assert cfg.offsets[-1] == cfg.n_entries == sum(cfg.level_sizes)
    assert cfg.n_output_dims == 32


def test_dense_levels_index_every_vertex_once():
    cfg = SMALL
    for res, size, dense in zip(cfg.resolutions, cfg.level_sizes, cfg.dense):
        if not dense:
            continue
        g = torch.arange(res + 1, dtype=torch.float64) / res
        verts = torch.stack(torch.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
        index, weight = level_corners(verts, res, size, dense)
        # at a vertex one corner has weight 1: that corner's row, over all vertices, is a bijection
        rows = index.gather(1, weight.argmax(dim=1, keepdim=True))[:, 0]
        assert sorted(rows.tolist()) == list(range(size))


def test_hashed_levels_use_the_uint32_spatial_hash():
    cfg = SMALL
    assert not all(cfg.dense)
    P1, P2, T = 2654435761, 805459861, cfg.table_size
    ijk = torch.tensor([[0, 0, 0], [1, 2, 3], [40, 39, 38], [17, 0, 25]])
    got = spatial_hash(ijk[:, 0], ijk[:, 1], ijk[:, 2], T).tolist()
    want = [((i * 1) ^ ((j * P1) % 2 ** 32) ^ ((k * P2) % 2 ** 32)) % T for i, j, k in ijk.tolist()]
    assert got == want
    l = cfg.dense.index(False)
    x = torch.rand(500, 3, generator=torch.Generator().manual_seed(0))
    index, _ = level_corners(x, cfg.resolutions[l], cfg.level_sizes[l], False)
    assert int(index.min()) >= 0 and int(index.max()) < T


def test_trilinear_weights_sum_to_one_and_reproduce_linear_functions():
    cfg = HashGridConfig(n_levels=2, n_features=1, log2_table_size=12, base_resolution=4, finest_resolution=8)
    assert all(cfg.dense)
    x = torch.rand(300, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[:3] = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.25, 0.5, 1.0]], dtype=torch.float64)
    for res, size in zip(cfg.resolutions, cfg.level_sizes):
        _, w = level_corners(x, res, size, True)
        assert bool((w >= 0).all())
        torch.testing.assert_close(w.sum(1), torch.ones(300, dtype=torch.float64))
    # a table holding a linear function of the vertex positions is interpolated exactly
    rows = []
    for res in cfg.resolutions:
        g = torch.arange(res + 1, dtype=torch.float64) / res
        k, j, i = torch.meshgrid(g, g, g, indexing="ij")  # row = i + j (R+1) + k (R+1)^2
        rows.append((0.3 + 2 * i - 1.5 * j + 0.7 * k).reshape(-1, 1))
    table = torch.cat(rows)
    enc = hash_encode_reference(x, table, cfg)
    want = (0.3 + 2 * x[:, 0] - 1.5 * x[:, 1] + 0.7 * x[:, 2])[:, None].expand(-1, 2)
    torch.testing.assert_close(enc, want)


def test_encoding_is_continuous_across_cell_boundaries():
    cfg = SMALL
    table = torch.randn(cfg.n_entries, cfg.n_features, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x = torch.rand(200, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[:, 0] = 7.0 / cfg.resolutions[-1]  # exactly on a cell face of the finest level
    eps = 1e-9
    lo = hash_encode_reference(x - torch.tensor([eps, 0, 0], dtype=torch.float64), table, cfg)
    hi = hash_encode_reference(x + torch.tensor([eps, 0, 0], dtype=torch.float64), table, cfg)
    assert float((hi - lo).abs().max()) < 1e-6
    # and points are clamped into the unit cube
    torch.testing.assert_close(hash_encode_reference(x * 0 + 1.5, table, cfg),
                               hash_encode_reference(x * 0 + 1, table, cfg))


def test_reference_gradient_scatters_weights_into_the_table():
    cfg = SMALL
    table = torch.zeros(cfg.n_entries, cfg.n_features, dtype=torch.float64, requires_grad=True)
    x = torch.rand(1, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    hash_encode_reference(x, table, cfg)[0, 0].backward()  # feature 0 of level 0
    res, size = cfg.resolutions[0], cfg.level_sizes[0]
    index, w = level_corners(x, res, size, True)
    want = torch.zeros_like(table)
    want[index[0], 0] = w[0]
    torch.testing.assert_close(table.grad, want)


@pytest.mark.parametrize("cfg", [SMALL, HashGridConfig(n_levels=8, log2_table_size=12, finest_resolution=256),
                                 HashGridConfig(n_levels=3, log2_table_size=16, base_resolution=4,
                                                finest_resolution=16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vectorized_matches_the_reference_values_and_gradients(cfg, dtype):
    g = torch.Generator().manual_seed(6)
    table = torch.randn(cfg.n_entries, cfg.n_features, generator=g, dtype=dtype)
    x = torch.rand(400, 3, generator=g, dtype=dtype)
    x[:5] = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.2, -0.1, 0.5], [0.5, 0.5, 0.5], [0.999, 0.0, 1.0]])
    grad_out = torch.randn(400, cfg.n_output_dims, generator=g, dtype=dtype)
    outs, grads = [], []
    for encode in (hash_encode_reference, hash_encode_vectorized):
        t = table.clone().requires_grad_()
        y = encode(x, t, cfg)
        (y * grad_out).sum().backward()
        outs.append(y.detach())
        grads.append(t.grad)
    assert bool((grads[0] != 0).any())  # the comparison is not of two zeros
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(outs[1], outs[0], atol=tol, rtol=tol)
    torch.testing.assert_close(grads[1], grads[0], atol=tol, rtol=tol)
    # the torch backend of the public function is the vectorized path
    torch.testing.assert_close(hash_encode(x, table, cfg, backend="torch"), outs[1])


@needs_triton
def test_triton_forward_and_backward_match_the_reference():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = SMALL
    g = torch.Generator().manual_seed(5)
    table = torch.randn(cfg.n_entries, cfg.n_features, generator=g).to(dev)
    x = torch.rand(150, 3, generator=g)
    x[:4] = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.2, -0.1, 0.5], [0.5, 0.5, 0.5]])
    x = x.to(dev)
    grad_out = torch.randn(150, cfg.n_output_dims, generator=g).to(dev)
    outs, grads = [], []
    for backend in ("torch", "triton"):
        t = table.clone().requires_grad_()
        y = hash_encode(x, t, cfg, backend=backend)
        (y * grad_out).sum().backward()
        outs.append(y.detach())
        grads.append(t.grad)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)


def test_backend_errors_are_clear():
    cfg = SMALL
    with pytest.raises(ValueError, match="backend='bogus'"):
        hash_encode(torch.rand(4, 3), torch.zeros(cfg.n_entries, 2), cfg, backend="bogus")
    with pytest.raises(ValueError, match=r"table has shape \[3, 2\]"):
        hash_encode(torch.rand(4, 3), torch.zeros(3, 2), cfg)
    with pytest.raises(ValueError, match=r"expected \[N, 3\]"):
        hash_encode(torch.rand(4, 2), torch.zeros(cfg.n_entries, 2), cfg)
    with pytest.raises(ValueError, match="log2_table_size"):
        HashGridConfig(log2_table_size=40)
