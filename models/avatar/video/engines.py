"""The video avatar's engines, per runtime (:mod:`framegraph.models.runtime`, model ``"avatar-video"``).

- ``torch``: the models themselves, on the run's device.
- ``compiled``: the shape head and the whole picture step (cut, redraw, texture, paste) compiled by Inductor
  (static shapes: the box is a tensor, :meth:`~.stages.MouthRegion.picture_at`); on CUDA the picture step replayed
  from a CUDA graph.
- ``onnx``: the audio encoder and the generator on ONNX Runtime (:mod:`.onnx`, registered there).
"""
from __future__ import annotations

from typing import NamedTuple

from framegraph.models import runtime
from framegraph.models.compile import CompileSettings, compiled


class VideoEngines(NamedTuple):
    """What each stage of a video avatar run computes with; None: the torch model itself."""

    audio: object = None  # AudioFeatures': AudioEncoder → the log-mel conv stack's runner
    head: object = None  # MouthShape's: ShapeHead → the callable run on context [1, K, D] → shape [1, P]
    generator: object = None  # MouthRegion's generator: MouthGenerator → a callable called as the generator is
    picture: object = None  # MouthRegion's device path (frame, box, shape) → the callable that makes the picture
    graphs: bool = False  # MouthRegion replays its picture step from a CUDA graph


@runtime.register("avatar-video", "torch")
def torch_engines(avatar, settings) -> VideoEngines:
    """The models themselves."""
    return VideoEngines()


@runtime.register("avatar-video", "compiled")
def compiled_engines(avatar, settings) -> VideoEngines:
    """The shape head and the picture step compiled (see the module docstring)."""
    options = CompileSettings(cuda_graphs=settings.cuda_graphs)
    return VideoEngines(head=lambda m: compiled(m, options), picture=lambda fn: compiled(fn, options),
                        graphs=options.graphs(settings.device))


__all__ = ["VideoEngines", "torch_engines", "compiled_engines"]
