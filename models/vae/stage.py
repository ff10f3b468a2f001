"""``VAEDecode``: latent chunks in, face-region frames out. It is the avatar pipeline's decode stage.

    Denoiser ──latent float32 [C, T_chunk, h, w]──▶ VAEDecode ──face uint8 [H, W, 3]──▶ Composite

One input frame is a chunk of ``T_chunk`` normalised latent frames of one stream. ``T_chunk`` is 1–4. The
stage decodes it with the decoder cache of the previous chunks. So a stream decodes exactly as a whole video
would. It writes **one output frame per latent frame**, in order. Frame ``i`` of a chunk gets

    pts = chunk.pts + clock.ticks_from_frame(i, fps)

So the chunk's pts is the pts of its first frame. The next frames follow at the frame period. With the 48 kHz
clock this is exact at 25 / 30 / 50 / 60 fps. The chunk's flags, ``INTERRUPTED`` and ``DISCONTINUITY``, go on
its first frame only. ``reset()`` on barge-in drops the cache. The next chunk then starts a new stream. Its
past is its own first frame repeated.

A decoder that reads an identity reference computes the reference's features with a stream's first chunk.
They depend on the model and the reference alone. Every session of a bundle shares those. So
:func:`stream_start` hands a new stream the features a previous stream computed, such as the warm-up's. A
session's first chunk then costs as much as a steady one.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Protocol

import torch

from framegraph.stream import Flag, PortSpec, Stage

from .model import VideoVAE, uint8_to_frames


class VAEEngine(Protocol):
    """How a :class:`VAEDecode` computes: its runtime, from :mod:`framegraph.models.runtime`.

    It decodes one stream of chunks. Its decoder cache is carried from chunk to chunk. The torch engine is
    :class:`TorchVAE`."""

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """``z [1, C, T, h, w]``, normalised → frames ``[1, 3, T, H, W]`` in [-1, 1]."""

    def reset(self) -> None:
        """Start a new stream: the next chunk decodes as a first one."""


# model -> (reference [1, 3, H, W], the weights' version, the cache entries of its features): the last reference
# each model decoded with
_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _weights_version(model: VideoVAE) -> int:
    """Grows whenever a weight of ``model`` changes in place, as in an optimizer step.

    Features computed before that are stale."""
    return sum(p._version for p in model.parameters())


def stream_start(model: VideoVAE, reference: torch.Tensor | None) -> dict | None:
    """The cache a new stream of ``model`` starts from.

    It holds the ``reference.*`` entries, the reference's features. They are there when a stream of this model
    and this reference computed them before. Else it is None, and the first chunk computes them."""
    known = _REFERENCES.get(model) if reference is not None else None
    if known is None or known[0].shape != reference.shape or known[0].device != reference.device \
            or known[0].dtype != reference.dtype or known[1] != _weights_version(model) \
            or not torch.equal(known[0], reference):
        return None
    return dict(known[2])


def remember_reference(model: VideoVAE, reference: torch.Tensor | None, cache: dict) -> None:
    """Keep the reference features that a stream's first chunk put in ``cache``, for the next streams.

    :func:`stream_start` hands them out."""
    entries = {k: v for k, v in cache.items() if k.startswith("reference.")}
    if reference is not None and entries:
        _REFERENCES[model] = (reference, _weights_version(model), entries)


class TorchVAE:
    """The torch engine: :meth:`VideoVAE.decode` with its cache.

    ``reference`` is frames ``[1, 3, H, W]`` in [-1, 1], or None. It goes with a stream's first chunk. Later
    chunks find its features in the cache."""

    def __init__(self, model: VideoVAE, reference: torch.Tensor | None):
        self.model, self.reference, self.cache = model, reference, None

    def decode(self, z):
        first = self.cache is None
        if first:
            self.cache = stream_start(self.model, self.reference)
        ref = self.reference if self.cache is None else None
        frames, self.cache = self.model.decode(z, self.cache, reference=ref)
        if first and ref is not None:
            remember_reference(self.model, self.reference, self.cache)
        return frames

    def reset(self) -> None:
        self.cache = None


class ChunkDecodeStage(Stage):
    """What a stage that decodes a stream of latent chunks shares.

    Two such stages are this module's :class:`VAEDecode` and the generate pipeline's ``CausalVAEDecode``. They
    share the engine, whose stream starts anew at setup and on :meth:`reset`. They share how a chunk's frames are
    written, one by one. Frame ``i`` goes at ``chunk.pts + clock.ticks_from_frame(i, fps)``. The chunk's
    ``INTERRUPTED`` / ``DISCONTINUITY`` flags go on its first frame only. ``frames_out`` counts the frames."""

    def __init__(self, name: str, engine, *, port: str, fps: float):
        super().__init__(name)
        self.engine, self.port, self.fps = engine, port, fps
        self.frames_out = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.engine.reset()
        self.frames_out = 0

    def reset(self) -> None:
        self.engine.reset()

    def write_frames(self, out, chunk, rgb: torch.Tensor) -> None:
        """``rgb [T, H, W, 3]`` → ``T`` frames on the output port.

        ``rgb`` is uint8, or floats in 0..255 cast in the copy."""
        for i in range(rgb.shape[0]):
            f = out.write(self.port)
            f.data.copy_(rgb[i], non_blocking=True)  # a download slot on CUDA: the reader waits, not this stage
            f.pts = chunk.pts + self.ctx.clock.ticks_from_frame(i, self.fps)
            if i:
                f.flags &= ~(Flag.INTERRUPTED | Flag.DISCONTINUITY)
            self.frames_out += 1


class VAEDecode(ChunkDecodeStage):
    """Decode streamed latent chunks to face-region frames.

    Args:
        model: a :class:`VideoVAE` or a folder saved with ``save_pretrained``.
        size: ``(H, W)`` of the decoded region in px, or one int for a square. Default: the model's
            ``sample_size``. The latent size is ``size / model.spatial_compression``.
        chunk_frames: latent frames per input chunk, 1–4.
        fps: video frame rate. It sets the pts spacing of the frames of one chunk.
        device: where the latent arrives, the model runs and the frames are written.
        dtype: compute dtype of the decoder. Use ``torch.float16`` / ``bfloat16`` on a GPU for speed.
        reference: the identity reference region ``uint8 [H, W, 3]``. A ``reference_skip`` model requires it.
            Its features are computed at the start of each stream and kept in the cache.
        engine: ``engine(model, reference)`` → a :class:`VAEEngine`. The default is :class:`TorchVAE`. A
            :class:`~.batch.BatchedVAE` decodes in batches with other sessions'; its client ends with the stage.

    Ports: in ``"latent"`` ``float32 [C, chunk_frames, H/f, W/f]``; out ``"face"`` ``uint8 [H, W, 3]``.
    The output is RGB, one frame per write. Both are on ``device``.
    """

    def __init__(self, model: VideoVAE | str, *, size: int | tuple[int, int] | None = None, chunk_frames: int = 1,
                 fps: float = 25.0, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 reference: torch.Tensor | None = None,
                 engine: Callable[[VideoVAE, torch.Tensor | None], VAEEngine] = TorchVAE, name: str = "vae_decode"):
        super().__init__(name, None, port="face", fps=fps)
        self.model = model if isinstance(model, VideoVAE) else VideoVAE.from_pretrained(model, low_cpu_mem_usage=False)
        self.model = self.model.to(device).eval().requires_grad_(False)
        if next(self.model.parameters()).dtype != dtype:
            self.model = self.model.to(dtype)
        if not 1 <= int(chunk_frames) <= 4:
            raise ValueError(f"VAEDecode: chunk_frames={chunk_frames} must be 1..4 latent frames")
        if fps <= 0:
            raise ValueError(f"VAEDecode: fps={fps} must be positive")
        size = size if size is not None else self.model.config.sample_size
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        c, t, lh, lw = self.model.latent_shape(int(chunk_frames), h, w)  # checks the size
        self.size, self.chunk_frames, self.fps, self.dtype = (h, w), int(chunk_frames), fps, dtype
        self.reference = None
        if self.model.uses_reference:
            if reference is None:
                raise ValueError("VAEDecode: this VAE decodes with an identity reference; pass reference= "
                                 "(uint8 [H, W, 3] region of the portrait)")
            if tuple(reference.shape) != (h, w, 3) or reference.dtype != torch.uint8:
                raise ValueError(f"VAEDecode: reference must be uint8 [{h}, {w}, 3], got {reference.dtype} "
                                 f"{list(reference.shape)}")

            self.reference = uint8_to_frames(reference.cpu())[None].to(device=device, dtype=dtype)
        self.inputs = {"latent": PortSpec((c, t, lh, lw), torch.float32, device)}
        self.outputs = {"face": PortSpec((h, w, 3), torch.uint8, device)}
        self.engine = engine(self.model, self.reference)
        self.batched = getattr(self.engine, "batched", False)  # a .batch.BatchedVAE, whose client ends with the stage

    def teardown(self) -> None:
        if self.batched:
            self.engine.close()

    def interrupt(self) -> None:
        if self.batched:
            self.engine.cancel()  # a chunk waiting on the batch returns now

    @torch.inference_mode()
    def process(self, inputs, out):
        chunk = inputs["latent"]
        z = chunk.data[None].to(self.dtype)  # [1, C, T, h, w]
        frames = self.engine.decode(z)
        self.write_frames(out, chunk, ((frames[0].float() + 1.0) * 127.5).round_().clamp_(0, 255).permute(1, 2, 3, 0))
