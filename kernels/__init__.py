"""Kernels: one folder per op (``reference.py`` the readable twin, ``triton.py`` the fast path, the dispatch in its
``__init__.py``), and the diffusers attention processors built on them.

The index, by module (each imported when used)::

    from framegraph.kernels.block_linear_attention import block_linear_attention, LinearAttentionState, zero_state
    from framegraph.kernels.monarch_attention import monarch_attention, monarch_factors, MonarchFactors
    from framegraph.kernels.modulation import norm_modulate, gate_residual
    from framegraph.kernels.rope import apply_rope
    from framegraph.kernels.processors import install_block_linear_processors, install_monarch_processors
    from framegraph.kernels.backend import resolve_backend       # auto | triton | torch, per call

``tiles.py`` holds the Triton helpers the kernels share (not public).
"""

__all__ = ["backend", "block_linear_attention", "modulation", "monarch_attention", "processors", "rope"]
