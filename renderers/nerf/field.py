"""The radiance field: hash grid → density MLP → SH-encoded direction and geometry features → colour MLP.

Shapes follow instant-ngp's NeRF network:

- ``grid``: multiresolution hash encoding of the position, normalised to the AABB → ``[N, L * F]``. That is
  ``32`` with 16 levels × 2 features.
- ``density`` MLP: ``L * F → 64 → 16``. One hidden layer, ReLU, no biases. Output 0 is the log-density:
  ``sigma = trunc_exp(out[0])``, in 1 / world length. Outputs 1..15 are the geometry features.
- ``color`` MLP: ``16 + 15 → 64 → 64 → 3``, sigmoid → RGB in [0, 1]. The 16 are the SH of the view direction,
  degree 4.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from framegraph.kernels.backend import Backend

from .hash_encoding import HashGridConfig, hash_encode, init_table
from .mlp import init_weights, mlp

SH_DEGREE = 4  # bands 0..3: 16 coefficients (tiny-cuda-nn's "degree 4")
SH_DIMS = SH_DEGREE * SH_DEGREE


class _TruncExp(torch.autograd.Function):
    """``exp(x)`` whose gradient uses ``exp(min(x, 15))``. That is instant-ngp's guard against exploding grads."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.exp(x.clamp(max=15.0))


def trunc_exp(x: Tensor) -> Tensor:
    return _TruncExp.apply(x)


def sh_encode(dirs: Tensor) -> Tensor:
    """Real spherical harmonics of unit directions ``[N, 3]`` up to band 3 → ``[N, 16]``.

    The basis and signs are those of tiny-cuda-nn's ``SphericalHarmonics`` encoding. That encoding maps its
    [0, 1] inputs to [-1, 1] first. Here directions are taken as they are.
    """
    x, y, z = dirs.unbind(-1)
    xx, yy, zz = x * x, y * y, z * z
    return torch.stack([
        torch.full_like(x, 0.28209479177387814),
        -0.48860251190291987 * y,
        0.48860251190291987 * z,
        -0.48860251190291987 * x,
        1.0925484305920792 * x * y,
        -1.0925484305920792 * y * z,
        0.94617469575755997 * zz - 0.31539156525251999,
        -1.0925484305920792 * x * z,
        0.54627421529603959 * (xx - yy),
        0.59004358992664352 * y * (-3.0 * xx + yy),
        2.8906114426405538 * x * y * z,
        0.45704579946446572 * y * (1.0 - 5.0 * zz),
        0.3731763325901154 * z * (5.0 * zz - 3.0),
        0.45704579946446572 * x * (1.0 - 5.0 * zz),
        1.4453057213202769 * z * (xx - yy),
        0.59004358992664352 * x * (-xx + 3.0 * yy),
    ], dim=-1)


class NerfField(nn.Module):
    """Density and colour at world points inside ``aabb``.

    Args:
        grid: the hash grid's shape.
        aabb: ``(xmin, ymin, zmin, xmax, ymax, zmax)`` world box mapped to the grid's unit cube.
        hidden: hidden width of both MLPs. The fused kernel needs a power of two >= 16.
        n_geo_features: geometry features passed from the density to the colour MLP. Default 15.
        generator: for the initial weights, so fits are reproducible.

    Parameters, by safetensors key: ``grid.table [E, F]``, ``density.0 [L*F, H]``,
    ``density.1 [H, 1 + n_geo]``, ``color.0 [16 + n_geo, H]``, ``color.1 [H, H]``, ``color.2 [H, 3]``.
    """

    def __init__(self, grid: HashGridConfig, aabb: Sequence[float], hidden: int = 64, n_geo_features: int = 15,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.grid_config = grid
        self.hidden, self.n_geo_features = hidden, n_geo_features
        aabb_t = torch.as_tensor(aabb, dtype=torch.float32).reshape(6)
        if not bool((aabb_t[3:] > aabb_t[:3]).all()):
            raise ValueError(f"NerfField: aabb {aabb_t.tolist()} must be (min xyz, max xyz) with max > min")
        self.register_buffer("aabb", aabb_t, persistent=False)
        self.register_buffer("level_meta", grid.level_meta(), persistent=False)
        self.grid = nn.ParameterDict({"table": nn.Parameter(init_table(grid, generator))})
        dens = init_weights([grid.n_output_dims, hidden, 1 + n_geo_features], generator)
        col = init_weights([SH_DIMS + n_geo_features, hidden, hidden, 3], generator)
        self.density = nn.ParameterList([nn.Parameter(w) for w in dens])
        self.color = nn.ParameterList([nn.Parameter(w) for w in col])

    def normalize(self, x: Tensor) -> Tensor:
        """World points ``[N, 3]`` → the grid's unit cube. Not clamped."""
        return (x - self.aabb[:3]) / (self.aabb[3:] - self.aabb[:3])

    def query_density(self, x: Tensor, backend: Backend = "auto") -> tuple[Tensor, Tensor]:
        """``sigma [N]`` in 1 / world length, and geometry features ``[N, n_geo]``, at world points ``x [N, 3]``."""
        enc = hash_encode(self.normalize(x), self.grid["table"], self.grid_config, meta=self.level_meta,
                          backend=backend)
        h = mlp(enc, list(self.density), "none", backend=backend)
        return trunc_exp(h[:, 0]), h[:, 1:]

    def forward(self, x: Tensor, dirs: Tensor, backend: Backend = "auto") -> tuple[Tensor, Tensor]:
        """``sigma [N]`` and ``rgb [N, 3]`` in [0, 1] at world points ``x [N, 3]`` seen along unit ``dirs [N, 3]``."""
        sigma, geo = self.query_density(x, backend)
        rgb = mlp(torch.cat([sh_encode(dirs), geo], dim=-1), list(self.color), "sigmoid", backend=backend)
        return sigma, rgb
