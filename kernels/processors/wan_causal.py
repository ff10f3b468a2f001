"""``WanCausalAttnProcessor``: Wan self-attention run block-causally over a stream.

It keeps a KV cache of the past. It is a drop-in for ``WanAttnProcessor`` on the self-attention ``attn1`` of
every ``WanTransformerBlock`` in ``diffusers.WanTransformer3DModel``. The cross-attention ``attn2`` keeps its
stock processor. The model is fed one *chunk* of latent frames per call, as in Self-Forcing and CausVid::

    from framegraph.kernels.processors import install_wan_causal_processors, set_update_state

    procs = install_wan_causal_processors(model, capacity_frames=12, sink_frames=3)  # attention="sdpa"
    for chunk in stream:                            # chunks of whole latent frames, all of one size
        set_update_state(procs, False)              # the denoising passes read the cache ...
        for t in timesteps:
            v = model(x_t, t, prompt_embeds).sample
        set_update_state(procs, True)               # ... the clean pass (t = 0) writes it
        model(x0, 0, prompt_embeds)
    for p in procs.values(): p.reset()              # a new stream

Attention: the chunk's queries see every key the cache holds and every key of their own chunk. Inside a
chunk attention is bidirectional. Across chunks it is causal. That is the "block-causal" mask with one block
per chunk. Per layer, the cache keeps the keys and values of the appended frames. They are taken after RMS
norm and rotary embedding. The first ``sink_frames`` of the stream stay for ever, as attention sinks. A
rolling window keeps the most recent ones. That makes ``capacity_frames`` in all, in fixed preallocated
storage.

- ``attention="sdpa"``: exact softmax attention of the chunk's queries on ``[cache, chunk]`` keys. With
  nothing evicted this is the stock model over the whole sequence with the block-causal mask.
- ``attention="monarch"``: :func:`~framegraph.kernels.monarch_attention.monarch_attention` with
  ``block_causal=True``. It runs over the grid ``(blocks, chunk_frames * Hh, Ww)`` of ``[cache, chunk]``.
  Each chunk is one causal block, so the causal structure is the same as SDPA's. Block-causal Monarch makes
  everything about a block depend on earlier blocks only. So the chunk's outputs equal exactly those of
  Monarch over the whole sequence with the same grid. That holds as long as nothing was evicted. The fit
  needs the past's queries too, so the cache also keeps them. The past's factors are refitted on every call.
  The cost grows with the cache, bounded by ``capacity_frames``. After an eviction the factors are fitted
  over the frames kept only. Unlike with SDPA, no full-sequence mask reproduces that.

RoPE positions are absolute in the stream. The install wraps ``model.rope`` in a
:class:`~framegraph.kernels.processors.StreamingRotaryPosEmbed`. It reads the processors' ``tokens_seen``,
the appended tokens. So the chunk's frames get rows ``[frames appended, + chunk)``. Cached keys keep the
positions they were appended with. A stream ends with a clear error at the rotary table's
``rope_max_seq_len`` latent frames.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..monarch_attention import monarch_attention
from .common import AttnProcessor
from .monarch import grid_from_latents
from .streaming_rope import StreamingRotaryPosEmbed

__all__ = ["KVCache", "RowsKVCache", "WanCausalAttnProcessor", "install_wan_causal_processors",
           "uninstall_wan_causal_processors"]

STOCK_PROCESSOR = "WanAttnProcessor"
ATTENTION = ("sdpa", "monarch")


class KVCache:
    """Keys and values of one attention layer's appended latent frames. For Monarch, also queries.

    Args:
        capacity_frames: appended frames kept: ``sink_frames`` + a rolling window of the most recent.
        sink_frames: the stream's first frames, never evicted.

    Storage is allocated by the first :meth:`write`. Then batch, heads, tokens per frame, head dim, chunk
    size, dtype and device are known. It never grows. ``k``, ``v`` and ``q`` are each
    ``[B, H, (capacity_frames + chunk_frames) * T, D]``, with ``T`` the tokens per latent frame. The last
    ``chunk_frames`` slots hold the chunk being denoised. So attention reads one contiguous view. Frames are
    kept in stream order: sinks first, then the window. ``frames`` counts the frames held. ``frames_seen``
    counts the frames ever appended: the stream position.
    """

    def __init__(self, capacity_frames: int, sink_frames: int = 0) -> None:
        for name, value, low in (("capacity_frames", capacity_frames, 1), ("sink_frames", sink_frames, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"KVCache: {name}={value!r}; expected an int >= {low}")
        if sink_frames >= capacity_frames:
            raise ValueError(
                f"KVCache: sink_frames={sink_frames} leaves no rolling window in capacity_frames={capacity_frames}; "
                f"expected sink_frames < capacity_frames"
            )
        self.capacity_frames = capacity_frames
        self.sink_frames = sink_frames
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.q: torch.Tensor | None = None
        self.tokens_per_frame: int | None = None
        self.chunk_frames: int | None = None
        self.frames = 0
        self.frames_seen = 0

    def reset(self) -> None:
        """Forget the stream. The storage is kept for reuse by a stream of the same layout."""
        self.frames = 0
        self.frames_seen = 0

    def held_frames(self) -> list[int]:
        """Stream indices of the frames held, in storage order: sinks, then the window."""
        sinks = min(self.frames, self.sink_frames)
        return list(range(sinks)) + list(range(self.frames_seen - (self.frames - sinks), self.frames_seen))

    def check_chunk(self, chunk_frames: int) -> None:
        """Raise unless a chunk of ``chunk_frames`` latent frames fits next to the sinks."""
        window = self.capacity_frames - self.sink_frames
        if chunk_frames > window:
            raise ValueError(
                f"KVCache: a {chunk_frames}-frame chunk does not fit the rolling window of {window} frames "
                f"(capacity_frames={self.capacity_frames} - sink_frames={self.sink_frames}); expected "
                f"capacity_frames >= sink_frames + {chunk_frames}"
            )

    def write(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tokens_per_frame: int, keep_queries: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Put a chunk's ``q, k, v [B, H, Nc, D]`` after the frames held. Return views of ``[held, chunk]``.

        Returns ``q_all, k_all, v_all``, each ``[B, H, (frames + chunk_frames) * T, D]``. ``q_all`` is ``None``
        unless ``keep_queries``. Nothing is appended. That is the job of :meth:`append`.
        """
        batch, heads, n_tokens, head_dim = k.shape
        if n_tokens % tokens_per_frame:
            raise ValueError(
                f"KVCache: the chunk has {n_tokens} tokens, not whole {tokens_per_frame}-token latent frames"
            )
        chunk_frames = n_tokens // tokens_per_frame
        layout = (batch, heads, tokens_per_frame, head_dim, chunk_frames, k.dtype, k.device, keep_queries)
        if self.k is None or layout != self._layout():
            if self.frames_seen:
                raise ValueError(
                    f"KVCache: chunk [B={batch}, H={heads}, {chunk_frames} frames x {tokens_per_frame} tokens, "
                    f"D={head_dim}, {k.dtype}, {k.device}] differs from this stream's "
                    f"[B={self.k.shape[0]}, H={self.k.shape[1]}, {self.chunk_frames} frames x "
                    f"{self.tokens_per_frame} tokens, D={self.k.shape[3]}, {self.k.dtype}, {self.k.device}]; "
                    f"reset() to start a new stream"
                )
            self.check_chunk(chunk_frames)
            slots = (self.capacity_frames + chunk_frames) * tokens_per_frame
            self.k = k.new_empty(batch, heads, slots, head_dim)
            self.v = v.new_empty(batch, heads, slots, v.shape[-1])
            self.q = q.new_empty(batch, heads, slots, head_dim) if keep_queries else None
            self.tokens_per_frame, self.chunk_frames = tokens_per_frame, chunk_frames
        start, end = self.frames * tokens_per_frame, (self.frames + chunk_frames) * tokens_per_frame
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        if keep_queries:
            self.q[:, :, start:end] = q
        return (self.q[:, :, :end] if keep_queries else None), self.k[:, :, :end], self.v[:, :, :end]

    def append(self) -> None:
        """Keep the chunk last written. Evict the oldest window frames beyond ``capacity_frames``."""
        self.frames += self.chunk_frames
        self.frames_seen += self.chunk_frames
        drop = self.frames - self.capacity_frames
        if drop > 0:
            T = self.tokens_per_frame
            first, kept = self.sink_frames * T, (self.capacity_frames - self.sink_frames) * T
            for buf in (self.k, self.v, self.q):
                if buf is not None:  # shift the window down over the evicted frames; the regions overlap: clone
                    buf[:, :, first:first + kept] = buf[:, :, first + drop * T:first + drop * T + kept].clone()
            self.frames = self.capacity_frames

    def attn_mask(self) -> None:
        """Every key :meth:`write` returned is a frame held or the chunk: no mask."""
        return None

    def _layout(self) -> tuple:
        return (
            self.k.shape[0], self.k.shape[1], self.tokens_per_frame, self.k.shape[3], self.chunk_frames,
            self.k.dtype, self.k.device, self.q is not None,
        )


