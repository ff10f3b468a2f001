"""The portrait avatar's compiled engines: runtime ``"compiled"``, from :mod:`framegraph.models.compile`.

- :class:`CompiledDiT` runs one *block step*. That is the few-step Euler sampler over the streamed DiT. Then the
  clean block is appended. The stream state is updated in place. The step is one function of ``(noise, audio,
  labels, rope_cos, rope_sin)``. Inductor compiles the transformer layer once, :func:`compiled_layers`. Every
  layer, every sampler step and the append run through that one compilation. On CUDA the step is replayed from one
  CUDA graph per sampler-step count. The fallbacks' 4 → 2 → 1 steps each get theirs. The rotary table of the
  block's stream position is an input. It is computed outside the step. So neither graph depends on how far the
  stream has come.
- :class:`CompiledVAE` compiles the decoder's steady step. That step decodes a chunk with the stream's cache.
  It writes the temporal cache back in place. On CUDA it is also graphed. A stream's first chunk has no cache
  yet; the reference features are computed then. It runs the torch model, once.

Both compute what :class:`~framegraph.models.dit.TorchDiT` and :class:`~framegraph.models.vae.TorchVAE`
compute. ``tests/models/test_compiled_avatar.py`` checks ≤ 1e-4 relative in float32. The audio encoder stays
on its torch engine. It runs on the CPU on 20-ms chunks of varying length, in
:class:`~framegraph.models.audio.AudioFeatures`.
"""
from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from framegraph.models.compile import CompileSettings, compiled
from framegraph.models.dit.block import DiTBlock
from framegraph.models.graphs import GraphedStep
from framegraph.models.sampler import host_schedule, sample_euler, timestep_schedule
from framegraph.models.vae import remember_reference, stream_start

from .engines import PortraitEngines


def streamed_tensors(stream) -> list[torch.Tensor]:
    """The tensors :meth:`~framegraph.models.dit.AvatarDiT.append_step` returns new values for, in its order.

    Per layer they are ``kv, k_sum, ffn_cache``. Then comes the audio history."""
    return [t for layer in stream.layers for t in layer.tensors()] + [stream.audio_history]


_LAYER: dict[CompileSettings, object] = {}  # DiTBlock.forward_self compiled, one per settings in the process


def compiled_layers(model, settings: CompileSettings = CompileSettings()):
    """A view of the DiT ``model`` whose layers run one compiled ``DiTBlock.forward_self``.

    The view shares the model's parameters and buffers. The model itself stays as it is, so torch sessions of the
    same bundle stay eager. The layer is compiled once per shape, for every layer and every pass.
    It is ``model`` itself when ``settings.inductor`` is False.
    """
    if not settings.inductor:
        return model
    if settings not in _LAYER:
        _LAYER[settings] = compiled(DiTBlock.forward_self, settings)
    layer = _LAYER[settings]
    view = copy.copy(model)
    view._modules = dict(model._modules)
    blocks = []
    for block in model.blocks:
        twin = copy.copy(block)  # the same parameters and submodules
        twin.forward_self = functools.partial(layer, twin)
        blocks.append(twin)
    view._modules["blocks"] = nn.ModuleList(blocks)
    return view


class CompiledDiT:
    """The :class:`~framegraph.models.dit.DiTEngine` of the compiled runtime; see the module docs.

    ``settings.cuda_graphs`` captures each step count's block step once, at its first block. None means on CUDA."""

    def __init__(self, model, settings: CompileSettings = CompileSettings()):
        self.model, self.settings = model, settings
        self.view = compiled_layers(model, settings)
        self.stream = None
        self.steps: dict[tuple[int, float], GraphedStep] = {}
        self.rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.pool = None

    def start(self, reference: torch.Tensor) -> None:
        self.stream = self.model.init_stream(reference)
        self.steps = {}
        self.rope = tuple(t.clone() for t in self.model.stream_rope(self.stream))
        if self.settings.graphs(self.stream.ref.device):
            self.pool = torch.cuda.graph_pool_handle()

    def reset(self) -> None:
        self.stream.reset()  # in place: the captured steps keep reading the same tensors

    def _step(self, steps: int, shift: float) -> GraphedStep:
        key = (steps, shift)
        if key not in self.steps:
            model, stream = self.view, self.stream
            targets = streamed_tensors(stream)
            schedule = host_schedule(timestep_schedule(steps, shift))  # the torch engine's, as Python floats

            def block(noise, audio, labels, cos, sin):
                rope = (cos, sin)
                x0 = sample_euler(lambda x, t: model(x, t, audio, labels, stream=stream, rope=rope), noise,
                                  timesteps=schedule)
                for target, value in zip(targets, model.append_step(x0, audio, labels, stream, rope=rope)):
                    target.copy_(value)
                return x0

            self.steps[key] = GraphedStep(block, state=targets, pool=self.pool,
                                          enabled=self.settings.graphs(stream.ref.device), name=f"dit {steps} steps")
        return self.steps[key]

    def generate(self, noise, audio, labels, steps, shift):
        stream = self.stream
        for buf, value in zip(self.rope, self.model.stream_rope(stream)):
            buf.copy_(value)  # this block's positions, outside the step
        x0 = self._step(steps, shift)(noise.to(self.model.dtype), audio.to(self.model.dtype),
                                      labels.to(self.model.dtype), *self.rope)
        stream.frames += x0.shape[2]
        return x0


class CompiledVAE:
    """The :class:`~framegraph.models.vae.VAEEngine` of the compiled runtime; see the module docs."""

    def __init__(self, model, reference: torch.Tensor | None, settings: CompileSettings = CompileSettings()):
        self.model, self.reference, self.settings = model, reference, settings
        self.cache: dict | None = None  # the stream's cache: the tensors the steady step reads and updates
        self.step: GraphedStep | None = None
        self.keys: list[str] = []
        self.temporal: list[str] = []

    def reset(self) -> None:
        self.cache = None  # the next chunk is a first one; the steady step is captured again for its cache

    def decode(self, z):
        if self.cache is None:
            known = stream_start(self.model, self.reference)  # the reference's features, when a stream had them
            frames, cache = self.model.decode(z, known, reference=self.reference if known is None else None)
            if known is None:
                remember_reference(self.model, self.reference, cache)
            self.cache = {k: v.clone() for k, v in cache.items()}  # storage the steady step owns
            self.keys = list(self.cache)
            self.temporal = [k for k in self.keys if not k.startswith("reference.")]
            self.step = self._steady()
            return frames
        return self.step(z, *(self.cache[k] for k in self.keys))

    def _steady(self) -> GraphedStep:
        model, keys, temporal, cache = self.model, self.keys, self.temporal, self.cache

        def next_chunk(z, *values):
            frames, new = model.decode(z, dict(zip(keys, values)))
            for k in temporal:
                cache[k].copy_(new[k])
            return frames

        return GraphedStep(compiled(next_chunk, self.settings), state=[cache[k] for k in temporal],
                           enabled=self.settings.graphs(next(iter(cache.values())).device), name="vae next chunk")


def compiled_engines(avatar, settings) -> PortraitEngines:
    """Compiled DiT and decoder; the audio encoder on torch. See the module docs."""
    options = CompileSettings(cuda_graphs=settings.cuda_graphs)
    return PortraitEngines(audio=None, dit=lambda model: CompiledDiT(model, options),
                           vae=lambda model, reference: CompiledVAE(model, reference, options))


__all__ = ["CompiledDiT", "CompiledVAE", "compiled_engines", "compiled_layers", "streamed_tensors"]
