"""Many sessions' SANA-Video streams, one batch per chunk.

    session's CausalDenoiser ─▶ BatchedSanaStream.generate ─▶ BatchClient ─▶ lane: SanaChunkStep on every row
                             ◀── its clean chunk and its stream's new past ◀──┘

SANA's past has a constant size: per attention layer a linear-attention sum, per feed-forward the last frames of
its temporal conv. Each session keeps those tensors, batch 1, in a :class:`SessionPast`, beside its frame
position. A call hands the lane the chunk's noise, the prompt, the position, the re-noising noise its own
generator drew and its past. The lane's :class:`SanaChunkStep` loads the rows into the one model's processors. It
runs the sampler and the append on all rows at once, each row with the rotary rows of its own position. Each
session gets its clean chunk and its new past. The chunk is the one the session would get alone, to float32
rounding.

One lane serves one model, latent size, chunk, schedule and prompt length. A re-anchor's appends go to the
same lane, their rows marked to append only. Wan's past is a KV cache whose length differs per session: it is
not batched here.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from framegraph.kernels.block_linear_attention import LinearAttentionState

from .. import runtime
from ..sampler import sample_euler
from .family import CausalStream
from .sana import SanaVideoStream, host_sigmas

__all__ = ["BatchedSanaStream", "SanaChunkStep", "SessionPast", "batched_stream", "sana_chunk_step"]


class SanaChunkStep:
    """A lane's engine: one SANA chunk for each row, denoised and appended.

    It installs a :class:`~.sana.SanaVideoStream` in ``model``, which is then the lane's alone.

    Called as ``(chunk, embeds, mask, frames, append, fresh, *past)``, each ``[B, ...]``:

    - ``chunk [B, C, F, h, w]``: the noise at the first timestep; for a row with ``append`` set, a clean chunk (a
      re-anchor's), only appended;
    - ``embeds [B, L, D]``, ``mask [B, L]``;
    - ``frames [B]`` and ``append [B]``, on the CPU: each row's latent frames so far, and whether it only appends;
    - ``fresh [B, S, C, F, h, w]``: each re-noising step's noise, ``S`` of them (0 without ``renoise``);
    - the past's tensors, in :attr:`past_shapes` order.

    Returns the clean chunk, then the new past. Nothing passed in changes.
    """

    def __init__(self, model: torch.nn.Module, *, latent_size: tuple[int, int], chunk_frames: int,
                 timesteps: Sequence[float], renoise: bool, backend: str = "auto"):
        self.stream = SanaVideoStream(model, latent_size=latent_size, frames_per_block=chunk_frames, backend=backend)
        self.sigmas, self.renoise = host_sigmas(list(timesteps)), renoise
        self.past_shapes = self._past_shapes()

    def _past_shapes(self) -> list[tuple[int, ...]]:
        """The past's tensor shapes at batch 1, found by appending one chunk of zeros."""
        c, (h, w), s = self.stream.model.config, self.stream.latent_size, self.stream
        param = next(s.model.parameters())
        with torch.inference_mode():
            s.append(torch.zeros(1, c.in_channels, s.frames_per_block, h, w, device=param.device, dtype=param.dtype),
                     torch.zeros(1, 1, c.caption_channels, device=param.device, dtype=param.dtype))
        shapes = [tuple(t.shape) for t in s.state_tensors()]
        s.reset()
        return shapes

    def _load(self, past: Sequence[torch.Tensor]) -> None:
        """The rows' past into the processors and convs, copied: the engine's passes update them in place."""
        it = iter(past)
        for p in self.stream.processors.values():
            p.state = LinearAttentionState(next(it).clone(), next(it).clone())
        for conv in self.stream.convs.values():
            conv.cache = next(it).clone()

    def _rope(self, chunk: torch.Tensor, frames: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [B, N, 1, D]``: each row's rotary rows at its own frame position."""
        rope = self.stream.model.rope
        rows = [rope(chunk[:1], frame_offset=f) for f in frames]
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])

    def __call__(self, chunk, embeds, mask, frames, append, fresh, *past):
        s, rope = self.stream, self.stream.model.rope
        self._load(past)
        rope.static = self._rope(chunk, frames.tolist())
        try:
            appends = append.tolist()
            clean = chunk
            if not all(appends):  # a batch of re-anchors only appends
                clean = sample_euler(lambda x, t: s.velocity(x, t, embeds, mask), chunk, timesteps=self.sigmas,
                                     renoise=self.renoise, fresh=fresh.unbind(1))
                if any(appends):
                    keep = append.to(chunk.device).view(-1, *[1] * (chunk.dim() - 1))
                    clean = torch.where(keep, chunk, clean)
            s.append(clean, embeds, mask)
        finally:
            rope.static = None
        return (clean, *s.state_tensors())


def sana_chunk_step(model, **kwargs) -> SanaChunkStep:
    """The runtime registry's torch entry of ``generate-denoiser-batch``: :class:`SanaChunkStep`."""
    return SanaChunkStep(model, **kwargs)


