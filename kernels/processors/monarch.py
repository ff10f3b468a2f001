"""``MonarchAttnProcessor``: Monarch attention in diffusers' Wan-style softmax video transformers.

A drop-in for ``WanAttnProcessor`` on the self-attention ``attn1`` of every ``WanTransformerBlock`` in
``diffusers.WanTransformer3DModel``. The cross-attention ``attn2`` keeps its stock processor::

    from framegraph.kernels.processors import install_monarch_processors

    # grid (frames, height, width) after patching, read from each forward's latents and the model's
    # patch_size by a forward pre-hook on the model:
    procs = install_monarch_processors(model, num_iters=2)
    # or fixed: latents [B, C, 21, 60, 104] with patch (1, 2, 2) -> grid (21, 30, 52)
    procs = install_monarch_processors(model, grid=(21, 30, 52), num_iters=2)
    # exact=True: the stock maths (SDPA), for A/B checks — outputs equal to the stock model's
    procs = install_monarch_processors(model, exact=True)

The projections, RMS norms and rotary embedding are the stock processor's. The rotary embedding rotates
interleaved pairs, as Wan's ``apply_rotary_emb`` does. Only ``softmax(q k^T / sqrt(D)) v`` is replaced. It
becomes :func:`~framegraph.kernels.monarch_attention.monarch_attention` over the token grid.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..backend import Backend
from ..monarch_attention import monarch_attention
from .common import AttnProcessor

__all__ = ["MonarchAttnProcessor", "install_monarch_processors", "grid_from_latents"]

STOCK_PROCESSOR = "WanAttnProcessor"


class MonarchAttnProcessor(AttnProcessor):
    """Wan self-attention with Monarch attention over the token grid of frames, height and width.

    Args:
        grid: ``(F, Hh, Ww)`` after patching. ``F * Hh * Ww`` is the sequence length. It is ``None`` until
            set. ``install_monarch_processors`` without ``grid`` sets it before every model call.
        num_iters: Monarch fitting iterations, as in ``monarch_attention``.
        block_causal: frames attend only to their own and earlier frames.
        exact: compute exact softmax attention instead. That is the stock processor's maths, with the same
            outputs.
        backend: kernel backend, ``"auto" | "triton" | "torch"``.
    """

    def __init__(
        self,
        grid: tuple[int, int, int] | None = None,
        *,
        num_iters: int = 1,
        block_causal: bool = False,
        exact: bool = False,
        backend: Backend = "auto",
    ) -> None:
        if grid is not None and (len(tuple(grid)) != 3 or any(int(g) != g or g <= 0 for g in grid)):
            raise ValueError(f"MonarchAttnProcessor: grid={grid!r}; expected (frames, height, width) positive ints")
        if isinstance(num_iters, bool) or not isinstance(num_iters, int) or num_iters < 1:
            raise ValueError(f"MonarchAttnProcessor: num_iters={num_iters!r}; expected an int >= 1")
        self.grid = tuple(int(g) for g in grid) if grid is not None else None
        self.num_iters = num_iters
        self.block_causal = block_causal
        self.exact = exact
        self.backend = backend

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary_emb=None) -> torch.Tensor:
        """Monarch attention of ``q, k, v [B, H, N, D]`` over the grid. SDPA when ``exact``."""
        if self.exact:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)
        if self.grid is None:
            raise ValueError(
                "MonarchAttnProcessor: grid is unknown; pass grid=(frames, height, width) after patching, "
                "or install with install_monarch_processors(model) to read it from each call's latents"
            )
        return monarch_attention(q, k, v, grid=self.grid, num_iters=self.num_iters, block_causal=self.block_causal,
                                 backend=self.backend)


def grid_from_latents(latents_shape, patch_size) -> tuple[int, int, int]:
    """``(F, Hh, Ww)`` for latents ``[B, C, frames, height, width]``.

    The latents are patchified by ``patch_size=(p_t, p_h, p_w)``.
    """
    _, _, frames, height, width = latents_shape
    p_t, p_h, p_w = patch_size
    return frames // p_t, height // p_h, width // p_w


def install_monarch_processors(
    model: torch.nn.Module, grid: tuple[int, int, int] | None = None, **kwargs
) -> dict[str, MonarchAttnProcessor]:
    """Give every self-attention ``WanAttnProcessor`` of ``model`` its own ``MonarchAttnProcessor``.

    Each is built as ``MonarchAttnProcessor(grid, **kwargs)``. Cross-attention layers keep their processors.
    With ``grid=None`` a forward pre-hook on ``model`` sets each processor's grid. It reads the call's latents
    ``[B, C, F, H, W]`` and ``model.config.patch_size``. Installing again replaces that hook. Returns the new
    processors by module name.
    """
    installed = {}
    for name, module in model.named_modules():
        processor = getattr(module, "processor", None)
        if processor is None or type(processor).__name__ not in (STOCK_PROCESSOR, MonarchAttnProcessor.__name__):
            continue
        if getattr(module, "is_cross_attention", False):
            continue
        module.set_processor(MonarchAttnProcessor(grid, **kwargs))
        installed[name] = module.processor
    if not installed:
        raise ValueError(
            f"install_monarch_processors: {type(model).__name__} has no self-attention {STOCK_PROCESSOR} to replace"
        )

    old_hook = getattr(model, "_monarch_grid_hook", None)
    if old_hook is not None:
        old_hook.remove()
        model._monarch_grid_hook = None
    if grid is None:
        patch_size = tuple(model.config.patch_size)
        processors = list(installed.values())

        def set_grid(module, args, kwargs):
            latents = args[0] if args else kwargs["hidden_states"]
            new_grid = grid_from_latents(latents.shape, patch_size)
            for p in processors:
                p.grid = new_grid

        model._monarch_grid_hook = model.register_forward_pre_hook(set_grid, with_kwargs=True)
    return installed