class RowsKVCache:
    """One layer's KV caches of many streams, a row each, for one batched call.

    Args:
        capacity_frames / sink_frames: as :class:`KVCache`'s, the same for every row.
        k / v: ``[B, H, capacity_frames * T, D]``: each row's held frames first (sinks, then the window), in
            stream order, the rest padding.
        held: frames each row holds.

    :meth:`write` returns ``[past, chunk]``, the padding included, and :meth:`attn_mask` hides the padding. So the
    chunk's queries of row ``b`` see exactly what its own :class:`KVCache` holds. :meth:`append` keeps each row's
    chunk after its held frames and evicts the oldest window frames, as :class:`KVCache` does. The passed tensors
    are not changed. Positions are the caller's: the rows' rotary rows differ (a pinned table). SDPA only.
    """

    def __init__(self, capacity_frames: int, sink_frames: int, k: torch.Tensor, v: torch.Tensor, held: list[int]):
        self.capacity_frames, self.sink_frames = capacity_frames, sink_frames
        self.k, self.v, self.held = k, v, list(held)
        self.tokens_per_frame = k.shape[2] // capacity_frames
        self.frames_seen = 0  # the rows' own positions are the caller's
        self._chunk: tuple[torch.Tensor, torch.Tensor] | None = None

    def write(self, q, k, v, tokens_per_frame: int, keep_queries: bool):
        if keep_queries:
            raise ValueError("RowsKVCache: batched rows attend with SDPA; Monarch attention refits each stream's "
                             "past and is not batched")
        if tokens_per_frame != self.tokens_per_frame:
            raise ValueError(f"RowsKVCache: {tokens_per_frame}-token frames; the rows' past has "
                             f"{self.tokens_per_frame}-token frames")
        self._chunk = (k, v)
        return None, torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)

    def attn_mask(self) -> torch.Tensor:
        """``bool [B, 1, 1, S]``: True for each row's held frames and the chunk, False for its padding."""
        past, n = self.k.shape[2], self._chunk[0].shape[2]
        slots = torch.arange(past + n, device=self.k.device)
        held = torch.tensor(self.held, device=self.k.device)[:, None] * self.tokens_per_frame
        return ((slots[None] < held) | (slots[None] >= past))[:, None, None, :]

    def append(self) -> None:
        """Keep each row's last written chunk after its held frames; beyond the capacity, evict the oldest window
        frames."""
        T, (ck, cv) = self.tokens_per_frame, self._chunk
        sinks, window = self.sink_frames * T, (self.capacity_frames - self.sink_frames) * T
        chunk = ck.shape[2] // T
        k, v = self.k.clone(), self.v.clone()
        for b, h in enumerate(self.held):
            for dst, past, new in ((k, self.k, ck), (v, self.v, cv)):
                row = torch.cat([past[b, :, :h * T], new[b]], dim=1)
                if row.shape[1] > self.capacity_frames * T:
                    row = torch.cat([row[:, :sinks], row[:, row.shape[1] - window:]], dim=1)
                dst[b, :, :row.shape[1]] = row
            self.held[b] = min(h + chunk, self.capacity_frames)
        self.k, self.v = k, v


