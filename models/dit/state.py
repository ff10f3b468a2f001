"""``DiTStreamState``: everything :class:`~.model.AvatarDiT` remembers of a stream, in constant memory.

Per layer it holds the linear-attention state: fp32 ``kv [B, H, d, d]`` + ``k_sum [B, H, d]``.
These sum over every appended token, so their size does not depend on how long the stream has run.
Per layer it also holds the FFN's temporal cache, ``[B, k-1, n, D]``.
That cache is the features of the last ``temporal_kernel - 1`` frames.
For the whole model it holds the last ``audio_past_frames`` audio feature vectors.
It also holds the frame counter, which gives the RoPE positions.
The identity is constant for the stream: the reference latent and its per-layer cross-attention keys/values.

Only :meth:`AvatarDiT.append` advances the state. It works in place: tensors keep their storage.
So memory stays flat and addresses stay stable. Denoising calls read the state.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from framegraph.kernels.block_linear_attention import LinearAttentionState


@dataclass
class LayerStreamState:
    """One block's streamed past: ``attn``, the fp32 linear-attention sums, and ``ffn_cache [B, k-1, n, D]``."""

    attn: LinearAttentionState
    ffn_cache: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        return [self.attn.kv, self.attn.k_sum, self.ffn_cache]


@dataclass
class DiTStreamState:
    """The stream state of an :class:`~.model.AvatarDiT`. Build it with ``model.init_stream(ref)``.

    Attributes:
        ref: ``[B, C, h, w]`` reference latent of the portrait: the identity.
        ref_kv: per layer, the identity tokens' cross-attention keys/values ``([B, H, m, d], [B, H, m, d])``. None
            when the model has no identity tokens.
        layers: one :class:`LayerStreamState` per block.
        audio_history: ``[B, audio_past_frames, F]`` audio features of the last appended frames.
        frames: latent frames appended so far. It is the next chunk's first RoPE time position.
    """

    ref: torch.Tensor
    ref_kv: list[tuple[torch.Tensor, torch.Tensor] | None]
    layers: list[LayerStreamState]
    audio_history: torch.Tensor
    frames: int = 0

    @property
    def batch(self) -> int:
        return self.ref.shape[0]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds, the identity included."""
        out = [self.ref, self.audio_history]
        for layer in self.layers:
            out += layer.tensors()
        for kv in self.ref_kv:
            if kv is not None:
                out += list(kv)
        return out

    def nbytes(self) -> int:
        """Bytes held: constant over the stream's length."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def reset(self) -> None:
        """Forget the stream on barge-in. Zero the attention sums, caches and audio history; keep the identity.

        Works from any grad mode, also on a state built under ``torch.inference_mode()``.
        """
        with torch.inference_mode(self.audio_history.is_inference()):
            for layer in self.layers:
                for t in layer.tensors():
                    t.zero_()
            self.audio_history.zero_()
        self.frames = 0
