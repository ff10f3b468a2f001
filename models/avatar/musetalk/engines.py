"""MuseTalk's engines (:mod:`framegraph.models.runtime`): what its stages call per frame, on a runtime::

    engines = runtime.engines("avatar-musetalk", "torch", avatar, settings)
    engines.step(latents [B, 8, h, w], context [B, N, D]) → uint8 [B, S, S, 3]   (on settings.device)
    engines.whisper                                                             (the audio context's encoder)

- ``torch``: the UNet and the VAE in float32 on a CPU, float16 on a GPU. MuseTalk's realtime path runs them so.
- ``compiled``: the torch step compiled by Inductor, with static shapes per batch size. On CUDA each batch
  size's step replays from a CUDA graph. See :class:`CompiledStep`.
- ``onnx``: the UNet step and the VAE decoder on ONNX Runtime, from the bundle's export. See :mod:`.onnx`.

Whisper's encoder runs in float32 on the CPU, beside the audio, on every runtime. The models are loaded once per
bundle, device and precision. The bundle's sessions share them.

Batched, the model is ``"avatar-musetalk-batch"``, on runtime ``torch`` or ``onnx``. It is the step for a batch of
sessions, ``[B, ...]`` in and out. A lane of a :class:`~framegraph.stream.batching.ModelService` runs it.
Here :func:`batched_step` hands each session's :class:`~.stages.MuseTalkFace` a client of that lane.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from framegraph.models import runtime
from framegraph.models.compile import CompileSettings, compiled
from framegraph.models.graphs import GraphedStep

from .files import MuseTalkError, load_unet, load_vae, load_whisper
from .hearing import EveryLayerEngine
from .step import MuseTalkStep

_LOCK = threading.RLock()


@dataclass
class MuseTalkEngines:
    step: MuseTalkStep  # or what is called as it is (an OrtStep, a BatchClient)
    whisper: EveryLayerEngine
    dtype: torch.dtype


def cross_attention_width(avatar) -> int:
    """The UNet's cross-attention width, read from its config file. The Whisper it needs is this wide."""
    path = avatar.files.unet_config
    try:
        return int(json.loads(Path(path).read_text())["cross_attention_dim"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MuseTalkError(f"MuseTalk: the UNet's config {str(path)!r} has no cross_attention_dim ({e})") from e


def whisper_engine(avatar) -> EveryLayerEngine:
    """The bundle's Whisper encoder, every layer read, in float32 on the CPU. It is loaded once per bundle."""
    with _LOCK:
        cache = avatar.engines_cache
        if "whisper" not in cache:
            cache["whisper"] = EveryLayerEngine(load_whisper(avatar.files.whisper, cross_attention_width(avatar)))
        return cache["whisper"]


def _models(avatar, device: str, dtype: torch.dtype) -> MuseTalkEngines:
    """The bundle's models on ``device`` in ``dtype``, loaded once. They are kept on the bundle for its sessions."""
    key = (str(torch.device(device)), dtype)
    with _LOCK:
        cache = avatar.engines_cache
        if key not in cache:
            f = avatar.files
            step = MuseTalkStep(load_unet(f.unet_config, f.unet_weights), load_vae(f.vae))
            cache[key] = MuseTalkEngines(step.to(device, dtype).eval().requires_grad_(False), whisper_engine(avatar),
                                         dtype)
        return cache[key]


def cpu_float_models(avatar) -> MuseTalkEngines:
    """The torch models in float32 on the CPU. The ONNX export traces these."""
    return _models(avatar, "cpu", torch.float32)


def torch_engines(avatar, settings) -> MuseTalkEngines:
    """The torch runtime: float16 on CUDA, float32 elsewhere."""
    device = torch.device(settings.device)
    return _models(avatar, settings.device, torch.float16 if device.type == "cuda" else torch.float32)


class CompiledStep:
    """A :class:`~.step.MuseTalkStep` compiled, called as it is: ``(latents [B, 8, h, w], windows [B, N, D]) →
    uint8 [B, S, S, 3]``. Each batch size compiles once. On CUDA each is captured into a CUDA graph at its first
    call; the result is then the graph's own buffer, overwritten by the next call of that size."""

    def __init__(self, step: MuseTalkStep, settings: CompileSettings, device):
        self.max_rows, self.width = step.max_rows, step.width
        self.fn, self.graphs = compiled(step, settings), settings.graphs(device)
        self._steps: dict[int, GraphedStep] = {}

    def __call__(self, latents: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
        B = latents.shape[0]
        if B not in self._steps:
            self._steps[B] = GraphedStep(self.fn, enabled=self.graphs, name=f"musetalk step x{B}")
        return self._steps[B](latents, windows)


def compiled_engines(avatar, settings) -> MuseTalkEngines:
    """The compiled runtime: the torch engines' step compiled (CUDA graphs on CUDA unless turned off)."""
    base = torch_engines(avatar, settings)
    step = CompiledStep(base.step, CompileSettings(cuda_graphs=settings.cuda_graphs), settings.device)
    return MuseTalkEngines(step, base.whisper, base.dtype)


def torch_batch(avatar, settings) -> MuseTalkStep:
    """The torch step itself, in float32 on the CPU. It takes a batch."""
    return cpu_float_models(avatar).step


def batched_step(service, avatar, settings):
    """A :class:`~framegraph.stream.batching.BatchClient` of ``service``'s lane for this bundle's step.

    The step runs on ``settings.runtime``, ``torch`` or ``onnx``, on the CPU. The first session builds the lane's
    engine. The client asks at the avatar's frame rate. A service that admits raises
    :class:`~framegraph.stream.batching.Full` when one more such session would not fit. Raises
    :class:`ValueError` for a device other than the CPU."""
    runtime.check_batched("avatar-musetalk-batch", settings.runtime, settings.device)
    key = ("avatar-musetalk step", id(avatar), settings.runtime, settings.onnx_dir)
    return service.client(key, lambda: runtime.engines("avatar-musetalk-batch", settings.runtime, avatar, settings),
                          build=True, name=f"musetalk-step-{settings.runtime}", fps=avatar.fps)


__all__ = ["MuseTalkEngines", "CompiledStep", "cross_attention_width", "whisper_engine", "cpu_float_models",
           "torch_engines", "compiled_engines", "torch_batch", "batched_step"]