class WanCausalAttnProcessor(AttnProcessor):
    """Wan self-attention over ``[cache, chunk]``, block-causal by chunk. The module docs say more.

    Args:
        cache: this layer's :class:`KVCache`.
        attention: ``"sdpa"``, exact, or ``"monarch"``, Monarch attention block-causal by chunk.
        num_iters: Monarch fitting iterations.
        backend: Monarch kernel backend, ``"auto" | "triton" | "torch"``.
        update_state: append this call's chunk to the cache, as the clean pass does. ``False`` reads only.

    The ``grid`` is the call's chunk after patching, ``(F, Hh, Ww)``. The forward pre-hook of
    :func:`install_wan_causal_processors` sets it before every model call.
    """

    def __init__(
        self,
        cache: KVCache,
        *,
        attention: str = "sdpa",
        num_iters: int = 1,
        backend: str = "auto",
        update_state: bool = False,
    ) -> None:
        if attention not in ATTENTION:
            raise ValueError(f"WanCausalAttnProcessor: attention={attention!r}; expected one of {ATTENTION}")
        if isinstance(num_iters, bool) or not isinstance(num_iters, int) or num_iters < 1:
            raise ValueError(f"WanCausalAttnProcessor: num_iters={num_iters!r}; expected an int >= 1")
        self.cache = cache
        self.attention = attention
        self.num_iters = num_iters
        self.backend = backend
        self.update_state = update_state
        self.grid: tuple[int, int, int] | None = None

    @property
    def tokens_seen(self) -> int:
        """Tokens appended to the stream. The :class:`StreamingRotaryPosEmbed` reads it for the frame offset."""
        return self.cache.frames_seen * (self.cache.tokens_per_frame or 0)

    def reset(self) -> None:
        """Forget the stream: the next chunk starts at frame 0 with an empty past."""
        self.cache.reset()

    def check_call(self, hidden_states, encoder_hidden_states, attention_mask) -> None:
        super().check_call(hidden_states, encoder_hidden_states, attention_mask)
        if self.grid is None:
            raise ValueError(
                "WanCausalAttnProcessor: grid is unknown; install with install_wan_causal_processors(model), "
                "which sets it from each call's latents"
            )
        frames, height, width = self.grid
        if frames * height * width != hidden_states.shape[1]:
            raise ValueError(
                f"WanCausalAttnProcessor: {hidden_states.shape[1]} tokens; the grid {self.grid} has "
                f"{frames * height * width}"
            )

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary_emb=None) -> torch.Tensor:
        """The chunk's ``q, k, v [B, H, Nc, D]`` attend over ``[cache, chunk]``.

        Appends the chunk if ``update_state``.
        """
        frames, height, width = self.grid
        monarch = self.attention == "monarch"
        q_all, k_all, v_all = self.cache.write(q, k, v, height * width, keep_queries=monarch)  # [B, H, Np + Nc, D]
        if monarch:
            blocks = k_all.shape[2] // q.shape[2]
            if blocks * q.shape[2] != k_all.shape[2]:
                raise ValueError(
                    f"WanCausalAttnProcessor: Monarch attention groups the cache into whole {frames}-frame chunks; "
                    f"it holds {self.cache.frames} frames (sink_frames and capacity_frames must be multiples of "
                    f"the chunk's frames)"
                )
            out = monarch_attention(
                q_all, k_all, v_all, grid=(blocks, frames * height, width), num_iters=self.num_iters,
                block_causal=True, backend=self.backend,
            )[:, :, -q.shape[2]:]
        else:
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=self.cache.attn_mask())
        if self.update_state:
            self.cache.append()
        return out


