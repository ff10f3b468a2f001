"""The Wan 2.1 family run causally, as in Self-Forcing / CausVid: a stock ``WanTransformer3DModel``, chunk by chunk.

    from framegraph.models.generate import WanCausal

    wan = WanCausal(model, chunk_frames=3, cache_frames=12, sink_frames=3)   # attention="sdpa" | "monarch"
    for _ in range(chunks):                                # endless: memory stays bounded by cache_frames
        noise = torch.randn(1, 16, 3, 60, 104, generator=g)
        x0 = wan.generate_chunk(prompt_embeds, noise, timesteps=[1000, 750, 500, 250], generator=g)
    wan.reset()                                            # a new stream (or a new scene)
    wan.uninstall()                                        # the stock model again

What the family holds:

- block-causal attention through :class:`~framegraph.kernels.processors.WanCausalAttnProcessor` on every
  self-attention. Each layer has one :class:`~framegraph.kernels.processors.KVCache`: ``sink_frames`` + a rolling
  window, ``cache_frames`` appended latent frames in all.
- rotary positions absolute in the stream.
- the sampling: few-step flow matching over one chunk; see :func:`~framegraph.models.sampler.sample_euler`. Then one
  more model call at ``t = 0`` appends the clean chunk to the cache. So the cache is refreshed from the clean output,
  not from the last noisy pass.

The rest of the stock Wan transformer acts token by token, so it is causal as it is.
That is the patch embedding with a temporal patch of 1 frame, adaLN, cross-attention to the prompt and feed-forward.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from framegraph.kernels.processors import (
    install_wan_causal_processors,
    set_update_state,
    uninstall_wan_causal_processors,
)

from ..sampler import sample_euler

__all__ = ["WanCausal", "DEFAULT_TIMESTEPS", "NUM_TRAIN_TIMESTEPS"]

NUM_TRAIN_TIMESTEPS = 1000  # Wan's timestep scale: timestep = sigma * 1000 (flow matching, sigma = t)
DEFAULT_TIMESTEPS = (1000, 750, 500, 250)  # Self-Forcing's four steps


class WanCausal:
    """A stock ``diffusers.WanTransformer3DModel`` streamed block-causally with a rolling KV cache.

    Args:
        model: the Wan transformer. Its self-attention processors and ``rope`` are replaced until :meth:`uninstall`.
        chunk_frames: latent frames generated per chunk, one causal block. Self-Forcing uses 3.
        cache_frames: appended latent frames the cache keeps per layer: sinks + rolling window.
        sink_frames: the stream's first latent frames, kept for ever as attention sinks.
        attention: ``"sdpa"`` for exact softmax, or ``"monarch"`` for block-causal Monarch attention.
        num_iters / backend: Monarch attention's fitting iterations and kernel backend.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        chunk_frames: int,
        cache_frames: int,
        sink_frames: int = 0,
        attention: str = "sdpa",
        num_iters: int = 1,
        backend: str = "auto",
    ) -> None:
        if isinstance(chunk_frames, bool) or not isinstance(chunk_frames, int) or chunk_frames < 1:
            raise ValueError(f"WanCausal: chunk_frames={chunk_frames!r}; expected an int >= 1")
        patch_frames = tuple(getattr(getattr(model, "config", None), "patch_size", (1,)))[0]
        if chunk_frames % patch_frames:
            raise ValueError(
                f"WanCausal: chunk_frames={chunk_frames} is not a multiple of the model's temporal patch size "
                f"{patch_frames} (config.patch_size[0]); a patch would join frames of two chunks, which is not causal"
            )
        if attention == "monarch" and (sink_frames % chunk_frames or cache_frames % chunk_frames):
            raise ValueError(
                f"WanCausal: attention='monarch' fits whole chunks as causal blocks; sink_frames={sink_frames} and "
                f"cache_frames={cache_frames} must be multiples of chunk_frames={chunk_frames}"
            )
        self.model = model
        self.chunk_frames = chunk_frames
        self._stream_shape: tuple[int, ...] | None = None  # [B, C, F_chunk, H, W] of the stream's chunks
        self.processors = install_wan_causal_processors(
            model, capacity_frames=cache_frames, sink_frames=sink_frames, attention=attention,
            num_iters=num_iters, backend=backend,
        )
        next(iter(self.processors.values())).cache.check_chunk(chunk_frames)

    @property
    def caches(self) -> list:
        """The per-layer :class:`~framegraph.kernels.processors.KVCache` s, in layer order."""
        return [p.cache for p in self.processors.values()]

    @property
    def frames_seen(self) -> int:
        """Latent frames appended to the stream so far: the next chunk's first frame index."""
        return self.caches[0].frames_seen

    def graph_key(self) -> tuple:
        """What a captured velocity call depends on besides its inputs.

        That is the frames the caches hold, the length of ``[cache, chunk]``.
        It is also the cache storage, which a new layout reallocates.
        """
        cache = self.caches[0]
        return ("wan", cache.frames, 0 if cache.k is None else cache.k.data_ptr())

    def reset(self) -> None:
        """Forget the stream: the next chunk is frame 0 with an empty past. The cache storage is reused."""
        for p in self.processors.values():
            p.reset()

    def uninstall(self) -> None:
        """Give the model its stock processors and rotary table back."""
        uninstall_wan_causal_processors(self.model)
        self.processors = {}

    def velocity(self, latents: torch.Tensor, t: torch.Tensor, prompt_embeds: torch.Tensor) -> torch.Tensor:
        """The model's flow velocity ``v = eps - x0`` for a chunk ``[B, C, F_chunk, H, W]`` at ``t [B]`` in [0, 1].

        It reads the cache and never writes it. ``prompt_embeds`` is ``[B, L, text_dim]``.
        """
        self._check_chunk(latents)
        set_update_state(self.processors, False)
        return self.model(latents, t * NUM_TRAIN_TIMESTEPS, prompt_embeds, return_dict=False)[0]

    def append(self, clean: torch.Tensor, prompt_embeds: torch.Tensor) -> None:
        """Append a clean chunk ``[B, C, F_chunk, H, W]``.

        The model runs on it at ``t = 0``, and every layer keeps its keys and values.
        The oldest window frames beyond ``cache_frames`` are evicted.
        """
        self._check_chunk(clean)
        t0 = clean.new_zeros(clean.shape[0])
        set_update_state(self.processors, True)
        try:
            self.model(clean, t0, prompt_embeds, return_dict=False)
        finally:
            set_update_state(self.processors, False)

    @torch.no_grad()
    def generate_chunk(
        self,
        prompt_embeds: torch.Tensor,
        noise: torch.Tensor,
        *,
        timesteps: Sequence[float] = DEFAULT_TIMESTEPS,
        renoise: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Denoise one chunk from ``noise [B, C, F_chunk, H, W]`` and append it. Returns the clean latents, same
        shape.

        ``timesteps`` is the decreasing few-step schedule on Wan's 0..1000 scale, e.g. ``[1000, 750, 500, 250]``.
        Each takes one model call; the append call follows.
        ``renoise=True`` is Self-Forcing's sampler.
        Each step estimates ``x0`` and re-noises it to the next timestep with fresh noise from ``generator``.
        ``False``: deterministic Euler steps.
        """
        x0 = self.denoise(prompt_embeds, noise, timesteps=timesteps, renoise=renoise, generator=generator)
        self.append(x0, prompt_embeds)
        return x0

    @torch.no_grad()
    def denoise(self, prompt_embeds: torch.Tensor, noise: torch.Tensor, *,
                timesteps: Sequence[float] = DEFAULT_TIMESTEPS, renoise: bool = True,
                generator: torch.Generator | None = None,
                fresh: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """:meth:`generate_chunk`'s sampling alone: the clean chunk, the cache unchanged.

        ``fresh`` is the re-noising noise drawn ahead; see :func:`~framegraph.models.sampler.sample_euler`.
        """
        self._check_chunk(noise)
        ts = [float(np.float32(t)) for t in timesteps] + [0.0]  # host floats: no device read per step
        if len(ts) < 2 or any(a <= b for a, b in zip(ts, ts[1:])) or ts[0] > NUM_TRAIN_TIMESTEPS:
            raise ValueError(
                f"WanCausal.generate_chunk: timesteps={list(timesteps)!r}; expected a decreasing list of values "
                f"in (0, {NUM_TRAIN_TIMESTEPS}], e.g. {list(DEFAULT_TIMESTEPS)}"
            )
        sigmas = [float(np.float32(t) / np.float32(NUM_TRAIN_TIMESTEPS)) for t in ts]
        return sample_euler(lambda x, t: self.velocity(x, t, prompt_embeds), noise, timesteps=sigmas,
                            renoise=renoise, generator=generator, fresh=fresh)

    def _check_chunk(self, latents: torch.Tensor) -> None:
        if not self.processors:
            raise ValueError("WanCausal: the processors were uninstalled; build a new WanCausal to stream again")
        if latents.dim() != 5 or latents.shape[2] != self.chunk_frames:
            raise ValueError(
                f"WanCausal: latents {tuple(latents.shape)}; expected a chunk [B, C, {self.chunk_frames}, H, W] "
                f"of chunk_frames={self.chunk_frames} latent frames"
            )
        if self.frames_seen == 0:
            self._stream_shape = tuple(latents.shape)
        elif tuple(latents.shape) != self._stream_shape:
            raise ValueError(
                f"WanCausal: latents {tuple(latents.shape)} differ from this stream's chunks {self._stream_shape}; "
                f"reset() to start a stream of another size"
            )
