"""``Denoiser``: the avatar pipeline's generation stage.

    AudioFeatures ──features float32 [F]──▶ Denoiser ──latent float32 [C, T_chunk, h, w]──▶ VAEDecode ...
                  └──state float32 [4]───▶

There is one latent frame per video frame, since the VAE does not compress time.
The stage collects ``T_chunk`` input frames. Then it generates their latents block by block.
A block holds ``frames_per_block`` frames.
Each block gets few-step Euler denoising from seeded noise.
Then the clean block is appended to the :class:`~.state.DiTStreamState`.
The stage emits one chunk whose ``pts`` is that of its first frame.
Memory is flat however long the stream runs.

Speed: ``budget_ms`` bounds the time of one ``process`` call.
The expensive call is the one that completes a chunk; the others only buffer.
So set it to what one chunk may take.
Over budget the graph steps down the fallbacks: fewer sampler steps.
A 4-step stage goes to ``"2 steps"``, then ``"1 step"``. It steps back up when comfortably inside.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from framegraph.stream import Flag, PortSpec, Stage
from framegraph.stream.batching import Missed, frame_deadline_ns

from .batch import BatchedDiT
from .generate import generate_block
from .model import AvatarDiT


class DiTEngine(Protocol):
    """How a :class:`Denoiser` computes: its runtime; see :mod:`framegraph.models.runtime`.

    It runs one stream of the model at a time.
    The torch engine is :class:`TorchDiT`. ONNX Runtime's is in the avatar's portrait kind.
    """

    def start(self, reference: torch.Tensor) -> None:
        """A new stream with identity ``reference [C, h, w]``. The stage's setup calls it."""

    def reset(self) -> None:
        """Forget the stream's past and keep its identity, for barge-in."""

    def generate(self, noise: torch.Tensor, audio: torch.Tensor, labels: torch.Tensor, steps: int,
                 shift: float) -> torch.Tensor:
        """One block: ``noise [1, C, k, h, w]``, ``audio [1, k, F]``, ``labels [1, k, S]`` → clean latents ``[1, C, k,
        h, w]``.

        The block is appended to the stream.
        """


class TorchDiT:
    """The torch engine: :func:`~.generate.generate_block` on the model's own stream state."""

    def __init__(self, model: AvatarDiT):
        self.model = model
        self.stream = None

    def start(self, reference: torch.Tensor) -> None:
        self.stream = self.model.init_stream(reference)

    def reset(self) -> None:
        self.stream.reset()

    def generate(self, noise, audio, labels, steps, shift):
        return generate_block(self.model, self.stream, noise.to(self.model.dtype), audio, labels, steps=steps,
                              shift=shift)


