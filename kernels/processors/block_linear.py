"""``BlockLinearAttnProcessor``: diffusers' Sana-Video linear attention on framegraph's block-causal kernel.

A drop-in for ``SanaLinearAttnProcessor3_0``. That is the self-attention ``attn1`` of every
``SanaVideoTransformerBlock`` in ``diffusers.SanaVideoTransformer3DModel``::

    from framegraph.kernels.processors import BlockLinearAttnProcessor, install_block_linear_processors

    # Same outputs as the stock model (one block = the whole sequence, no state):
    procs = install_block_linear_processors(model)

    # Block-causal, streaming: tokens attend within their block and to every earlier block, including
    # blocks of previous calls (one state per attention layer, held by that layer's processor).
    # stream_rope=True also numbers each chunk's frames from where the stream is (see below).
    tokens_per_frame = (height // p_h) * (width // p_w)
    procs = install_block_linear_processors(model, block_size=tokens_per_frame, stateful=True, stream_rope=True)
    for chunk in stream:                       # each chunk: whole latent frames (whole blocks), in order
        for step in denoising_steps:           # re-read the same past while denoising a chunk ...
            set_update_state(procs, False)
            model(chunk, ...)
        set_update_state(procs, True)          # ... and append the chunk once (e.g. the clean pass)
        model(chunk_clean, ...)
    reset_block_linear_state(procs)            # barge-in / new stream

State semantics: with ``stateful=True`` each call continues the stream held in ``processor.state``. That is
a :class:`~framegraph.kernels.block_linear_attention.LinearAttentionState`. It is detached fp32
``[B, H, Dv, D]`` + ``[B, H, D]``. Its memory does not depend on stream length. ``processor.tokens_seen``
counts the tokens appended. ``update_state=False`` reads the state without advancing it. ``reset()`` forgets
it.

RoPE positions must be absolute in the stream. The stock model recomputes its rotary table from frame 0 on
every call. ``stream_rope=True`` replaces ``model.rope``, diffusers' ``WanRotaryPosEmbed``. In its place goes a
:class:`~framegraph.kernels.processors.StreamingRotaryPosEmbed`. It returns the stock table's rows for frames
``[offset, offset + F)``, with ``offset = tokens_seen // tokens_per_frame``. The offset advances by a chunk's
frames exactly when that chunk is appended, with ``update_state=True``. It stays during read-only passes. It
is 0 again after ``reset_block_linear_state``. Past the table's end it raises ``ValueError`` naming both
numbers. The end is the model's ``rope_max_seq_len`` frames. Installing again without ``stream_rope`` puts the
stock module back.

The rest of the stock model is not causal in time. The feed-forward ``GLUMBTempConv`` mixes each frame with
its neighbours on both sides through ``conv_temp``. So a streamed model matches the block-causal full-sequence
model only where that convolution is zero. ``tests/test_kernels_processors.py`` checks this.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from ..backend import Backend
from ..block_linear_attention import LinearAttentionState, block_linear_attention
from .common import AttnProcessor
from .streaming_rope import StreamingRotaryPosEmbed

__all__ = [
    "BlockLinearAttnProcessor",
    "install_block_linear_processors",
    "reset_block_linear_state",
    "set_update_state",
]

STOCK_PROCESSOR = "SanaLinearAttnProcessor3_0"


class BlockLinearAttnProcessor(AttnProcessor):
    """Sana-Video ReLU linear attention, block-causal, with an optional per-layer streaming state.

    Args:
        block_size: tokens per block, such as the tokens per latent frame. With ``None`` the whole
            sequence is one block. That reproduces ``SanaLinearAttnProcessor3_0``.
        stateful: carry a :class:`LinearAttentionState` from call to call, as the module docs say.
        update_state: when ``stateful``, advance the state past this call's tokens. ``False`` reads only.
        backend: kernel backend, ``"auto" | "triton" | "torch"``.
        eps: denominator epsilon. The diffusers default is ``1e-15``.
    """

    def __init__(
        self,
        block_size: int | None = None,
        *,
        stateful: bool = False,
        update_state: bool = True,
        backend: Backend = "auto",
        eps: float = 1e-15,
    ) -> None:
        if block_size is not None and (not isinstance(block_size, int) or block_size <= 0):
            raise ValueError(f"BlockLinearAttnProcessor: block_size={block_size!r}; expected a positive int or None")
        self.block_size = block_size
        self.stateful = stateful
        self.update_state = update_state
        self.backend = backend
        self.eps = eps
        self.state: LinearAttentionState | None = None
        self.tokens_seen = 0  # tokens appended to the stream: the stream position

    def reset(self) -> None:
        """Forget the stream: the next call starts from an empty past, at position 0."""
        self.state = None
        self.tokens_seen = 0

    cast_to_input_dtype = True  # as SanaLinearAttnProcessor3_0

    def check_call(self, hidden_states, encoder_hidden_states, attention_mask) -> None:
        """Allow cross-attention, with keys and values from ``encoder_hidden_states``.

        ``attention_mask`` is ignored, as by the stock processor.
        """

    def heads(self, attn, hidden_states, encoder_hidden_states, rotary_emb) -> tuple[torch.Tensor, ...]:
        """The stock processor's projections and optional norms, split into heads ``[B, H, N, D]``.

        The rotary embedding is applied inside the kernel, to the features.
        """
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        return tuple(t.unflatten(2, (attn.heads, -1)).transpose(1, 2) for t in (query, key, value))

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rotary_emb=None) -> torch.Tensor:
        """Block-causal linear attention ``[B, H, N, Dv]``.

        If stateful, it continues the stream and may advance it.
        """
        rope = None
        if rotary_emb is not None:
            rope = tuple(t.transpose(1, 2) for t in rotary_emb)  # [1, N, 1, D] -> [1, 1, N, D]

        n_tokens = query.shape[2]
        state = self.state if self.stateful else None
        if state is not None and state.kv.shape[0] != query.shape[0]:
            raise ValueError(
                f"BlockLinearAttnProcessor: batch size {query.shape[0]} differs from the streamed state's "
                f"{state.kv.shape[0]}; call reset() to start a new stream"
            )
        out, new_state = block_linear_attention(
            query, key, value,
            block_size=self.block_size or n_tokens,
            rope=rope,
            state=state,
            eps=self.eps,
            backend=self.backend,
        )
        if self.stateful and self.update_state:
            if self.state is None or self.state.kv.shape != new_state[0].shape:
                self.state = LinearAttentionState(*(t.detach() for t in new_state))
            else:  # in place: the state keeps its storage, where a captured CUDA graph reads it
                self.state.kv.copy_(new_state[0])
                self.state.k_sum.copy_(new_state[1])
            self.tokens_seen += n_tokens
        return out


def install_block_linear_processors(
    model: torch.nn.Module, *, stream_rope: bool = False, **kwargs
) -> dict[str, BlockLinearAttnProcessor]:
    """Replace every ``SanaLinearAttnProcessor3_0`` in ``model`` with its own ``BlockLinearAttnProcessor``.

    Each is built as ``BlockLinearAttnProcessor(**kwargs)``. There is one processor per attention layer, so
    each layer keeps its own state. Cross-attention processors are left alone. ``stream_rope=True`` needs
    ``stateful=True``. It also wraps ``model.rope`` in a :class:`StreamingRotaryPosEmbed`. That reads these
    processors' stream position. Otherwise the stock ``model.rope`` is in place, put back if needed. Returns
    the new processors by module name.
    """
    if stream_rope and not kwargs.get("stateful", False):
        raise ValueError("install_block_linear_processors: stream_rope=True needs stateful=True (a stream)")
    installed = {}
    for name, module in model.named_modules():
        processor = getattr(module, "processor", None)
        if processor is not None and type(processor).__name__ in (STOCK_PROCESSOR, BlockLinearAttnProcessor.__name__):
            module.set_processor(BlockLinearAttnProcessor(**kwargs))
            installed[name] = module.processor
    if not installed:
        raise ValueError(f"install_block_linear_processors: {type(model).__name__} has no {STOCK_PROCESSOR} to replace")
    rope = getattr(model, "rope", None)
    if isinstance(rope, StreamingRotaryPosEmbed):
        model.rope = rope = rope.rope  # the stock table back; a streaming one below follows the new processors
    if stream_rope:
        if rope is None:
            raise ValueError(f"install_block_linear_processors: stream_rope=True; {type(model).__name__} has no rope")
        model.rope = StreamingRotaryPosEmbed(rope, installed.values())
    return installed


def reset_block_linear_state(
    processors: dict[str, BlockLinearAttnProcessor] | Iterable[BlockLinearAttnProcessor]
) -> None:
    for processor in processors.values() if isinstance(processors, dict) else processors:
        processor.reset()


def set_update_state(
    processors: dict[str, BlockLinearAttnProcessor] | Iterable[BlockLinearAttnProcessor], update: bool
) -> None:
    for processor in processors.values() if isinstance(processors, dict) else processors:
        processor.update_state = update
