"""``StreamingRotaryPosEmbed``: the Sana-Video / Wan rotary table for frames later in a stream.

The diffusers ``WanRotaryPosEmbed`` is ``SanaVideoTransformer3DModel.rope``. It always numbers the latent
frames of a call from 0. When a model is streamed chunk by chunk, the frames of chunk ``c`` are really frames
``[offset, offset + F)`` of the stream. This module returns the stock module's ``cos, sin`` rows for exactly
those positions. It reads them from the stock module's own ``freqs_cos`` / ``freqs_sin`` buffers. They keep
the same dtype, device and ``[1, N, 1, D]`` layout. Height and width positions are unchanged.

The offset is not stored here. It is the stream position of the attention processors it was given, divided by
the tokens per frame. That position is their ``tokens_seen``. It advances only when a call appends to its state.
So the offset advances exactly on appending passes. It stays put on read-only ones. It returns to 0 on
``reset()``.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["StreamingRotaryPosEmbed"]


class StreamingRotaryPosEmbed(torch.nn.Module):
    """Drop-in for a ``WanRotaryPosEmbed`` whose frame positions continue across calls.

    Args:
        rope: the model's stock ``WanRotaryPosEmbed``. It is kept as ``self.rope``. Its buffers are used as is.
        processors: objects with ``tokens_seen``, the tokens already appended to the stream. The model's
            stateful :class:`~framegraph.kernels.processors.BlockLinearAttnProcessor` s are such objects.
            All must agree. When empty, the offset is 0 unless passed to :meth:`forward`.
    """

    def __init__(self, rope: torch.nn.Module, processors: Iterable = ()) -> None:
        super().__init__()
        self.rope = rope
        self.processors = list(processors)
        self.static: tuple[torch.Tensor, torch.Tensor] | None = None  # while pinned: the buffers forward returns
        self._buffers_pinned: tuple[torch.Tensor, torch.Tensor] | None = None  # kept across unpin

    def pin(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute the table of the stream's current position into fixed buffers.

        The latents are shaped like ``hidden_states``. The buffers are allocated at the first call and refilled
        in place after, across :meth:`unpin`. The method :meth:`forward` then returns them as they are. A CUDA
        graph captured around the model reads the rows of whatever position the buffers hold. So the buffers
        must outlive the graph: a new pair only comes with a new shape.
        """
        self.static = None
        cos, sin = self.forward(hidden_states)
        kept = self._buffers_pinned
        if kept is None or (kept[0].shape, kept[0].dtype, kept[0].device) != (cos.shape, cos.dtype, cos.device):
            kept = self._buffers_pinned = (cos.clone(), sin.clone())
        else:
            kept[0].copy_(cos)
            kept[1].copy_(sin)
        self.static = kept
        return kept

    def unpin(self) -> None:
        """Compute the table at every call again. The buffers stay for the next :meth:`pin`."""
        self.static = None

    def stream_tokens(self) -> int:
        """Tokens appended to the stream so far. It is 0 for a fresh or reset stream."""
        positions = {p.tokens_seen for p in self.processors}
        if len(positions) > 1:
            raise ValueError(
                f"StreamingRotaryPosEmbed: attention layers are at different stream positions "
                f"{sorted(positions)} (tokens); append and reset them together (set_update_state, "
                f"reset_block_linear_state)"
            )
        return positions.pop() if positions else 0

    def forward(
        self, hidden_states: torch.Tensor, frame_offset: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary table for latents ``hidden_states [B, C, F, H, W]``. Only the shape is read.

        Returns ``cos, sin``, each ``[1, F' * H' * W', 1, D]``, with ``F' = F // p_t`` and so on. The rows are
        for frames ``[frame_offset, frame_offset + F')``. With ``frame_offset=None`` the offset comes from the
        stream position.
        """
        if self.static is not None:  # pinned, see pin: the rows of the position the buffers hold
            return self.static
        _, _, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.rope.patch_size
        ppf, pph, ppw = num_frames // p_t, height // p_h, width // p_w
        if frame_offset is None:
            tokens = self.stream_tokens()
            if tokens % (pph * ppw):
                raise ValueError(
                    f"StreamingRotaryPosEmbed: stream position {tokens} tokens is not a whole number of "
                    f"{pph * ppw}-token frames ({pph}x{ppw}); stream whole latent frames of one size"
                )
            frame_offset = tokens // (pph * ppw)
        end, max_seq_len = frame_offset + ppf, self.rope.max_seq_len
        if end > max_seq_len or max(pph, ppw) > max_seq_len:
            raise ValueError(
                f"StreamingRotaryPosEmbed: latent frames [{frame_offset}, {end}) of a {pph}x{ppw} grid run past "
                f"the rotary table's max_seq_len={max_seq_len} (the model's rope_max_seq_len); reset the "
                f"stream (reset_block_linear_state) or build the model with rope_max_seq_len >= {max(end, pph, ppw)}"
            )
        sizes = [self.rope.t_dim, self.rope.h_dim, self.rope.w_dim]

        def table(freqs: torch.Tensor) -> torch.Tensor:  # the stock forward, frame rows shifted
            f, h, w = freqs.split(sizes, dim=1)
            f = f[frame_offset:end].view(ppf, 1, 1, -1).expand(ppf, pph, ppw, -1)
            h = h[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1)
            w = w[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1)
            return torch.cat([f, h, w], dim=-1).reshape(1, ppf * pph * ppw, 1, -1)

        return table(self.rope.freqs_cos), table(self.rope.freqs_sin)
