"""The generate graph's stages: a real video model streamed chunk by chunk through rings.

    text-to-video:   NoiseSource ──latent──▶ CausalDenoiser ──latent──▶ CausalVAEDecode ──video──▶ encoder / sink
    video-to-video:  video source ──video──▶ VAEEncode ──latent──▶ CausalDenoiser (strength < 1) ──▶ ...

A ``latent`` frame is one chunk: ``float32 [C, F, h, w]`` on the model's device.
``F = chunk_frames`` latent frames, in the transformer's latent space.
Video frames are ``uint8 [H, W, 3]`` RGB on the CPU, one per frame of the ring.
The causal VAE turns the stream's first latent frame into one video frame.
It turns every later one into ``r = scale_factor_temporal`` frames, 4.
So chunk ``k`` covers video frames ``[first_frame(k), first_frame(k + 1))``; see :func:`first_frame`.
Its ``pts`` is that of its first video frame.

The prompt lives in the denoiser, not on a port.
:meth:`CausalDenoiser.set_prompt` may be called from any thread.
The prompt is used from the next chunk the denoiser starts, whatever is already queued in the rings.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from framegraph.models.vae import ChunkDecodeStage, frames_to_uint8
from framegraph.stream import PortSpec, Stage
from framegraph.stream.media import video_port
from framegraph.stream.stage import EndOfStream

from .family import SHIFT, Family, warp_timesteps
from .prompts import PromptBook
from .vae import decode_chunk, encode_chunk, from_vae_scale, to_vae_scale

__all__ = ["STRENGTH_MEANING", "CausalDenoiser", "CausalVAEDecode", "CausalVAEEngine", "NoiseSource", "TorchWanVAE",
           "VAEEncode", "check_strength", "denoise_timesteps", "first_frame", "video_frames"]

STRENGTH_MEANING = ("how much of the input video to change: the noise level it is taken to, in (0, 1] "
                    "(small: close to the input; 1: nothing of it is kept)")


def check_strength(value) -> float:
    """The video-to-video ``strength`` as a float; see :data:`STRENGTH_MEANING`.

    Otherwise raises ``ValueError`` naming the value.
    It is the one check behind ``framegraph generate --strength``, the server's ``strength`` option and
    :class:`CausalDenoiser`.
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value <= 1.0
    if not ok:
        raise ValueError(f"strength={value!r}; expected a number in (0, 1]: {STRENGTH_MEANING}")
    return float(value)


def denoise_timesteps(timesteps: Sequence[float], shift: float, strength: float | None) -> list[float]:
    """The model timesteps a :class:`CausalDenoiser` samples: ``timesteps`` warped by ``shift``, scaled by the
    video-to-video ``strength`` (None: 1)."""
    return [t * (strength or 1.0) for t in warp_timesteps([float(t) for t in timesteps], shift)]


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def first_frame(chunk: int, chunk_frames: int, r: int) -> int:
    """Index of the first video frame of chunk ``chunk``.

    The VAE decodes latent frame 0 to 1 frame, later ones to ``r``.
    """
    return 0 if chunk == 0 else 1 + r * (chunk * chunk_frames - 1)


def video_frames(chunks: int, chunk_frames: int, r: int) -> int:
    """Video frames that ``chunks`` chunks decode to."""
    return first_frame(chunks, chunk_frames, r)


class NoiseSource(Stage):
    """Source of text-to-video chunks: seeded Gaussian noise ``[C, F, h, w]`` per chunk.

    It makes ``n_chunks`` of them; None means endless.
    Chunk ``k`` is stamped at video frame :func:`first_frame` ``(k)`` at ``fps``.
    ``reset()`` restarts the noise sequence and the frame count.
    """

    def __init__(self, *, channels: int, chunk_frames: int, latent_size: tuple[int, int], fps: float,
                 temporal_factor: int, n_chunks: int | None = None, seed: int = 0, device: str = "cpu",
                 name: str = "noise"):
        super().__init__(name)
        self.shape = (channels, chunk_frames, *latent_size)
        self.outputs = {"latent": PortSpec(self.shape, torch.float32, device)}
        self.fps, self.r, self.n_chunks, self.seed = fps, temporal_factor, n_chunks, seed
        self._device = device
        self.index = 0

    def setup(self, ctx):
        super().setup(ctx)
        self._generator = torch.Generator(device=self._device)
        self.reset()

    def reset(self) -> None:
        self._generator.manual_seed(self.seed)
        self.index = 0

    def process(self, inputs, out):
        if self.n_chunks is not None and self.index >= self.n_chunks:
            raise EndOfStream
        frame = out.write("latent")
        frame.data.copy_(torch.randn(self.shape, generator=self._generator, device=self._device))
        frame.pts = self.ctx.clock.ticks_from_frame(first_frame(self.index, self.shape[1], self.r), self.fps)
        self.index += 1


