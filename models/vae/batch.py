"""Many sessions' decoder streams, one batch per chunk.

    session's VAEDecode ─▶ BatchedVAE.decode ─▶ BatchClient ─▶ lane: DecodeStep on every session's rows
                        ◀── its frames and its decoder cache's new entries ◀──┘

A stream's decoder cache holds the causal convolutions' past frames, per session. It also holds the reference's
features, the same for every session of a bundle. A stream's first chunk decodes alone: it starts the cache. Later
chunks go to the lane with the cache's own entries, batch 1 each. The lane stacks the rows and adds the shared
reference features once. It decodes them as one batch. Each session gets its frames and its new entries back.

A session's frames are the ones it would decode alone, to float32 rounding. A chunk is never dropped: the Denoiser
before the decoder skips late work.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .model import VideoVAE
from .stage import TorchVAE

SHARED = "reference."  # the cache entries every stream of one model and reference holds alike


class DecodeStep:
    """A lane's engine: one chunk for each row, decoded with each row's cache.

    Called as ``(z, *entries)``, each ``[B, ...]``: the normalised latents and the cache's ``keys`` entries, in
    order. ``shared`` holds the reference's entries, batch 1, for every row. Returns the frames
    ``[B, 3, T, H, W]``, then each key's new entry."""

    def __init__(self, model: VideoVAE, keys: list[str], shared: dict[str, torch.Tensor]):
        self.model, self.keys, self.shared = model, keys, shared

    def __call__(self, z, *entries):
        frames, new = self.model.decode(z, {**self.shared, **dict(zip(self.keys, entries))})
        return (frames, *(new[k] for k in self.keys))


class BatchedVAE:
    """The :class:`~.stage.VAEEngine` of one session on a batching lane. See the module docstring.

    ``client_for(keys, shared)`` gives a :class:`~framegraph.stream.batching.BatchClient` of the lane that decodes
    streams with cache entries ``keys`` and shared entries ``shared``. The :class:`~.stage.VAEDecode` closes the
    engine at teardown and cancels it on interrupt."""

    batched = True  # what VAEDecode looks for: it closes and cancels the engine's client

    def __init__(self, model: VideoVAE, reference: torch.Tensor | None,
                 client_for: Callable[[list[str], dict[str, torch.Tensor]], object]):
        self.alone = TorchVAE(model, reference)
        self.client_for = client_for
        self.client = None
        self.keys: list[str] = []

    def decode(self, z):
        cache = self.alone.cache
        if cache is None:  # the stream's first chunk starts its cache
            return self.alone.decode(z)
        if self.client is None:
            self.keys = sorted(k for k in cache if not k.startswith(SHARED))
            self.client = self.client_for(self.keys, {k: v[:1] for k, v in cache.items() if k.startswith(SHARED)})
            self.client.open()
        out = self.client(z, *(cache[k] for k in self.keys))
        frames, new = out[0], out[1:]
        self.alone.cache = {**{k: v for k, v in cache.items() if k.startswith(SHARED)},
                            **{k: v.clone() for k, v in zip(self.keys, new)}}
        return frames.clone()

    def reset(self) -> None:
        self.alone.reset()

    def cancel(self) -> None:
        """A call waiting on the lane returns now, with :class:`~framegraph.stream.batching.Cancelled`."""
        if self.client is not None:
            self.client.cancel()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


__all__ = ["BatchedVAE", "DecodeStep", "SHARED"]
