"""Monarch attention in pure torch. The readable twin of ``triton.py``, and the tests' ground truth.

MonarchAttention by Yaras et al., 2025, replaces ``softmax(q k^T / sqrt(D))`` by the Monarch matrix that best
fits it. A few alternating closed-form updates find it. MonarchRT aligns the blocks with the video grid. Here
the video grid is ``(F, Hh, Ww)``. Tokens are in row-major f, y, x order, diffusers' patchified order::

    token n = (f * Hh + y) * Ww + x  =  l * b + j      l = f * Hh + y   which frame row   (M = F * Hh rows)
                                                         j = x            where in the row  (b = Ww columns)

and the attention of query ``(l, j)`` on key ``(k, i)`` is approximated by::

    A[(l, j), (k, i)] = L[j, k, l] * R[k, j, i]        sum_k L[j, k, l] = 1,  sum_i R[k, j, i] = 1

- ``R[k, j, :]``: within a row. For key row ``k`` it is a distribution over its columns ``i``. It depends on
  the query only through the query's column ``j``. That makes b blocks of size b x b per row: ``M * b * b``.
- ``L[j, :, l]``: across rows. For query ``l, j`` it is a distribution over the ``M`` rows ``k``. That makes b
  blocks of size M x M: ``b * M * M``.

So ``A = P_b L P_a R`` with two block-diagonal factors. ``R`` has blocks per key row. ``L`` has blocks per
column. The row/column transposition permutations lie between them. Rows of ``A`` sum to one. The total size
is ``N (M + b)``. With ``M ~ b ~ sqrt(N)`` everything below costs ``Theta(N sqrt(N) D)``.

The fit maximises ``sum_rows <A_row, S_row> + entropy(A_row)`` over Monarch ``A``. ``S`` is the scaled
scores. Softmax is the unconstrained maximiser. So an exactly Monarch-structured softmax is recovered. Each
factor has a closed form given the other, with ``scale = 1 / sqrt(D)``::

    init    L[j, k, l] = [k == l]                                 (R is then block-diagonal attention)
    R step  a_R[k, j] = sum_l L[j, k, l] q[l, j]                  [M, b, D]
            c_R[k, j] = sum_l L[j, k, l]
            R[k, j, :] = softmax_i(scale * a_R[k, j] . k[k, i] / c_R[k, j])
    L step  a_L[j, k] = sum_i R[k, j, i] k[k, i]                  [b, M, D]
            c_L[j, k] = sum_i R[k, j, i] log R[k, j, i]           (negative entropy of R's row)
            L[j, :, l] = softmax_k(scale * q[l, j] . a_L[j, k] - c_L[j, k])
    output  y[k, j] = sum_i R[k, j, i] v[k, i];  out[l, j] = sum_k L[j, k, l] y[k, j]

``num_iters`` counts pairs of R step and L step. With ``block_causal``, query frame ``f(l) = l // Hh`` may
see key frame ``f(k) = k // Hh`` only if ``f(k) <= f(l)``. A row never spans two frames. So the mask depends
on ``l, k`` only. It enters the two updates as follows:

- L step: logits on future rows are ``-inf``. Those are rows with ``f(k) > f(l)``. So ``L`` is exactly zero
  wherever the mask is, and with it ``A``. ``R`` lies inside one row and one frame. It needs no mask.
- R step: the sums over queries ``l`` run over the key row's *own frame* only, where ``f(l) == f(k)``. They
  do not run over every query allowed to see it. Otherwise, from the second iteration on, ``R`` of an early
  row would be fitted to later frames' queries. Their ``L`` depends on later keys. Future frames would leak
  into early outputs. Restricted this way, everything about frame ``f`` depends on frames ``<= f`` only. That
  covers its rows' ``R``, ``a_L``, ``c_L`` and ``y``. It follows by induction over frames. Autoregressive
  generation needs this. Those per-row quantities are what a frame cache would keep. An exactly
  Monarch-structured softmax is still recovered. Its ``R`` does not depend on the query row.

All maths is fp32. Only the block factors are materialised. Per head ``L`` holds ``b * M * M`` and ``R``
holds ``M * b * b``. The ``N x N`` matrix never is, except in :func:`monarch_matrix` for tests on small N.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

C_MIN = 1e-20  # floor of c_R: a row no query looks at (c_R == 0) gets a uniform R instead of 0/0


class MonarchFactors(NamedTuple):
    """The two block-diagonal fp32 factors of the fitted Monarch matrix.

    L: ``[B, H, b, M, M]``. ``L[..., j, k, l]`` is the weight of key row ``k`` for query ``l, j``.
    R: ``[B, H, M, b, b]``. ``R[..., k, j, i]`` is the weight of column ``i`` of key row ``k`` for query
    column ``j``.
    """

    L: torch.Tensor
    R: torch.Tensor


def row_split(grid: tuple[int, int, int]) -> tuple[int, int]:
    """``M, b`` of a ``(F, Hh, Ww)`` grid: its number of rows ``F * Hh`` and tokens per row ``Ww``."""
    frames, height, width = grid
    return frames * height, width


def row_causal_mask(grid: tuple[int, int, int], device=None) -> torch.Tensor:
    """Bool ``allowed [M, M]``, indexed ``[l, k]``: query row ``l`` may see key row ``k``.

    It may when key row ``k`` lies in the same or an earlier frame.
    """
    frames, height, _ = grid
    frame = torch.arange(frames * height, device=device) // height
    return frame[None, :] <= frame[:, None]


def row_same_frame(grid: tuple[int, int, int], device=None) -> torch.Tensor:
    """Float ``[M, M]``: 1 where rows ``l`` and ``k`` lie in the same frame. These are the causal R step's queries."""
    frames, height, _ = grid
    frame = torch.arange(frames * height, device=device) // height
    return (frame[None, :] == frame[:, None]).float()


