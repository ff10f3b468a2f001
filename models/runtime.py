"""Where a model computes, its *runtime*, chosen per run from one registry.

The runtimes::

    runtime="torch"      the model's own torch code, on any device
    runtime="compiled"   the same torch code compiled by Inductor (static shapes per session, caches on disk) and,
                         on CUDA, its per-frame / per-step calls replayed from CUDA graphs (:mod:`.compile`,
                         :mod:`.graphs`); the default on CUDA where the apps choose (``--compile``)
    runtime="onnx"       ONNX Runtime on the CPU, from the model's export (``framegraph export``)
    runtime="onnx-int8"  the same, the parts the export keeps in int8 running their int8 files

A model stage does not know its runtime. It is handed an *engine*.
An engine has the one or two calls the stage makes per frame, and the stream state those calls carry.
Such calls encode audio, denoise a block or decode a chunk.
Each stage module defines its engine's protocol and the torch engine, its default.
:data:`FACTORIES` names the function that builds the stages' engines, per model and runtime.
It is imported when first asked for:

    engines = runtime.engines("avatar-portrait", "onnx", avatar, settings)

"backend" means one thing elsewhere: the kernel choice of a fast op.
That is ``auto | triton | torch``, in :mod:`framegraph.kernels.backend`. The torch runtime uses it.
"""
from __future__ import annotations

import importlib
from typing import Literal

Runtime = Literal["torch", "compiled", "onnx", "onnx-int8"]
RUNTIMES: tuple[str, ...] = ("torch", "compiled", "onnx", "onnx-int8")

# Every model's engine factories, by runtime: "module:function", imported when first asked for. A model that gains
# a runtime gains a line here.
_M = "framegraph.models"
FACTORIES: dict[str, dict[str, str]] = {
    "avatar-portrait": {"torch": f"{_M}.avatar.portrait.engines:torch_engines",
                        "compiled": f"{_M}.avatar.portrait.compiled:compiled_engines",
                        "onnx": f"{_M}.avatar.portrait.engines:onnx_engines",
                        "onnx-int8": f"{_M}.avatar.portrait.engines:onnx_int8_engines"},
    "avatar-portrait-batch": {"torch": f"{_M}.avatar.portrait.engines:torch_batch",  # the DiT's and VAE's steps
                              "compiled": f"{_M}.avatar.portrait.engines:compiled_batch",  # per batch bucket
                              "onnx": f"{_M}.avatar.portrait.engines:onnx_batch",
                              "onnx-int8": f"{_M}.avatar.portrait.engines:onnx_int8_batch"},
    "avatar-video": {"torch": f"{_M}.avatar.video.engines:torch_engines",
                     "compiled": f"{_M}.avatar.video.engines:compiled_engines",
                     "onnx": f"{_M}.avatar.video.onnx:onnx_engines"},
    "avatar-video-batch": {"torch": f"{_M}.avatar.video.engines:torch_batch",  # [B, ...] in and out
                           "compiled": f"{_M}.avatar.video.engines:compiled_batch",  # per batch bucket
                           "onnx": f"{_M}.avatar.video.onnx:onnx_batch"},
    "avatar-musetalk": {"torch": f"{_M}.avatar.musetalk.engines:torch_engines",
                        "compiled": f"{_M}.avatar.musetalk.engines:compiled_engines",
                        "onnx": f"{_M}.avatar.musetalk.onnx:onnx_engines"},
    "avatar-musetalk-batch": {"torch": f"{_M}.avatar.musetalk.engines:torch_batch",  # [B, ...] in and out
                              "onnx": f"{_M}.avatar.musetalk.onnx:onnx_batch"},
    "generate-denoiser": {"torch": f"{_M}.generate.compiled:torch_denoiser",
                          "compiled": f"{_M}.generate.compiled:compiled_denoiser"},
    "generate-denoiser-batch": {"torch": f"{_M}.generate.batch:chunk_step"},  # a chunk of each row, [B, ...]
    "generate-vae": {"torch": f"{_M}.generate.stages:torch_vae_engine",
                     "compiled": f"{_M}.generate.compiled:compiled_vae",
                     "onnx": f"{_M}.generate.onnx:onnx_vae_engine"},
}


def default_device(runtime: str = "torch") -> str:
    """Where a model runs when the caller does not choose.

    It is ``"cuda"`` when a GPU is there and ``runtime`` computes in torch: ``torch`` or ``compiled``.
    Else it is ``"cpu"``. The ``onnx`` runtimes are ONNX Runtime on the CPU.
    """
    import torch

    return "cuda" if torch.cuda.is_available() and runtime in ("torch", "compiled") else "cpu"


def default_runtime(device) -> str:
    """The runtime a model runs on when the caller does not choose.

    It is ``"compiled"`` on CUDA, with Inductor and CUDA graphs. It is ``"torch"`` elsewhere.
    Compiling on a CPU is opt-in: it takes seconds to minutes and may not pay.
    """
    import torch

    return "compiled" if torch.device(device).type == "cuda" else "torch"


def runtimes(model: str) -> tuple[str, ...]:
    """The runtimes ``model`` has engines for, in :data:`RUNTIMES` order."""
    have = FACTORIES.get(model, {})
    return tuple(r for r in RUNTIMES if r in have)


def check(model: str, runtime: str) -> str:
    """``runtime`` if ``model`` runs on it. Else a ValueError naming what it runs on."""
    if runtime not in runtimes(model):
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
        have = runtimes(model)
        named = " or ".join([", ".join(have[:-1]), have[-1]] if len(have) > 1 else list(have)) or "no runtime"
        raise ValueError(f"{model} runs on {named}, not {runtime!r}")
    return runtime


def batches(model: str, runtime: str, device) -> bool:
    """Whether ``model`` has a batched engine on ``runtime`` that runs on ``device``.

    Torch's batches, eager or compiled, run on the CPU or on CUDA. There the lane orders each session's stream with
    events (:mod:`framegraph.stream.batching`). ONNX Runtime's run on the CPU."""
    import torch

    kind = torch.device(device).type
    return runtime in runtimes(model) and (kind == "cpu" or (kind == "cuda" and runtime in ("torch", "compiled")))


def check_batched(model: str, runtime: str, device) -> str:
    """``runtime`` if ``model``'s batched engine runs on it on ``device`` (see :func:`batches`). Else a ValueError."""
    check(model, runtime)
    if not batches(model, runtime, device):
        raise ValueError(f"batching on {runtime} runs on the CPU; got device {str(device)!r} (on a GPU batch the "
                         f"sessions on torch or compiled, or run them without batching)")
    return runtime


def engines(model: str, runtime: str, /, *args, **kwargs):
    """What ``model``'s factory for ``runtime`` builds from ``args`` and ``kwargs``. See :func:`check`."""
    module, name = FACTORIES[model][check(model, runtime)].split(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


__all__ = ["Runtime", "RUNTIMES", "FACTORIES", "default_device", "default_runtime", "runtimes", "check",
           "batches", "check_batched", "engines"]
