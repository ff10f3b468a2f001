"""Many sessions' video streams of one model, one batch per chunk.

    session's CausalDenoiser ─▶ BatchedStream.generate ─▶ BatchClient ─▶ lane: a ChunkStep on every row
                             ◀── its clean chunk and its stream's new past ◀──┘

The model is the lane's. Each session keeps its own past, batch 1, in a :class:`SessionPast`, beside its frame
position. A call hands the lane the chunk's noise, the prompt, the position, the re-noising noise its own
generator drew and its past. The lane loads the rows into the model's processors. It runs the sampler and the
append on all rows at once, each row with the rotary rows of its own position. Each session gets its clean chunk
and its new past. The chunk is the one the session would get alone, to float32 rounding.

- SANA-Video (:class:`SanaChunkStep`): the past is per attention layer a linear-attention sum and per
  feed-forward the last frames of its temporal conv. It has one size at every age.
- Wan 2.1 (:class:`WanChunkStep`): the past is per layer the KV cache, padded to its capacity. Each row holds its
  own number of frames; the attention mask hides the rest (:class:`~framegraph.kernels.processors.RowsKVCache`).
  SDPA only: Monarch attention refits each stream's own past.

One lane serves one model, latent size, chunk, schedule, prompt length and cache. A re-anchor's appends go to the
same lane, their rows marked to append only.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from framegraph.kernels.block_linear_attention import LinearAttentionState
from framegraph.kernels.processors import RowsKVCache

from .. import runtime
from .family import FAMILIES, CausalStream

__all__ = ["BatchedStream", "ChunkStep", "SanaChunkStep", "SessionPast", "WanChunkStep", "batched_stream",
           "chunk_step"]


class ChunkStep:
    """A lane's engine: one chunk for each row, denoised and appended. A family's subclass says how its past loads.

    It opens the family's stream in ``model``, which is then the lane's alone.

    Called as ``(chunk, embeds, mask, frames, held, append, fresh, *past)``, each ``[B, ...]``:

    - ``chunk [B, C, F, h, w]``: the noise at the first timestep; for a row with ``append`` set, a clean chunk (a
      re-anchor's), only appended;
    - ``embeds [B, L, D]``, ``mask [B, L]``;
    - ``frames``, ``held`` and ``append`` ``[B]``, on the CPU: each row's latent frames so far, the frames its past
      holds, and whether it only appends;
    - ``fresh [B, S, C, F, h, w]``: each re-noising step's noise, ``S`` of them (0 without ``renoise``);
    - the past's tensors, in :attr:`past_shapes` order.

    Returns the clean chunk, then the new past. Nothing passed in changes.
    Attributes a session reads: :attr:`past_shapes`, :attr:`capacity_frames` (None: the past does not fill) and
    ``stream.anchor_chunks``.
    """

    family: str
    capacity_frames: int | None = None

    def __init__(self, model: torch.nn.Module, *, latent_size: tuple[int, int], chunk_frames: int,
                 timesteps: Sequence[float], renoise: bool, **options):
        self.stream = FAMILIES[self.family].open(model, latent_size=tuple(latent_size), chunk_frames=chunk_frames,
                                                 **options)
        self.timesteps, self.renoise = [float(t) for t in timesteps], renoise
        self.latent_size, self.chunk_frames = tuple(latent_size), chunk_frames
        self.past_shapes = self._past_shapes()

    @property
    def model(self) -> torch.nn.Module:
        return self.stream.model

    def _past_shapes(self) -> list[tuple[int, ...]]:
        """The past's tensor shapes at batch 1, found by appending one chunk of zeros."""
        c, param = self.model.config, next(self.model.parameters())
        zeros = torch.zeros(1, c.in_channels, self.chunk_frames, *self.latent_size, device=param.device,
                            dtype=param.dtype)
        embeds = torch.zeros(1, 1, FAMILIES[self.family].text_dim(self.model), device=param.device, dtype=param.dtype)
        with torch.inference_mode():
            self.stream._append(zeros, embeds, None)
        shapes = self._shapes_after_one()
        self.stream.streamer.reset()
        return shapes

    def _rope(self, chunk: torch.Tensor, frames: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [B, N, 1, D]``: each row's rotary rows at its own frame position."""
        rope = self.model.rope
        rows = [rope(chunk[:1], frame_offset=f) for f in frames]
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])

    def __call__(self, chunk, embeds, mask, frames, held, append, fresh, *past):
        rope = self.model.rope
        self._load(past, held.tolist())
        rope.static = self._rope(chunk, frames.tolist())
        try:
            appends = append.tolist()
            clean = chunk
            if not all(appends):  # a batch of re-anchors only appends
                clean = self._denoise(chunk, embeds, mask, fresh.unbind(1))
                if any(appends):
                    keep = append.to(chunk.device).view(-1, *[1] * (chunk.dim() - 1))
                    clean = torch.where(keep, chunk, clean)
            self.stream._append(clean, embeds, mask)
        finally:
            rope.static = None
        return (clean, *self._past())

    # ---- a family's ------------------------------------------------------------------------------
    def _shapes_after_one(self) -> list[tuple[int, ...]]:
        raise NotImplementedError

    def _load(self, past: Sequence[torch.Tensor], held: list[int]) -> None:
        raise NotImplementedError

    def _past(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def _denoise(self, chunk, embeds, mask, fresh) -> torch.Tensor:
        raise NotImplementedError


class SanaChunkStep(ChunkStep):
    """SANA-Video's chunk: the rows' attention sums and conv caches loaded into the processors and convs."""

    family = "sana"

    def _shapes_after_one(self):
        return [tuple(t.shape) for t in self.stream.streamer.state_tensors()]

    def _load(self, past, held):
        s, it = self.stream.streamer, iter(past)  # copies: the passes update them in place
        for p in s.processors.values():
            p.state = LinearAttentionState(next(it).clone(), next(it).clone())
        for conv in s.convs.values():
            conv.cache = next(it).clone()

    def _past(self):
        return self.stream.streamer.state_tensors()

    def _denoise(self, chunk, embeds, mask, fresh):
        return self.stream.streamer.denoise(chunk, embeds, self.timesteps, prompt_mask=mask, renoise=self.renoise,
                                            fresh=fresh)


class WanChunkStep(ChunkStep):
    """Wan 2.1's chunk: each layer's cache replaced, for the call, by a :class:`RowsKVCache` of the rows' pasts."""

    family = "wan"

    def __init__(self, model, *, attention: str = "sdpa", **kwargs):
        if attention != "sdpa":
            raise ValueError(f"batching runs Wan with attention 'sdpa'; got {attention!r} (Monarch refits each "
                             f"stream's own past: run its sessions without batching)")
        super().__init__(model, attention=attention, **kwargs)

    def _caches(self):
        return [p.cache for p in self.stream.streamer.processors.values()]

    @property
    def capacity_frames(self) -> int:
        return self._caches()[0].capacity_frames

    @property
    def sink_frames(self) -> int:
        return self._caches()[0].sink_frames

    def _shapes_after_one(self):
        cache = self._caches()[0]
        b, h, _, d = cache.k.shape
        return [(b, h, cache.capacity_frames * cache.tokens_per_frame, t.shape[3])
                for _ in self._caches() for t in (cache.k, cache.v)]

    def _load(self, past, held):
        it = iter(past)
        for p in self.stream.streamer.processors.values():
            p.cache = RowsKVCache(self.capacity_frames, self.sink_frames, next(it), next(it), held)

    def _past(self):
        return [t for c in self._caches() for t in (c.k, c.v)]

    def _denoise(self, chunk, embeds, mask, fresh):
        return self.stream.streamer.denoise(embeds, chunk, timesteps=self.timesteps, renoise=self.renoise,
                                            fresh=fresh)


STEPS = {"sana": SanaChunkStep, "wan": WanChunkStep}


def chunk_step(family: str, model, **kwargs) -> ChunkStep:
    """The runtime registry's torch entry of ``generate-denoiser-batch``: the family's :class:`ChunkStep`."""
    return STEPS[family](model, **kwargs)


class SessionPast:
    """One session's past: the tensors of :attr:`ChunkStep.past_shapes`, zeros when empty; ``frames_seen``, its
    position in latent frames; ``held``, the frames its past holds (at most ``capacity_frames``).

    A past of zeros is the empty past: SANA's linear attention adds nothing and its conv reads zeros before the
    stream; Wan's mask hides every frame not held."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], *, device, dtype: torch.dtype,
                 capacity_frames: int | None = None):
        self.tensors = [torch.zeros(shape, device=device, dtype=dtype) for shape in shapes]
        self.capacity_frames = capacity_frames
        self.frames_seen = self.held = 0

    def reset(self) -> None:
        for t in self.tensors:
            t.zero_()
        self.frames_seen = self.held = 0

    def update(self, new: Sequence[torch.Tensor], frames: int) -> None:
        for t, v in zip(self.tensors, new, strict=True):
            t.copy_(v)
        self.frames_seen += frames
        self.held += frames
        if self.capacity_frames is not None:
            self.held = min(self.held, self.capacity_frames)


class BatchedStream(CausalStream):
    """A session's stream on a batching lane; the :class:`~.family.CausalStream` a
    :class:`~.stages.CausalDenoiser` runs. See the module docstring.

    ``client`` is a :class:`~framegraph.stream.batching.BatchClient` of a lane running ``step``, a
    :class:`ChunkStep`, whose schedule the stream follows; a call asking another one raises. The denoiser opens the
    stream in its setup, closes it at teardown and cancels it on interrupt.
    """

    batched = True

    def __init__(self, step: ChunkStep, client):
        model, param = step.model, next(step.model.parameters())
        super().__init__(SessionPast(step.past_shapes, device=param.device, dtype=param.dtype,
                                     capacity_frames=step.capacity_frames), model,
                         chunk_frames=step.chunk_frames, anchor_chunks=step.stream.anchor_chunks)
        self.client, self.timesteps, self.renoise = client, step.timesteps, step.renoise
        self._draws = len(self.timesteps) - 1 if self.renoise else 0  # as the sampler draws: each step but the last

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
        out = self.client(chunk, embeds, mask, torch.tensor([past.frames_seen]), torch.tensor([past.held]),
                          torch.tensor([append]), fresh, *past.tensors)
        clean, new = out[0].clone(), out[1:]
        past.update(new, chunk.shape[2])
        return clean

    def _generate(self, noise, embeds, mask, timesteps, renoise, generator):
        if [float(t) for t in timesteps] != self.timesteps or bool(renoise) != self.renoise:
            raise ValueError(f"BatchedStream: timesteps {list(timesteps)} renoise={renoise}; this stream's lane "
                             f"runs {self.timesteps} renoise={self.renoise} (another schedule is another lane)")
        fresh = [torch.randn(noise.shape, generator=generator, device=noise.device, dtype=noise.dtype)
                 for _ in range(self._draws)]
        return self._call(noise, embeds, mask, False, fresh)

    def _append(self, clean, embeds, mask) -> None:
        self._call(clean, embeds, mask, True, [torch.zeros_like(clean) for _ in range(self._draws)])


def batched_stream(service, family: str, model: torch.nn.Module, *, device, latent_size: tuple[int, int],
                   chunk_frames: int, timesteps: Sequence[float], renoise: bool, prompt_tokens: int,
                   chunks_per_s: float, **options) -> BatchedStream:
    """A session's :class:`BatchedStream` on ``service``'s lane for this model, shapes and family ``options``.

    The first session builds the lane's :class:`ChunkStep` on ``model``, which from then on is the lane's:
    sessions share it and read only its config. A second lane of the model (other shapes) runs on a copy.
    ``chunks_per_s`` is the session's chunk rate. A service that admits raises
    :class:`~framegraph.stream.batching.Full` when one more session's chunk would not fit in a chunk's time.
    """
    runtime.check_batched("generate-denoiser-batch", "torch", device)
    timesteps = [float(t) for t in timesteps]
    key = ("generate chunk", family, id(model), str(device), tuple(latent_size), chunk_frames, tuple(timesteps),
           bool(renoise), prompt_tokens, tuple(sorted(options.items())))

    def build() -> ChunkStep:
        # a lane's processors live in its model: a model another lane runs (other shapes) is copied for this one
        own = model if getattr(model, "_batch_lane", key) == key else copy.deepcopy(model)
        own._batch_lane = key
        return runtime.engines("generate-denoiser-batch", "torch", family, own, latent_size=tuple(latent_size),
                               chunk_frames=chunk_frames, timesteps=timesteps, renoise=bool(renoise), **options)

    lane = service.lane(key, build, build=True,
                        name=f"{family}-chunk-{latent_size[0]}x{latent_size[1]}x{chunk_frames}")
    return BatchedStream(lane.run_batch, service.client(key, None, fps=chunks_per_s))
