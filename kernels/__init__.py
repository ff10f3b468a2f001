"""Kernels: one folder per op, and the diffusers attention processors built on them.

In each folder ``reference.py`` is the readable twin and ``triton.py`` the fast path. The dispatch is in its
``__init__.py``.

The index, by module. Each is imported when used::

    from framegraph.kernels.block_linear_attention import block_linear_attention, LinearAttentionState, zero_state
    from framegraph.kernels.monarch_attention import monarch_attention, monarch_factors, MonarchFactors
    from framegraph.kernels.modulation import norm_modulate, gate_residual
    from framegraph.kernels.rope import apply_rope
    from framegraph.kernels.processors import install_block_linear_processors, install_monarch_processors
    from framegraph.kernels.backend import resolve_backend       # auto | triton | torch, per call

``tiles.py`` holds the Triton helpers the kernels share. It is not public.
"""

__all__ = ["backend", "block_linear_attention", "modulation", "monarch_attention", "processors", "rope"]
