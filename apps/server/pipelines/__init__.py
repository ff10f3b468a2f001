"""The pipelines a session can ``start``. There is one module per pipeline in this package, found by scanning it.

A pipeline module declares ``PIPELINE = PipelineSpec(name, description, OptionsClass, build)``:

- Its options: one dataclass of :mod:`.options`, with each field's kind, default and meaning.
  From it come the ``start`` checks and their ``bad_option`` errors, :meth:`~.options.Options.parse`.
  From it also come the ``config`` checks of its ``live`` fields, and what ``GET /pipelines/NAME`` says.
- ``build(opts) -> Pipeline``: a fresh :class:`~framegraph.stream.Graph` for one session.
  It has the inputs the session feeds: client audio, camera poses, camera pictures.
  It has the sink the session sends from. See :class:`.base.Pipeline`.
- Optionally ``unavailable() -> Unavailable | None``: why this server cannot run it now.
  An example is the avatar without a bundle.

A module's top imports are light: the runtime and this package.
The models or renderers a pipeline runs are imported at the head of its ``build``.
So the server starts without them, and a session loads them on first use.
This is the rule in ``apps/cli.py``'s docstring.
``testcard.py`` and ``scope.py`` are the smallest whole examples.
A pipeline defined elsewhere joins with :func:`register`.
"""
from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable

from ..protocol import ErrorCode, ProtocolError
from .base import AUDIO_CHUNK, PCM16_FORMAT, Pipeline, PipelineSpec, PoseInput, Unavailable, add_video_out
from .options import Options, VideoOptions, bad_option, option

log = logging.getLogger("framegraph.server")

__all__ = ["PipelineSpec", "Unavailable", "register", "available", "describe", "build", "Pipeline", "PoseInput",
           "add_video_out", "Options", "VideoOptions", "option", "bad_option", "AUDIO_CHUNK", "PCM16_FORMAT"]


REGISTRY: dict[str, PipelineSpec] = {}
_scanned = False


def register(name: str, description: str, options: type[Options] = VideoOptions):
    """Decorator for a pipeline defined outside this package.

    It registers ``builder(opts: options) -> Pipeline`` under ``name``.
    """
    def wrap(builder: Callable[[Options], Pipeline]):
        REGISTRY[name] = PipelineSpec(name, description, options, builder)
        return builder
    return wrap


def _scan() -> None:
    """Import every module of this package once; each one's ``PIPELINE`` joins the registry."""
    global _scanned
    if _scanned:
        return
    for info in pkgutil.iter_modules(__path__):
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "PIPELINE", None)
        if isinstance(spec, PipelineSpec):
            REGISTRY.setdefault(spec.name, spec)
    _scanned = True


def _why_not(spec: PipelineSpec) -> Unavailable | None:
    return spec.unavailable() if spec.unavailable is not None else None


def available() -> dict[str, str]:
    """Pipeline name → description, for those this server can run now."""
    _scan()
    return {n: s.description for n, s in REGISTRY.items() if _why_not(s) is None}


def spec(name: str) -> PipelineSpec:
    """The pipeline ``name``, available or not. Raises ``unknown_pipeline`` when there is none."""
    _scan()
    if name not in REGISTRY:
        raise ProtocolError(ErrorCode.UNKNOWN_PIPELINE, f"unknown pipeline {name[:40]!r}; this server has "
                                                        f"{sorted(available())}")
    return REGISTRY[name]


def describe(name: str) -> dict:
    """``GET /pipelines/NAME``: the description, whether this server can run it, why not, and every option."""
    s = spec(name)
    why = _why_not(s)
    return {"name": name, "description": s.description, "available": why is None,
            **({"unavailable": why.reason} if why else {}), "options": s.options.schema()}


def build(name: str, options: dict | None, batching: bool = False) -> Pipeline:
    """Build a fresh pipeline for one session.

    ``batching`` is the server's :attr:`~..config.ServerConfig.batching`. Pipelines read it as ``opts.batching``.
    Raises :class:`ProtocolError` with ``unknown_pipeline`` or ``bad_option``.
    """
    s = spec(name)
    why = _why_not(s)
    if why is not None:
        log.warning("pipeline %r asked for but not available: %s", name, why.fix)
        raise ProtocolError(ErrorCode.UNKNOWN_PIPELINE, f"pipeline {name!r} is not available on this server: "
                                                        f"{why.reason}")
    opts = s.options.parse(options, name)
    opts.batching = batching
    pipeline = s.build(opts)
    pipeline.format = {"pipeline": name, **pipeline.format}
    pipeline.options = s.options
    pipeline.timing_indices()
    return pipeline