class SessionPast:
    """One session's SANA past: the tensors of :attr:`SanaChunkStep.past_shapes`, zeros when empty, and its
    position, ``frames_seen`` latent frames. A past of zeros is the empty past: linear attention adds nothing and
    the conv reads zeros before the stream, as alone."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], *, device, dtype: torch.dtype):
        self.tensors = [torch.zeros(shape, device=device, dtype=dtype) for shape in shapes]
        self.frames_seen = 0

    def reset(self) -> None:
        for t in self.tensors:
            t.zero_()
        self.frames_seen = 0

    def update(self, new: Sequence[torch.Tensor], frames: int) -> None:
        for t, v in zip(self.tensors, new, strict=True):
            t.copy_(v)
        self.frames_seen += frames


class BatchedSanaStream(CausalStream):
    """A session's SANA stream on a batching lane; the :class:`~.family.CausalStream` a
    :class:`~.stages.CausalDenoiser` runs. See the module docstring.

    ``client`` is a :class:`~framegraph.stream.batching.BatchClient` of a lane running a :class:`SanaChunkStep`;
    ``past_shapes`` are that step's. ``timesteps`` and ``renoise`` are the lane's; a call asking other ones raises.
    The denoiser opens the stream in its setup, closes it at teardown and cancels it on interrupt.
    """

    batched = True

    def __init__(self, model: torch.nn.Module, client, *, past_shapes, chunk_frames: int, timesteps: Sequence[float],
                 renoise: bool, anchor_chunks: int = 2):
        param = next(model.parameters())
        super().__init__(SessionPast(past_shapes, device=param.device, dtype=param.dtype), model,
                         chunk_frames=chunk_frames, anchor_chunks=anchor_chunks)
        self.client, self.timesteps, self.renoise = client, [float(t) for t in timesteps], renoise
        self._draws = len(self.timesteps) - 1 if renoise else 0  # as the sampler alone draws: each step but the last

    @property
    def frames_seen(self) -> int:
        return self.streamer.frames_seen

    def past_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.streamer.tensors)

    def open(self) -> None:
        self.client.open()

    def close(self) -> None:
        self.client.close()

    def cancel(self) -> None:
        """A call waiting on the lane returns now, with :class:`~framegraph.stream.batching.Cancelled`."""
        self.client.cancel()

    def _call(self, chunk, embeds, mask, append: bool, fresh: list[torch.Tensor]) -> torch.Tensor:
        past = self.streamer
        mask = torch.ones(embeds.shape[:2], device=embeds.device) if mask is None else mask
        fresh = torch.stack(fresh, 1) if fresh else chunk.new_zeros((1, 0, *chunk.shape[1:]))
        out = self.client(chunk, embeds, mask, torch.tensor([past.frames_seen]), torch.tensor([append]), fresh,
                          *past.tensors)
        clean, new = out[0].clone(), out[1:]
        past.update(new, chunk.shape[2])
        return clean

    def _generate(self, noise, embeds, mask, timesteps, renoise, generator):
        if [float(t) for t in timesteps] != self.timesteps or bool(renoise) != self.renoise:
            raise ValueError(f"BatchedSanaStream: timesteps {list(timesteps)} renoise={renoise}; this stream's lane "
                             f"runs {self.timesteps} renoise={self.renoise} (another schedule is another lane)")
        fresh = [torch.randn(noise.shape, generator=generator, device=noise.device, dtype=noise.dtype)
                 for _ in range(self._draws)]
        return self._call(noise, embeds, mask, False, fresh)

    def _append(self, clean, embeds, mask) -> None:
        self._call(clean, embeds, mask, True, [torch.zeros_like(clean) for _ in range(self._draws)])


def batched_stream(service, model: torch.nn.Module, *, device, latent_size: tuple[int, int], chunk_frames: int,
                   timesteps: Sequence[float], renoise: bool, prompt_tokens: int, chunks_per_s: float,
                   backend: str = "auto", anchor_chunks: int = 2) -> BatchedSanaStream:
    """A session's :class:`BatchedSanaStream` on ``service``'s lane for this model and shapes.

    The first session builds the lane's :class:`SanaChunkStep` on ``model``, which from then on is the lane's:
    sessions share it and read only its config. ``chunks_per_s`` is the session's chunk rate; a service that admits
    raises :class:`~framegraph.stream.batching.Full` when one more session's chunk would not fit in a chunk's time.
    """
    runtime.check_batched("generate-denoiser-batch", "torch", device)
    timesteps = [float(t) for t in timesteps]
    key = ("generate-sana chunk", id(model), str(device), tuple(latent_size), chunk_frames, tuple(timesteps),
           bool(renoise), prompt_tokens)
    lane = service.lane(key, lambda: runtime.engines("generate-denoiser-batch", "torch", model,
                                                     latent_size=tuple(latent_size), chunk_frames=chunk_frames,
                                                     timesteps=timesteps, renoise=bool(renoise), backend=backend),
                        build=True, name=f"sana-chunk-{latent_size[0]}x{latent_size[1]}x{chunk_frames}")
    client = service.client(key, None, fps=chunks_per_s)
    return BatchedSanaStream(model, client, past_shapes=lane.run_batch.past_shapes, chunk_frames=chunk_frames,
                             timesteps=timesteps, renoise=renoise, anchor_chunks=anchor_chunks)
