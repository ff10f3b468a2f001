"""Multiresolution hash encoding. :func:`hash_encode` dispatches to Triton on CUDA, or to the vectorized torch path.

- ``reference.py`` is the readable definition, level by level. :class:`HashGridConfig` there is the shape of a
  grid.
- ``vectorized.py`` is the same in one gather over all levels. It is the ``"torch"`` backend, CPU's default.
- ``triton.py`` holds the fused kernels. The Triton path is the custom op
  ``torch.ops.framegraph.nerf_hash_encode``. Its backward is ``nerf_hash_encode_backward``, for the gradient
  w.r.t. the table only.
"""
from __future__ import annotations

import torch
from torch import Tensor

from framegraph.kernels.backend import Backend, resolve_backend

from .reference import PRIMES, HashGridConfig, init_table, level_corners, spatial_hash
from .reference import hash_encode as hash_encode_reference
from .vectorized import hash_encode as hash_encode_vectorized

__all__ = ["HashGridConfig", "hash_encode", "hash_encode_reference", "hash_encode_vectorized", "init_table",
           "level_corners", "spatial_hash", "PRIMES"]

OP = "hash_encode"


def hash_encode(x01: Tensor, table: Tensor, cfg: HashGridConfig, *, meta: Tensor | None = None,
                backend: Backend = "auto") -> Tensor:
    """Encode points ``x01 [N, 3]`` in the unit cube ``[0, 1]^3`` → features ``[N, L * F]``. See ``reference.py``.

    Args:
        x01: positions normalised to the unit cube, and clamped there. No gradient flows to them.
        table: ``[cfg.n_entries, cfg.n_features]`` trainable features, float32.
        cfg: the grid's shape.
        meta: ``cfg.level_meta(device)``, if you have it cached. That saves a host-to-device copy per call.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``. Auto is Triton on CUDA, torch elsewhere. Torch is the
            vectorized path. The level-by-level reference is :func:`hash_encode_reference`.
    """
    if x01.dim() != 2 or x01.shape[-1] != 3:
        raise ValueError(f"{OP}: x01 has shape {list(x01.shape)}; expected [N, 3]")
    if table.shape != (cfg.n_entries, cfg.n_features):
        raise ValueError(f"{OP}: table has shape {list(table.shape)}; expected [{cfg.n_entries}, {cfg.n_features}]")
    if resolve_backend(backend, x01, table, op=OP) == "torch":
        return hash_encode_vectorized(x01, table, cfg)
    if meta is None:
        meta = cfg.level_meta(x01.device)
    return _hash_encode_op(x01.detach().float().contiguous(), table.contiguous(), meta.contiguous())


@torch.library.custom_op("framegraph::nerf_hash_encode", mutates_args=())
def _hash_encode_op(x01: Tensor, table: Tensor, meta: Tensor) -> Tensor:
    from . import triton as kernels

    return kernels.hash_encode_fwd(x01, table, meta)


@_hash_encode_op.register_fake
def _(x01, table, meta):
    return x01.new_empty((x01.shape[0], meta.shape[0] * table.shape[1]))


@torch.library.custom_op("framegraph::nerf_hash_encode_backward", mutates_args=())
def _hash_encode_backward_op(x01: Tensor, meta: Tensor, grad_out: Tensor, n_entries: int, n_features: int) -> Tensor:
    from . import triton as kernels

    return kernels.hash_encode_bwd(x01, meta, grad_out.contiguous(), n_entries, n_features)


@_hash_encode_backward_op.register_fake
def _(x01, meta, grad_out, n_entries, n_features):
    return grad_out.new_empty((n_entries, n_features))


def _setup_context(ctx, inputs, output):
    x01, table, meta = inputs
    ctx.save_for_backward(x01, meta)
    ctx.table_shape = tuple(table.shape)


def _backward(ctx, grad):
    x01, meta = ctx.saved_tensors
    grad_table = _hash_encode_backward_op(x01, meta, grad.float(), *ctx.table_shape)
    return None, grad_table, None


_hash_encode_op.register_autograd(_backward, setup_context=_setup_context)