def token_causal_mask(grid: tuple[int, int, int], device=None) -> torch.Tensor:
    """Bool ``allowed [N, N]``, indexed ``[query, key]``: key frame <= query frame."""
    frames, height, width = grid
    frame = torch.arange(frames * height * width, device=device) // (height * width)
    return frame[None, :] <= frame[:, None]


def monarch_factors(
    q: torch.Tensor, k: torch.Tensor, grid: tuple[int, int, int], num_iters: int = 1, block_causal: bool = False
) -> MonarchFactors:
    """Fit the Monarch factors to ``softmax(q k^T / sqrt(D))``.

    q and k are ``[B, H, N, D]``, with ``N = F * Hh * Ww``.
    """
    Bt, H, N, D = q.shape
    M, b = row_split(grid)
    scale = D ** -0.5
    qb = q.float().view(Bt, H, M, b, D)  # q[l, j]
    kb = k.float().view(Bt, H, M, b, D)  # k[k, i]
    allowed = row_causal_mask(grid, q.device) if block_causal else None  # [l, k]
    same_frame = row_same_frame(grid, q.device) if block_causal else None  # [l, k] (symmetric)

    L = torch.eye(M, device=q.device).expand(Bt, H, b, M, M)  # L[j, k, l] = [k == l]
    for _ in range(num_iters):
        R = _r_step(qb, kb, L if same_frame is None else L * same_frame, scale)
        L = _l_step(qb, kb, R, scale, allowed)
    return MonarchFactors(L=L, R=R)


def _r_step(qb, kb, L, scale):
    """``R[k, j, :] = softmax_i(scale * a_R[k, j] . k[k, i] / c_R[k, j])``. Returns ``[B, H, M, b, b]``.

    ``L [B, H, b, M(k), M(l)]`` is the column factor. In causal fits it is zeroed on the queries to ignore.
    """
    a_R = torch.einsum("...jkl,...ljd->...kjd", L, qb)  # [B, H, M, b, D]
    c_R = L.sum(dim=-1).transpose(-1, -2)  # [B, H, M(k), b(j)]
    logits = torch.einsum("...kjd,...kid->...kji", a_R, kb) * (scale / c_R.clamp_min(C_MIN))[..., None]
    return torch.softmax(logits, dim=-1)


def _l_step(qb, kb, R, scale, allowed):
    """``L[j, :, l] = softmax_k(scale * q[l, j] . a_L[j, k] - c_L[j, k])``. Returns ``[B, H, b, M, M]``."""
    a_L = torch.einsum("...kji,...kid->...jkd", R, kb)  # [B, H, b, M, D]
    c_L = torch.special.xlogy(R, R).sum(dim=-1).transpose(-1, -2)  # [B, H, b(j), M(k)]
    logits = scale * torch.einsum("...jkd,...ljd->...jkl", a_L, qb) - c_L[..., None]  # [B, H, b, M(k), M(l)]
    if allowed is not None:
        logits = logits.masked_fill(~allowed.T, float("-inf"))  # allowed.T[k, l]
    return torch.softmax(logits, dim=-2)


def apply_monarch(factors: MonarchFactors, v: torch.Tensor) -> torch.Tensor:
    """fp32 ``out [B, H, N, Dv]``: the Monarch matrix times ``v [B, H, N, Dv]``, through the factors."""
    L, R = factors
    Bt, H, b, M, _ = L.shape
    vb = v.float().view(Bt, H, M, b, v.shape[-1])
    y = torch.einsum("...kji,...kid->...kjd", R, vb)  # mix within each key row: [B, H, M, b, Dv]
    out = torch.einsum("...jkl,...kjd->...ljd", L, y)  # mix across rows, column by column: [B, H, M, b, Dv]
    return out.reshape(Bt, H, M * b, -1)


def monarch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grid: tuple[int, int, int],
    num_iters: int = 1,
    block_causal: bool = False,
) -> torch.Tensor:
    """Monarch attention of ``q, k [B, H, N, D]`` and ``v [B, H, N, Dv]``.

    Returns ``[B, H, N, Dv]`` in q's dtype. The maths is fp32.
    """
    factors = monarch_factors(q, k, grid, num_iters, block_causal)
    return apply_monarch(factors, v).to(q.dtype)


def monarch_matrix(factors: MonarchFactors) -> torch.Tensor:
    """The dense ``[B, H, N, N]`` Monarch matrix ``A[(l, j), (k, i)] = L[j, k, l] R[k, j, i]``. Small N only."""
    L, R = factors
    Bt, H, b, M, _ = L.shape
    dense = torch.einsum("...jkl,...kji->...ljki", L, R)  # [B, H, M(l), b(j), M(k), b(i)]
    return dense.reshape(Bt, H, M * b, M * b)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grid: tuple[int, int, int] | None = None,
    block_causal: bool = False,
) -> torch.Tensor:
    """Exact ``softmax(q k^T / sqrt(D)) v`` in fp32, returned in q's dtype.

    With ``block_causal`` it is block-causal over the frames of ``grid``.
    """
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if block_causal:
        scores = scores.masked_fill(~token_causal_mask(grid, q.device), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)