def install_wan_causal_processors(
    model: torch.nn.Module,
    *,
    capacity_frames: int,
    sink_frames: int = 0,
    attention: str = "sdpa",
    num_iters: int = 1,
    backend: str = "auto",
) -> dict[str, WanCausalAttnProcessor]:
    """Give every self-attention of a ``WanTransformer3DModel`` a :class:`WanCausalAttnProcessor`.

    Each gets its own cache. The install also wraps ``model.rope`` in a :class:`StreamingRotaryPosEmbed` over
    these processors. It registers a forward pre-hook. The hook checks that each call's latents
    ``[B, C, F, H, W]`` are whole patches. It sets the processors' grid. Installing again replaces all three.
    Returns the processors by module name.
    """
    patch_size = tuple(model.config.patch_size) if hasattr(model, "config") else None
    if patch_size is None or getattr(model, "rope", None) is None:
        raise ValueError(
            f"install_wan_causal_processors: {type(model).__name__} has no config.patch_size or rope; "
            f"expected a diffusers WanTransformer3DModel"
        )
    uninstall_wan_causal_processors(model)
    rope = model.rope  # the stock table; a streaming one installed before was just taken off
    installed = {}
    for name, module in model.named_modules():
        processor = getattr(module, "processor", None)
        if type(processor).__name__ != STOCK_PROCESSOR or getattr(module, "is_cross_attention", False):
            continue
        module.set_processor(WanCausalAttnProcessor(
            KVCache(capacity_frames, sink_frames), attention=attention, num_iters=num_iters, backend=backend,
        ))
        installed[name] = module.processor
    if not installed:
        raise ValueError(
            f"install_wan_causal_processors: {type(model).__name__} has no self-attention {STOCK_PROCESSOR} to "
            f"replace; expected a diffusers WanTransformer3DModel"
        )
    model.rope = StreamingRotaryPosEmbed(rope, installed.values())
    processors = list(installed.values())

    def set_grid(module, args, kwargs):
        latents = args[0] if args else kwargs["hidden_states"]
        shape = tuple(latents.shape)
        if len(shape) != 5 or any(n % p for n, p in zip(shape[2:], patch_size)):
            raise ValueError(
                f"{type(module).__name__}: latents {shape}; expected [B, C, F, H, W] with F, H, W multiples of "
                f"the patch size {patch_size} (a chunk of whole latent frames)"
            )
        for p in processors:
            p.grid = grid_from_latents(shape, patch_size)

    model._wan_causal_hook = model.register_forward_pre_hook(set_grid, with_kwargs=True)
    return installed


def uninstall_wan_causal_processors(model: torch.nn.Module) -> None:
    """Put the stock ``WanAttnProcessor`` and rotary table back. On a stock model it does nothing."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    for module in model.modules():
        if isinstance(getattr(module, "processor", None), WanCausalAttnProcessor):
            module.set_processor(WanAttnProcessor())
    if isinstance(getattr(model, "rope", None), StreamingRotaryPosEmbed):
        model.rope = model.rope.rope
    hook = getattr(model, "_wan_causal_hook", None)
    if hook is not None:
        hook.remove()
        model._wan_causal_hook = None
