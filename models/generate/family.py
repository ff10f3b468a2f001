"""Model families: what differs between the Wan 2.1 and SANA-Video streams, behind one small interface.

A family says which stock diffusers transformer class it streams and which VAE decodes it.
Both use ``AutoencoderKLWan``.
It says how attention is made block-causal, and how the cache of the past is kept and trimmed.
:meth:`Family.open` installs that into a loaded model and returns a :class:`CausalStream`.
That is the one interface the graph's :class:`~.stages.CausalDenoiser` uses::

    stream = FAMILIES["wan"].open(model, latent_size=(60, 104), chunk_frames=3)
    clean = stream.generate(noise, prompt_embeds, prompt_mask, timesteps=[1000, 750, 500, 250])
    stream.reset()

============  ====================================  ===========================================================
family        attention made block-causal by        cache of the past (trimmed how)
============  ====================================  ===========================================================
``wan``       :class:`~.wan.WanCausal`: KV cache    ``sink_frames`` + a rolling window, ``cache_frames`` latent
              per layer, SDPA or Monarch            frames per layer (the oldest window frames are evicted)
``sana``      :class:`~.sana.SanaVideoStream`:      a constant-size linear-attention sum per layer and the last
              block-linear attention + causal conv  frames of each feed-forward's temporal conv (nothing to trim)
============  ====================================  ===========================================================

Rotary positions count latent frames from the start of the stream.
The stock rotary table ends at the model's ``rope_max_seq_len``.
So a stream *re-anchors* before it gets there; see :meth:`CausalStream.reanchor`.
The past is forgotten, and the last few clean chunks are appended again from position 0.
So an endless stream keeps going with the same recent context.
For Wan that is what its window held.
The oldest chunk, appended again, replaces the old sink frames.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from diffusers import AutoencoderKLWan, SanaVideoTransformer3DModel, WanTransformer3DModel

from .sana import SanaVideoStream
from .wan import WanCausal

__all__ = ["FAMILIES", "SHIFT", "CausalStream", "Family", "SanaFamily", "SanaStream", "WanFamily", "WanStream",
           "warp_timesteps"]


SHIFT = 5.0  # the flow shift Wan 2.1 and its causal students (Self-Forcing, CausVid, LongLive) sample with


def warp_timesteps(timesteps: Sequence[float], shift: float = SHIFT) -> list[float]:
    """Nominal timesteps → the model timesteps a shifted flow schedule gives them.

    Nominal ones run 0..1000, e.g. ``[1000, 750, 500, 250]``.
    The map is ``t' = 1000 * shift * s / (1 + (shift - 1) * s)`` with ``s = t / 1000``.
    Self-Forcing's ``warp_denoising_step`` reads the same from the shifted scheduler table.
    For shift 5 it gives 1000, 937.5, 833.3, 625. ``shift = 1`` leaves them as they are.
    """
    if not shift > 0:
        raise ValueError(f"shift={shift}; expected a positive number (5 for Wan 2.1 students, 1 for none)")
    return [1000.0 * shift * (t / 1000.0) / (1.0 + (shift - 1.0) * (t / 1000.0)) for t in timesteps]


class CausalStream:
    """One stream of latent chunks: a family's streamer behind one interface.

    :class:`WanStream` and :class:`SanaStream` say how to generate, append and count with it.

    Args:
        streamer: a :class:`~.wan.WanCausal` or :class:`~.sana.SanaVideoStream` installed in ``model``.
        model: the stock transformer.
        chunk_frames: latent frames per chunk.
        anchor_chunks: clean chunks kept for :meth:`reanchor`. Memory is bounded to ``anchor_chunks`` chunks.
    """

    batched = False  # a stream on batching lanes (.batch) has open / close / cancel for its clients

    def __init__(self, streamer, model: torch.nn.Module, *, chunk_frames: int, anchor_chunks: int) -> None:
        self.streamer = streamer
        self.model = model
        self.chunk_frames = chunk_frames
        self.anchor_chunks = anchor_chunks
        self.max_frames = int(model.config.rope_max_seq_len)  # latent frames the rotary table numbers
        if chunk_frames * (anchor_chunks + 1) > self.max_frames:
            raise ValueError(
                f"{type(model).__name__}: rope_max_seq_len={self.max_frames} latent frames cannot hold "
                f"{anchor_chunks + 1} chunks of {chunk_frames} frames; use smaller chunks or a model with a longer "
                f"rotary table"
            )
        self.recent: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []  # (clean, embeds, mask)
        self.reanchors = 0
        self.compiled = False  # set by the compiled runtime (its warm-up then meets every state of the past)

    # ---- what a family's stream says --------------------------------------------------------------
    @property
    def frames_seen(self) -> int:
        """Latent frames appended since the stream or its last re-anchor started."""
        raise NotImplementedError

    def past_nbytes(self) -> int:
        """Bytes of the streamer's past: caches or sums."""
        raise NotImplementedError

    def _generate(self, noise, embeds, mask, timesteps, renoise, generator) -> torch.Tensor:
        raise NotImplementedError

    def _append(self, clean, embeds, mask) -> None:
        raise NotImplementedError

    def warm_chunks(self) -> int:
        """Chunks that take the stream through every state of its past. A warm-up runs them.

        Here it is 2: the first chunk, with no past, and one with a past.
        """
        return 2

    # ---- the stream -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the stream: the next chunk is frame 0 of a new one."""
        self.streamer.reset()
        self.recent = []

    def reanchor(self) -> None:
        """Forget the past and append the kept recent chunks again from position 0; see the module docs."""
        self.streamer.reset()
        for clean, embeds, mask in self.recent:
            self._append(clean, embeds, mask)
        self.reanchors += 1

    def state_nbytes(self) -> int:
        """Bytes of the stream's past: the streamer's and the chunks kept for re-anchoring."""
        kept = sum(t.numel() * t.element_size() for chunk in self.recent for t in chunk if t is not None)
        return self.past_nbytes() + kept

    @torch.no_grad()
    def generate(
        self,
        noise: torch.Tensor,
        prompt_embeds: torch.Tensor,
        prompt_mask: torch.Tensor | None = None,
        *,
        timesteps: Sequence[float],
        renoise: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The next chunk, appended to the past.

        Inputs are ``noise [B, C, F, h, w]``, ``prompt_embeds [B, L, D]`` and ``prompt_mask [B, L]``.
        ``noise`` is the chunk at ``timesteps[0]``.
        In the mask 1 means keep. SANA reads it; Wan's padding is zeros.
        Returns the clean chunk ``[B, C, F, h, w]``.
        """
        if self.frames_seen + self.chunk_frames > self.max_frames:
            self.reanchor()
        clean = self._generate(noise, prompt_embeds, prompt_mask, list(timesteps), renoise, generator)
        self.recent = (self.recent + [(clean, prompt_embeds, prompt_mask)])[-self.anchor_chunks:]
        return clean


class WanStream(CausalStream):
    """A :class:`~.wan.WanCausal` stream. The KV caches are its past. Wan reads no prompt mask."""

    @property
    def frames_seen(self) -> int:
        return self.streamer.frames_seen

    def past_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for c in self.streamer.caches for t in (c.k, c.v, c.q)
                   if t is not None)

    def _generate(self, noise, embeds, mask, timesteps, renoise, generator):
        return self.streamer.generate_chunk(embeds, noise, timesteps=timesteps, renoise=renoise, generator=generator)

    def _append(self, clean, embeds, mask):
        self.streamer.append(clean, embeds)

    def warm_chunks(self) -> int:
        """The chunks that fill the KV cache, and one more.

        Until the cache is full, each chunk attends over a longer past.
        Each such chunk has its own compiled shape or CUDA graph.
        """
        cache = self.streamer.caches[0]
        return -(-(cache.capacity_frames - cache.sink_frames) // self.chunk_frames) + 2


class SanaStream(CausalStream):
    """A :class:`~.sana.SanaVideoStream` stream. Linear-attention sums and conv caches are its past."""

    @property
    def frames_seen(self) -> int:
        return self.streamer.frames_seen

    def past_nbytes(self) -> int:
        return self.streamer.state_nbytes()

    def _generate(self, noise, embeds, mask, timesteps, renoise, generator):
        return self.streamer.generate_chunk(noise, embeds, timesteps, prompt_mask=mask, renoise=renoise,
                                            generator=generator)

    def _append(self, clean, embeds, mask):
        self.streamer.append(clean, embeds, mask)


class Family:
    """What one model family needs to stream. Subclasses fill it in."""

    name: str
    transformer_class: type
    vae_class: type = AutoencoderKLWan

    def text_dim(self, model: torch.nn.Module) -> int:
        """Width ``D`` of the prompt embeddings ``[L, D]`` the model takes."""
        raise NotImplementedError

    def check(self, model: torch.nn.Module, where: str) -> None:
        """Raise a ``ValueError`` naming ``where``, the config file, if this model cannot be streamed."""
        if not isinstance(model, self.transformer_class):
            raise ValueError(
                f"{where}: the transformer is a {type(model).__name__}; the {self.name!r} family streams a "
                f"{self.transformer_class.__name__} (pick the family that matches the folder, --family)"
            )
        p_t = tuple(model.config.patch_size)[0]
        if p_t != 1:
            raise ValueError(
                f"{where}: patch_size={list(model.config.patch_size)} groups {p_t} latent frames per token; streaming "
                f"chunk by chunk needs a temporal patch of 1 (as the released Wan 2.1 and SANA-Video configs)"
            )

    def open(self, model: torch.nn.Module, *, latent_size: tuple[int, int], chunk_frames: int,
             **options) -> CausalStream:
        """Install the block-causal attention and cache into ``model``. Returns the stream."""
        raise NotImplementedError


class WanFamily(Family):
    """Wan 2.1 (``WanTransformer3DModel``): block-causal KV-cache attention, Self-Forcing / CausVid style.

    ``open`` options:

    - ``cache_frames``: 12 by default.
    - ``sink_frames``: ``chunk_frames`` by default.
    - ``attention``: ``"sdpa" | "monarch"``.
    - ``backend``.
    """

    name = "wan"
    transformer_class = WanTransformer3DModel

    def text_dim(self, model):
        return int(model.config.text_dim)

    def check(self, model, where):
        super().check(model, where)
        if model.config.image_dim is not None or model.config.added_kv_proj_dim is not None:
            raise ValueError(
                f"{where}: an image-conditioned Wan transformer (image_dim={model.config.image_dim}); streaming "
                f"text/video-to-video needs a text-to-video Wan 2.1 transformer (image_dim null)"
            )

    def open(self, model, *, latent_size, chunk_frames, cache_frames: int | None = None,
             sink_frames: int | None = None, attention: Literal["sdpa", "monarch"] = "sdpa", backend: str = "auto"):
        sink = chunk_frames if sink_frames is None else sink_frames
        cache = max(4 * chunk_frames, sink + chunk_frames) if cache_frames is None else cache_frames
        wan = WanCausal(model, chunk_frames=chunk_frames, cache_frames=cache, sink_frames=sink,
                        attention=attention, backend=backend)
        return WanStream(wan, model, chunk_frames=chunk_frames, anchor_chunks=max(1, cache // chunk_frames - 1))


class SanaFamily(Family):
    """SANA-Video (``SanaVideoTransformer3DModel``), LongSANA style.

    It has block-linear attention with a constant-size state and a block-causal feed-forward temporal conv.
    ``open`` options: ``backend``.
    """

    name = "sana"
    transformer_class = SanaVideoTransformer3DModel

    def text_dim(self, model):
        return int(model.config.caption_channels)

    def open(self, model, *, latent_size, chunk_frames, backend: str = "auto", anchor_chunks: int = 2):
        sana = SanaVideoStream(model, latent_size=latent_size, frames_per_block=chunk_frames, backend=backend)
        return SanaStream(sana, model, chunk_frames=chunk_frames, anchor_chunks=anchor_chunks)


FAMILIES: dict[str, Family] = {"wan": WanFamily(), "sana": SanaFamily()}
