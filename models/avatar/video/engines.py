"""The video avatar's engines, per runtime: :mod:`framegraph.models.runtime`, model ``"avatar-video"``.

- ``torch``: the models themselves, on the run's device.
- ``compiled``: Inductor compiles the shape head and the whole picture step: cut, redraw, texture, paste.
  Shapes are static, since the box is a tensor (:meth:`~.stages.MouthRegion.picture_at`). On CUDA the picture
  step is replayed from a CUDA graph.
- ``onnx``: the audio encoder and the generator on ONNX Runtime (:mod:`.onnx`).

Batched runs use model ``"avatar-video-batch"``, with runtimes ``torch``, ``compiled`` (one compiled call per
batch bucket, graphed on CUDA: :mod:`framegraph.models.buckets`) and ``onnx``. The generator runs for a batch of
sessions, ``[B, ...]`` in and out. A lane of a :class:`~framegraph.stream.batching.ModelService` runs
it. :func:`batched_generator` hands each session's :class:`~.stages.MouthRegion` a client of that lane.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from framegraph.models import runtime
from framegraph.models.buckets import BucketedStep
from framegraph.models.compile import CompileSettings, compiled

if TYPE_CHECKING:  # pragma: no cover - the engines' argument types
    from framegraph.models.audio import AudioEncoder

    from .lipsync import MouthGenerator, ShapeHead


class VideoEngines(NamedTuple):
    """What each stage of a video avatar run computes with. None: the torch model itself."""

    audio: Callable[[AudioEncoder], Callable] | None = None  # AudioFeatures': → the log-mel conv stack's runner
    head: Callable[[ShapeHead], Callable] | None = None  # MouthShape's: → run on context [1, K, D] → shape [1, P]
    generator: Callable[[MouthGenerator], Callable] | None = None  # MouthRegion's: → called as the generator is
    picture: Callable[[Callable], Callable] | None = None  # MouthRegion's (frame, box, shape) path → the picture
    graphs: bool = False  # MouthRegion replays its picture step from a CUDA graph


def torch_engines(avatar, settings) -> VideoEngines:
    """The models themselves."""
    return VideoEngines()


def compiled_engines(avatar, settings) -> VideoEngines:
    """The shape head and the picture step compiled; see the module docstring."""
    options = CompileSettings(cuda_graphs=settings.cuda_graphs)
    return VideoEngines(head=lambda m: compiled(m, options), picture=lambda fn: compiled(fn, options),
                        graphs=options.graphs(settings.device))


def torch_batch(avatar, settings):
    """The torch generator itself. It takes a batch: ``[B, ...]`` inputs, ``[B, 3, S, S]`` out."""
    return avatar.generator.to(settings.device).eval()


def compiled_batch(avatar, settings) -> BucketedStep:
    """The generator compiled once per batch bucket and, on CUDA, replayed from a CUDA graph per bucket."""
    return BucketedStep(torch_batch(avatar, settings), device=settings.device,
                        settings=CompileSettings(cuda_graphs=settings.cuda_graphs), name="video-generator")


def batched_generator(service, avatar, settings):
    """``generator_engine`` for :class:`~.stages.MouthRegion`, on a batching lane.

    It maps ``generator ↦`` a :class:`~framegraph.stream.batching.BatchClient` of ``service``'s lane. The lane
    runs this bundle's generator on ``settings.runtime``: ``torch`` or ``compiled`` on the CPU or CUDA, ``onnx`` on
    the CPU. The first session
    builds the lane's engine. A service that admits raises :class:`~framegraph.stream.batching.Full` when one
    more session at the avatar's frame rate would not fit."""
    runtime.check_batched("avatar-video-batch", settings.runtime, settings.device)
    key = ("avatar-video generator", id(avatar.generator), settings.runtime, str(settings.device),
           avatar.region_size, settings.onnx_dir)

    def client(generator):
        return service.client(key, lambda: runtime.engines("avatar-video-batch", settings.runtime, avatar, settings),
                              build=True, name=f"video-generator-{avatar.region_size}-{settings.runtime}",
                              fps=avatar.fps)

    return client


__all__ = ["VideoEngines", "torch_engines", "compiled_engines", "torch_batch", "compiled_batch", "batched_generator"]
