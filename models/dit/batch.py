"""Many sessions' DiT streams, one batch per block.

    session's Denoiser ─▶ BatchedDiT.generate ─▶ BatchClient ─▶ lane: BlockStep on every session's rows
                       ◀── its clean block and its stream's new tensors ◀──┘

Each session keeps its own :class:`~.state.DiTStreamState` of batch 1. A call hands the lane the block's noise,
audio and labels. It hands the rotary tables of its own position and every tensor of its stream. The lane stacks
the sessions' rows into one stream. It runs the sampler and the append on it, in one batch. Each session gets
its clean block and its stream's new tensors. Positions differ per row, so the tables go per row.

A session's stream is the one it would have alone, to float32 rounding. Steps and shift are the lane's. A stage
that falls back to fewer steps goes to that level's lane.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from framegraph.kernels.block_linear_attention import LinearAttentionState

from ..sampler import sample_euler
from .model import AvatarDiT
from .state import DiTStreamState, LayerStreamState


def stream_from(model: AvatarDiT, tensors) -> DiTStreamState:
    """The stream whose :meth:`~.state.DiTStreamState.tensors` are ``tensors``. Its frame counter is 0.

    Rows of many streams, concatenated, give one stream of them all. Its rope comes from each row's own."""
    ref, history, rest = tensors[0], tensors[1], list(tensors[2:])
    n = len(model.blocks)
    layers = [LayerStreamState(attn=LinearAttentionState(kv=rest[3 * i], k_sum=rest[3 * i + 1]),
                               ffn_cache=rest[3 * i + 2]) for i in range(n)]
    kv = rest[3 * n:]
    ref_kv = [(kv[2 * i], kv[2 * i + 1]) for i in range(n)] if kv else [None] * n
    return DiTStreamState(ref=ref, ref_kv=ref_kv, layers=layers, audio_history=history)


class BlockStep:
    """A lane's engine: one block for each row, denoised and appended.

    Called as ``(noise, audio, labels, cos, sin, *stream tensors)``, each ``[B, ...]``. ``cos`` and ``sin`` are
    ``[B, N, head_dim]``, each row's positions. Returns the clean block ``[B, C, k, h, w]``, then each layer's new
    ``kv``, ``k_sum`` and FFN cache, then the new audio history. Nothing passed in is changed."""

    def __init__(self, model: AvatarDiT, *, steps: int, shift: float):
        self.model, self.steps, self.shift = model, steps, shift

    def __call__(self, noise, audio, labels, cos, sin, *tensors):
        stream, rope = stream_from(self.model, tensors), (cos, sin)
        x0 = sample_euler(lambda x, t: self.model(x, t, audio, labels, stream=stream, rope=rope), noise,
                          steps=self.steps, shift=self.shift)
        return (x0, *self.model.append_step(x0, audio, labels, stream, rope))


class BatchedDiT:
    """The :class:`~.stage.DiTEngine` of one session on batching lanes. See the module docstring.

    ``client_for(steps)`` gives an opened-on-demand :class:`~framegraph.stream.batching.BatchClient` of the lane
    that runs ``steps`` sampler steps. The :class:`~.stage.Denoiser` sets :attr:`deadline_ns` per chunk. It closes
    the engine at teardown and cancels it on interrupt. A block the lane cannot start in time raises
    :class:`~framegraph.stream.batching.Missed`. The stream is then as before the call."""

    def __init__(self, model: AvatarDiT, client_for: Callable[[int], object]):
        self.model, self.client_for = model, client_for
        self.stream: DiTStreamState | None = None
        self.clients: dict[int, object] = {}
        self.deadline_ns: int | None = None

    def start(self, reference: torch.Tensor) -> None:
        self.stream = self.model.init_stream(reference)
        for client in self.clients.values():
            client.open()

    def reset(self) -> None:
        self.stream.reset()

    def client(self, steps: int):
        """The opened client of the ``steps`` lane. Its lane measures its cost once, on this stream's rows.

        The :class:`~.stage.Denoiser` asks for each of its steps levels at setup."""
        client = self.clients.get(steps)
        if client is None:
            client = self.clients[steps] = self.client_for(steps)
            client.open()
            client.lane.warm_once(self._inputs(*self._zeros()))
        return client

    def generate(self, noise, audio, labels, steps, shift):
        out = self.client(steps)(*self._inputs(noise, audio, labels), deadline_ns=self.deadline_ns)
        x0, new = out[0], out[1:]
        s = self.stream
        for t, v in zip([t for layer in s.layers for t in layer.tensors()] + [s.audio_history], new):
            t.copy_(v)
        s.frames += x0.shape[2]
        return x0.clone()

    def cancel(self) -> None:
        """A call waiting on a lane returns now, with :class:`~framegraph.stream.batching.Cancelled`."""
        for client in self.clients.values():
            client.cancel()

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def _inputs(self, noise, audio, labels) -> tuple[torch.Tensor, ...]:
        cos, sin = self.model.stream_rope(self.stream)
        dtype = self.stream.ref.dtype
        return (noise.to(dtype), audio, labels, cos[None], sin[None], *self.stream.tensors())

    def _zeros(self):
        c, (h, w) = self.model.config, self.stream.ref.shape[-2:]
        k, device = c.frames_per_block, self.stream.ref.device
        return (torch.zeros(1, c.latent_channels, k, h, w, device=device),
                torch.zeros(1, k, c.audio_dim, device=device), torch.zeros(1, k, c.state_dim, device=device))


__all__ = ["BatchedDiT", "BlockStep", "stream_from"]