def step_levels(steps: int) -> list[int]:
    """Sampler steps per fallback level: ``steps`` halved down to 1. 4 → [4, 2, 1], 3 → [3, 1]."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"Denoiser: steps={steps!r}; expected an int >= 1")
    levels = [steps]
    while levels[-1] > 1:
        levels.append(max(1, levels[-1] // 2))
    return levels


class Denoiser(Stage):
    """Audio features + speaking state in, generated face latents out, one chunk per ``T_chunk`` frames.

    Args:
        model: an :class:`AvatarDiT` with ``attention="linear"``, or a folder saved with ``save_pretrained``.
        reference: ``[C, h, w]`` reference latent of the portrait. It is the identity, fixed for the stage.
        steps: sampler steps at full quality, 1-4. Fallbacks halve it down to 1.
        shift: time shift of the sampler's schedule. Use what the model was trained or distilled with.
        chunk_frames: latent frames per output chunk, ``T_chunk``. A multiple of the model's ``frames_per_block``,
            which is the default.
        seed: noise seed. The noise sequence restarts from it on :meth:`reset`, so a stream is reproducible.
        budget_ms: time one chunk may take; see the module docs. None: no fallbacks are taken.
        device: where the model runs and the ports live.
        torch_threads: intra-op threads of this stage's worker thread. None leaves torch's setting.
        max_lag_ms: for live streams on a realtime clock only. Some chunks are skipped and never generated. One is a
            chunk whose first frame has a newer one waiting behind it. Another is one whose audio arrived more than
            this long ago, by its ``capture_ns``. ``frames_skipped`` counts them. So when the machine is slower than
            the stream, each chunk starts from the freshest audio. The frame rate drops instead of a queue growing;
            see :meth:`~framegraph.stream.Stage.stale`. None: every frame is generated, for offline rendering.
        engine: what computes. ``engine(model)`` → a :class:`DiTEngine`. The default is :class:`TorchDiT`. The runtime
            registry, :mod:`framegraph.models.runtime`, makes the others. A :class:`~.batch.BatchedDiT` runs the
            blocks in batches with other sessions'. Each block gets a deadline: live, the chunk's last audio's
            arrival + ``max_lag_ms``. A chunk whose block cannot make it is skipped; ``frames_skipped`` counts its
            frames.

    Ports: in ``"features"`` ``float32 [audio_dim]`` and ``"state"`` ``float32 [4]``.
    Out ``"latent"`` ``float32 [C, T_chunk, h, w]``.
    At end of stream a partial chunk is completed by repeating its last input frame, and emitted.
    ``reset()`` is for barge-in. It forgets the stream and the partial chunk.
    The next chunk carries ``Flag.INTERRUPTED``.

    Counters:

    - ``chunks_out``, ``last_steps``.
    - ``steps_used``: steps → chunks generated with them.
    - ``frames_skipped``: late live frames; see ``max_lag_ms``.
    """

    def __init__(self, model: AvatarDiT | str, reference: torch.Tensor, *, steps: int = 4, shift: float = 1.0,
                 chunk_frames: int | None = None, seed: int = 0, budget_ms: float | None = None,
                 device: str = "cpu", torch_threads: int | None = None, max_lag_ms: float | None = None,
                 engine: Callable[[AvatarDiT], DiTEngine] = TorchDiT, name: str = "denoiser"):
        super().__init__(name)
        self.model = (model if isinstance(model, AvatarDiT)
                      else AvatarDiT.from_pretrained(model, low_cpu_mem_usage=False))
        self.model = self.model.to(device).eval()
        self.engine = engine(self.model)
        self.batched = isinstance(self.engine, BatchedDiT)
        c = self.model.config
        if c.attention != "linear":
            raise ValueError(f"Denoiser: the model has attention={c.attention!r}; streaming needs attention='linear'")
        h, w = (int(s) for s in reference.shape[-2:])
        if reference.dim() != 3 or reference.shape[0] != c.latent_channels:
            raise ValueError(f"Denoiser: reference has shape {tuple(reference.shape)}; expected "
                             f"[C={c.latent_channels}, h, w]")
        if h % c.patch_size or w % c.patch_size:
            raise ValueError(f"Denoiser: reference latent {h}x{w} is not divisible by patch_size={c.patch_size}")
        block = c.frames_per_block
        chunk = block if chunk_frames is None else int(chunk_frames)
        if chunk < 1 or chunk % block:
            raise ValueError(f"Denoiser: chunk_frames={chunk_frames}; expected a positive multiple of the model's "
                             f"frames_per_block={block}")
        self.levels = step_levels(steps)
        self.fallbacks = tuple(f"{s} step" + ("s" if s > 1 else "") for s in self.levels[1:])
        self.steps = self.levels[0]
        self.shift = shift
        self.budget_ms = budget_ms
        self.chunk_frames = chunk
        self.seed = seed
        self.torch_threads = torch_threads
        if max_lag_ms is not None and max_lag_ms <= 0:
            raise ValueError(f"Denoiser: max_lag_ms={max_lag_ms} must be positive (or None)")
        self.max_lag_ms = max_lag_ms
        self.frames_skipped = 0
        self.reference = reference.detach().to(device=device, dtype=torch.float32)
        self.inputs = {"features": PortSpec((c.audio_dim,), torch.float32, device),
                       "state": PortSpec((c.state_dim,), torch.float32, device)}
        self.outputs = {"latent": PortSpec((c.latent_channels, chunk, h, w), torch.float32, device)}
        self._device = device
        self._started = False
        self.chunks_out = 0
        self.last_steps = 0
        self.steps_used: dict[int, int] = {}

    # ---- control ------------------------------------------------------------------------------
    def set_fallback(self, level: int) -> None:
        if not 0 <= level < len(self.levels):
            raise ValueError(f"Denoiser: fallback level {level}; expected 0..{len(self.levels) - 1} ({self.fallbacks})")
        self.fallback_level = level
        self.steps = self.levels[level]

    def reset(self) -> None:
        if self._started:
            with torch.inference_mode():  # as at start and generate: the engine's tensors are inference tensors
                self.engine.reset()
            self._generator.manual_seed(self.seed)
        self._count = 0
        self._flags = Flag.INTERRUPTED

    # ---- life cycle ---------------------------------------------------------------------------
    def setup(self, ctx):
        super().setup(ctx)
        c = self.model.config
        with torch.inference_mode():
            self.engine.start(self.reference)
            if self.batched:  # each steps level's lane measured now, before the stream: not mid-stream
                for steps in self.levels:
                    self.engine.client(steps)
        self._started = True
        self._generator = torch.Generator(device=self._device).manual_seed(self.seed)
        self._features = torch.zeros(self.chunk_frames, c.audio_dim, device=self._device)
        self._labels = torch.zeros(self.chunk_frames, c.state_dim, device=self._device)
        self._count = 0
        self._flags = Flag.NONE
        self._pts = 0
        self.set_fallback(self.fallback_level)  # the graph starts every run at full quality (level 0)
        self.chunks_out = 0
        self.frames_skipped = 0
        self.steps_used = {}

    def teardown(self) -> None:
        if self.batched:
            self.engine.close()

    def interrupt(self) -> None:
        if self.batched:
            self.engine.cancel()  # a block waiting on the batch returns now

    def process(self, inputs, out):
        features, state = inputs["features"], inputs["state"]
        if self._count == 0 and self.stale(features, "features", self.max_lag_ms):
            self.frames_skipped += 1
            self._flags |= features.flags & (Flag.INTERRUPTED | Flag.DISCONTINUITY)  # kept for the next chunk
            return
        if self._count == 0:
            self._pts = features.pts
        self._features[self._count].copy_(features.data)
        self._labels[self._count].copy_(state.data)
        self._flags |= features.flags & (Flag.INTERRUPTED | Flag.DISCONTINUITY)
        self._count += 1
        if self._count == self.chunk_frames:
            if self.batched:
                self.engine.deadline_ns = frame_deadline_ns(features, self.max_lag_ms, self.ctx.clock.mode)
            self._emit(out)

    def flush(self, out):
        if self._count == 0:
            return
        self._features[self._count:] = self._features[self._count - 1]
        self._labels[self._count:] = self._labels[self._count - 1]
        self._count = self.chunk_frames
        self._emit(out)

    def _emit(self, out) -> None:
        c = self.model.config
        block, steps = c.frames_per_block, self.steps
        h, w = self.reference.shape[-2:]
        # alone, the slot comes first: the stage waits for room downstream, then works. Batched, a block may be
        # refused (Missed), so the slot comes after the work.
        frame = None if self.batched else out.write("latent")
        blocks = []
        with torch.inference_mode():
            for start in range(0, self.chunk_frames, block):
                noise = torch.randn(1, c.latent_channels, block, h, w, generator=self._generator, device=self._device)
                try:
                    blocks.append(self.engine.generate(noise, self._features[None, start:start + block],
                                                       self._labels[None, start:start + block], steps, self.shift))
                except Missed:  # the batch could not take it in time: the chunk is skipped, its flags go on
                    self.frames_skipped += self.chunk_frames
                    self._count = 0
                    return
            frame = out.write("latent") if frame is None else frame
            for start, x0 in zip(range(0, self.chunk_frames, block), blocks):
                frame.data[:, start:start + block].copy_(x0[0])
        frame.pts = self._pts
        frame.flags = (frame.flags & ~(Flag.INTERRUPTED | Flag.DISCONTINUITY)) | self._flags
        self._count = 0
        self._flags = Flag.NONE
        self.chunks_out += 1
        self.last_steps = steps
        self.steps_used[steps] = self.steps_used.get(steps, 0) + 1