class VAEEncode(Stage):
    """Video frames in, latent chunks out, for video-to-video.

    It is the causal VAE encoder, its cache carried across chunks.
    It collects ``1 + r * (F - 1)`` frames for the stream's first chunk and ``r * F`` after.
    The chunk's pts is its first frame's.
    Frames ``uint8 [H, W, 3]`` on the CPU → ``float32 [C, F, H / s, W / s]``.
    """

    def __init__(self, vae, *, size: tuple[int, int], chunk_frames: int, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, name: str = "vae_encode"):
        super().__init__(name)
        height, width = size
        s, self.r = vae.config.scale_factor_spatial, vae.config.scale_factor_temporal
        self.vae, self.chunk_frames, self.dtype, self.device = vae, chunk_frames, dtype, str(device)
        self.inputs = {"video": video_port(width, height)}
        self.outputs = {"latent": PortSpec((vae.config.z_dim, chunk_frames, height // s, width // s),
                                           torch.float32, self.device)}
        self._frames: list[torch.Tensor] = []
        self._state = None
        self._pts = 0

    def reset(self) -> None:
        self._frames, self._state = [], None

    def setup(self, ctx):
        super().setup(ctx)
        self.reset()

    def _needed(self) -> int:
        return self.r * self.chunk_frames - (1 if self._state is None else 0) * (self.r - 1)

    @torch.no_grad()
    def process(self, inputs, out):
        video = inputs["video"]
        if not self._frames:
            self._pts = video.pts
        self._frames.append(video.data.to(self.device, non_blocking=True).clone())
        if len(self._frames) < self._needed():
            return
        x = torch.stack(self._frames).permute(3, 0, 1, 2)[None].to(self.dtype) / 127.5 - 1.0  # [1, 3, T, H, W]
        self._frames = []
        latents, self._state = encode_chunk(self.vae, x, self._state)
        frame = out.write("latent")
        frame.data.copy_(from_vae_scale(self.vae, latents.float())[0])
        frame.pts = self._pts


class CausalDenoiser(Stage):
    """A real video model generating one latent chunk per input chunk, with its cache of the past.

    The model is a :class:`~.family.Family`'s stock diffusers transformer.

    Args:
        family / model: the family and its loaded transformer. The streaming processors are installed here.
        prompts: the :class:`~.prompts.PromptBook` that encodes prompts, cached per prompt.
        latent_size: ``(h, w)`` of the latent frames.
        chunk_frames: ``F``.
        timesteps: few-step schedule on the 0..1000 scale, decreasing, e.g. ``(1000, 750, 500, 250)``.
        shift: flow shift that warps the nominal timesteps; see :func:`~.family.warp_timesteps`. 5 is what the Wan 2.1
            students were trained with. 1 keeps the timesteps as given.
        strength: None means the input chunk is the starting noise, for text-to-video. A number in (0, 1] means the
            input is clean latents, for video-to-video. They are noised to the level ``sigma = strength``; at 1
            nothing of them is kept. They are then denoised along the warped ``timesteps`` scaled by it.
        renoise: the few-step sampler of distilled causal students such as Self-Forcing and CausVid. It re-noises the
            ``x0`` estimate at each step. ``False``: deterministic Euler.
        seed: seed of the sampler's noise. ``reset()`` restarts it.
        options: family options. Wan takes ``attention``, ``cache_frames`` and ``sink_frames``. Both take ``backend``.
        engine: ``engine(stream)`` → the stream run on a runtime; see :mod:`framegraph.models.runtime`, model
            ``"generate-denoiser"``. None: the torch code as it is.
        stream: a stream already open, instead of ``family.open(model)``: a session's rows on batching lanes,
            :class:`~.batch.BatchedSanaStream`. ``model`` is then only read (config, dtype); ``engine`` must be None.

    Ports: in / out ``"latent"`` ``float32 [C, F, h, w]`` on the model's device.

    Counters:

    - ``chunks_out``.
    - ``prompt``: the key of the prompt the last chunk used.
    - ``prompts_used``: the chunk index where each prompt took effect, the last 64.

    Its time per chunk is the runtime's telemetry, the stage's ``work``.
    """

    def __init__(self, family: Family, model: torch.nn.Module, prompts: PromptBook, *,
                 latent_size: tuple[int, int], chunk_frames: int,
                 timesteps: Sequence[float] = (1000, 750, 500, 250), shift: float = SHIFT,
                 strength: float | None = None, renoise: bool = True, seed: int = 0, device: str = "cpu",
                 budget_ms: float | None = None, engine: Callable | None = None, stream=None,
                 name: str = "denoiser", **options):
        super().__init__(name)
        strength = None if strength is None else check_strength(strength)
        self.family, self.model, self.prompts = family, model, prompts
        if stream is not None and engine is not None:
            raise ValueError("CausalDenoiser: a stream given (batched) runs on its lanes; give no engine with it")
        self.stream = stream or family.open(model, latent_size=latent_size, chunk_frames=chunk_frames, **options)
        if engine is not None:  # the runtime (runtime "generate-denoiser": compiled blocks, CUDA-graphed steps)
            self.stream = engine(self.stream)
        self.timesteps = denoise_timesteps(timesteps, shift, strength)
        self.strength, self.renoise, self.seed = strength, renoise, seed
        self.device, self.budget_ms = str(device), budget_ms
        self.dtype = model.dtype  # diffusers: the dtype of the parameters not kept in float32
        shape = (model.config.in_channels, chunk_frames, *latent_size)
        self.inputs = {"latent": PortSpec(shape, torch.float32, self.device)}
        self.outputs = {"latent": PortSpec(shape, torch.float32, self.device)}
        self._lock = threading.Lock()
        self._pending: tuple[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        self.prompt: str | None = None
        self._embeds = None
        self.chunks_out = 0
        self.prompts_used: deque[tuple[int, str]] = deque(maxlen=64)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    # ---- control (any thread) -----------------------------------------------------------------
    def set_prompt(self, text: str | None = None, *, embeds_file: str | None = None) -> None:
        """Use this prompt from the next chunk on.

        Give ``text``, encoded by the folder's text encoder.
        Or give ``embeds_file``, precomputed; see :func:`~.prompts.load_prompt_embeds`.
        Encoding happens here, in the caller's thread.
        So a bad prompt raises to the caller and never stops the stream.
        """
        if (text is None) == (embeds_file is None):
            raise ValueError("set_prompt: give a text prompt or an embeddings file, not both or neither")
        embeds = self.prompts.text(text) if text is not None else self.prompts.file(embeds_file)
        self.set_prompt_embeds(*embeds, name=text if text is not None else f"file:{embeds_file}")

    def set_prompt_embeds(self, embeds: torch.Tensor, mask: torch.Tensor | None = None, *, name: str) -> None:
        """Use these prompt embeddings ``[L, D]`` from the next chunk on.

        In ``mask [L]`` 1 marks a token. None means all.
        """
        width = self.family.text_dim(self.model)
        if embeds.dim() != 2 or embeds.shape[1] != width:
            raise ValueError(f"set_prompt_embeds: embeddings {tuple(embeds.shape)}; expected [L, {width}]")
        mask = torch.ones(embeds.shape[0], device=embeds.device) if mask is None else mask
        with self._lock:
            self._pending = (name, (embeds.to(self.device), mask.to(self.device)))

    def reset(self) -> None:
        """Forget the stream, for a restart: empty past, and the sampler's noise from its seed again."""
        self.stream.reset()
        self._generator.manual_seed(self.seed)

    # ---- warm-up --------------------------------------------------------------------------------
    @torch.no_grad()
    def warm(self, chunks: int | None = None) -> float:
        """Run ``chunks`` dummy chunks of this stream's shape, then :meth:`reset`. Returns the seconds it took.

        On the compiled runtime the default is enough chunks to fill the cache of the past.
        Then each of its states has met the model: compiled graphs built, CUDA graphs captured.
        Otherwise the default is one.
        The prompt is the one set, else zeros of the prompt book's length.
        """
        started = time.perf_counter()
        shape = self.inputs["latent"].shape
        embeds, mask = self._embeds if self._embeds is not None else (
            torch.zeros(self.prompts.max_tokens, self.family.text_dim(self.model), device=self.device),
            torch.ones(self.prompts.max_tokens, device=self.device))
        if chunks is None:
            chunks = self.stream.warm_chunks() if self.stream.compiled else 1
        if self.stream.batched:  # before the graph's setup: the lane's client is opened for the warm-up alone
            self.stream.open()
        try:
            for _ in range(chunks):
                noise = torch.randn((1, *shape), generator=self._generator, device=self.device)
                self.stream.generate(noise.to(self.dtype), embeds[None].to(self.dtype), mask[None],
                                     timesteps=self.timesteps, renoise=self.renoise, generator=self._generator)
        finally:
            if self.stream.batched:
                self.stream.close()
        _synchronize(self.device)
        self.reset()
        return time.perf_counter() - started

    # ---- stream -------------------------------------------------------------------------------
    def setup(self, ctx):
        super().setup(ctx)
        if self.stream.batched:
            self.stream.open()
        self.reset()
        self.chunks_out = 0

    def teardown(self) -> None:
        if self.stream.batched:
            self.stream.close()

    def interrupt(self) -> None:
        if self.stream.batched:
            self.stream.cancel()  # a chunk waiting on its batch returns now

    @torch.no_grad()
    def process(self, inputs, out):
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.prompt, self._embeds = pending
            self.prompts_used.append((self.chunks_out, self.prompt))
        if self._embeds is None:
            raise ValueError("CausalDenoiser: no prompt set; call set_prompt(text) or set_prompt(embeds_file=...) "
                             "before the stream starts")
        chunk = inputs["latent"]
        x = chunk.data[None]
        if self.strength is not None:  # video-to-video: the clean input at noise level sigma = strength
            noise = torch.randn(x.shape, generator=self._generator, device=self.device)
            sigma = self.timesteps[0] / 1000.0
            x = (1.0 - sigma) * x + sigma * noise
        embeds, mask = self._embeds
        clean = self.stream.generate(x.to(self.dtype), embeds[None].to(self.dtype), mask[None],
                                     timesteps=self.timesteps, renoise=self.renoise, generator=self._generator)
        _synchronize(self.device)
        frame = out.write("latent")
        frame.data.copy_(clean[0])
        self.chunks_out += 1


class CausalVAEEngine(Protocol):
    """How a :class:`CausalVAEDecode` computes: its runtime; see :mod:`framegraph.models.runtime`.

    The torch engine is :class:`TorchWanVAE`. ONNX Runtime's is :class:`~.onnx.OrtWanVAE`.
    """

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[1, z_dim, F, h, w]`` at the VAE's scale → ``[1, 3, T, H, W]`` in [-1, 1], the cache carried."""

    def reset(self) -> None:
        """A new video: the next chunk decodes as a first one."""


class TorchWanVAE:
    """The torch engine: :func:`~.vae.decode_chunk` with its :class:`~.vae.WanDecodeState`."""

    def __init__(self, vae):
        self.vae, self.state = vae, None

    def decode(self, latents):
        video, self.state = decode_chunk(self.vae, latents, self.state)
        return video

    def reset(self) -> None:
        self.state = None


def torch_vae_engine(**_):
    """``engine(vae)`` → :class:`TorchWanVAE`: the runtime registry's torch entry."""
    return TorchWanVAE


class CausalVAEDecode(ChunkDecodeStage):
    """Latent chunks in, video frames out.

    ``AutoencoderKLWan`` decodes each chunk with :func:`~.vae.decode_chunk`.
    Its temporal cache is carried across chunks, so the stream decodes as one whole video would.

    It writes one ``uint8 [H, W, 3]`` frame per video frame.
    That is ``1 + r * (F - 1)`` for the stream's first chunk and ``r * F`` after.
    Frame ``i`` of a chunk goes at ``chunk.pts + clock.ticks_from_frame(i, fps)``.
    ``reset()`` starts a new video: the next chunk decodes as a first one.
    ``frames_out`` counts frames written.
    The time per chunk is the runtime's telemetry, the stage's ``work``.
    ``engine(vae)`` → the :class:`CausalVAEEngine` that decodes. The default is :class:`TorchWanVAE`.
    """

    def __init__(self, vae, *, latent_size: tuple[int, int], chunk_frames: int, fps: float, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, engine: Callable[..., CausalVAEEngine] = TorchWanVAE,
                 name: str = "vae_decode"):
        super().__init__(name, engine(vae), port="video", fps=fps)
        s = vae.config.scale_factor_spatial
        self.vae, self.fps, self.dtype, self.device = vae, fps, dtype, str(device)
        self.size = (latent_size[0] * s, latent_size[1] * s)
        self.inputs = {"latent": PortSpec((vae.config.z_dim, chunk_frames, *latent_size), torch.float32, self.device)}
        self.outputs = {"video": video_port(self.size[1], self.size[0])}

    @torch.no_grad()
    def warm(self, chunks: int = 3) -> float:
        """Decode ``chunks`` chunks of zeros, then start a new video. Returns the seconds it took.

        The chunks are a stream's first, its second, then a steady one. Each reads a cache of another kind.
        """
        started = time.perf_counter()
        shape = self.inputs["latent"].shape
        for _ in range(chunks):
            self.engine.decode(to_vae_scale(self.vae, torch.zeros((1, *shape), device=self.device, dtype=self.dtype)))
        _synchronize(self.device)
        self.engine.reset()
        return time.perf_counter() - started

    @torch.no_grad()
    def process(self, inputs, out):
        chunk = inputs["latent"]
        latents = to_vae_scale(self.vae, chunk.data[None].to(self.dtype))
        video = self.engine.decode(latents)  # [1, 3, T, H, W] in [-1, 1]
        self.write_frames(out, chunk, frames_to_uint8(video[0].transpose(0, 1)))  # [T, H, W, 3] on the device
