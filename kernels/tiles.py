"""Triton building blocks the kernels share.

They are ``@triton.jit`` helpers, inlined into each kernel.

- :func:`load_tile` / :func:`store_tile`: a ``[rows, BW]`` tile of a row-major view, masked at the edges.
  It is read as fp32 and written in the pointer's dtype.
- :func:`head`: a ``[B, H, ...]`` tensor's pointer moved to one batch and head.
"""
import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, s_row, s_col, rows, row_mask, width, BW: tl.constexpr):
    """``[len(rows), BW]`` fp32 tile of a row-major view with strides ``s_row``, ``s_col``.

    It is zero outside ``row_mask`` and the first ``width`` columns.
    """
    cols = tl.arange(0, BW)
    mask = row_mask[:, None] & (cols[None, :] < width)
    return tl.load(ptr + rows[:, None] * s_row + cols[None, :] * s_col, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(ptr, s_row, s_col, rows, row_mask, width, value, BW: tl.constexpr):
    """Store ``value [len(rows), BW]`` where :func:`load_tile` would read, in the pointer's dtype."""
    cols = tl.arange(0, BW)
    mask = row_mask[:, None] & (cols[None, :] < width)
    tl.store(ptr + rows[:, None] * s_row + cols[None, :] * s_col, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def head(ptr, bh, H, s_b, s_h):
    """``ptr`` moved to batch and head ``bh = b * H + h`` of a ``[B, H, ...]`` tensor.

    The tensor's strides are ``s_b`` and ``s_h``.
    """
    return ptr + (bh // H) * s_b + (bh % H) * s_h
