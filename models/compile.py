"""The ``"compiled"`` runtime's shared parts: Inductor compilation with static shapes, and its caches on disk.

A model's compiled engine is listed beside its torch engine, in :mod:`framegraph.models.runtime`.
It runs the same torch code through ``torch.compile``.
Inductor emits C++ on a CPU and Triton on a GPU.
Our Triton kernels are custom ops with fake implementations, so they are traced through as single nodes.
Shapes are static per session, with ``dynamic=False``.
A session's sizes are fixed when it starts. So each step compiles once for them and never again.
A new size compiles anew.
On CUDA the per-frame and per-step calls are then captured into CUDA graphs: :mod:`framegraph.models.graphs`.

Compilation is slow the first time, seconds to minutes, and it is cached on disk.
Inductor's FX-graph cache and Triton's kernel cache live under :func:`cache_dir`.
That is ``$FRAMEGRAPH_CACHE``, default ``~/.cache/framegraph``.
So a restart reloads the kernels instead of compiling them.
A pipeline's ``warm()`` runs one dummy frame or chunk at the session's shape when its model loads.
So the first real frame finds everything compiled.

:class:`CompileSettings` is what a run asks for: compile or not, CUDA graphs or not.
CUDA graphs are on by default on CUDA.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["CACHE_ENV", "GRAPHS_ENV", "CompileSettings", "cache_dir", "use_cache_dir", "compiled", "compile_in_place",
           "graphs_default"]

CACHE_ENV = "FRAMEGRAPH_CACHE"
GRAPHS_ENV = "FRAMEGRAPH_CUDA_GRAPHS"
RECOMPILE_LIMIT = 64  # guards per compiled function: a stream's cache fills in a few steps (one graph each)
_SET_BY_US: dict[str, str] = {}


def cache_dir() -> Path:
    """Where framegraph keeps its caches.

    It is ``$FRAMEGRAPH_CACHE``, else ``$XDG_CACHE_HOME/framegraph``, else ``~/.cache/framegraph``.
    """
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "framegraph"


def use_cache_dir(root: str | os.PathLike | None = None) -> dict[str, str]:
    """Point Inductor's and Triton's caches at ``root/inductor`` and ``root/triton``.

    They are ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``. ``root`` defaults to :func:`cache_dir`.
    It also turns on Inductor's FX-graph cache.
    A directory the user set in the environment wins.
    Returns the two directories in use.
    """
    root = Path(root) if root is not None else cache_dir()
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        if not _user_set(var):  # ours to (re)point
            path = str(root / sub)
            os.makedirs(path, exist_ok=True)
            os.environ[var] = _SET_BY_US[var] = path
    import torch._inductor.config as inductor

    inductor.fx_graph_cache = True
    return {"inductor": os.environ["TORCHINDUCTOR_CACHE_DIR"], "triton": os.environ["TRITON_CACHE_DIR"]}


def _user_set(var: str) -> bool:
    """Whether the environment names a cache directory that neither we nor torch's own default put there."""
    current = os.environ.get(var)
    if current is None or _SET_BY_US.get(var) == current:
        return False
    if var == "TORCHINDUCTOR_CACHE_DIR":  # Inductor writes its default into the environment at its first use
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return current != default_cache_dir()
    return True


def graphs_default(device: str | torch.device) -> bool:
    """CUDA graphs by default where they exist: on CUDA devices."""
    return torch.device(device).type == "cuda"


@dataclass(frozen=True)
class CompileSettings:
    """How the compiled runtime runs a model.

    Attributes:
        inductor: compile with ``torch.compile``.
            False runs the eager torch code, e.g. to time CUDA graphs alone.
        cuda_graphs: capture the per-frame or per-step call into CUDA graphs.
            None means on CUDA devices, unless ``$FRAMEGRAPH_CUDA_GRAPHS=0``.
            On a CPU there are none, and the call runs as it is.
    """

    inductor: bool = True
    cuda_graphs: bool | None = None

    def graphs(self, device: str | torch.device) -> bool:
        """Whether steps on ``device`` are graphed. Never off CUDA.

        It is ``cuda_graphs`` if set.
        Else it is ``$FRAMEGRAPH_CUDA_GRAPHS``, where ``0`` turns them off to time the compiled code alone.
        Else it is on for CUDA.
        """
        wanted = self.cuda_graphs
        if wanted is None:
            wanted = os.environ.get(GRAPHS_ENV, "1").strip().lower() not in ("0", "false", "off", "no")
        return bool(wanted) and torch.device(device).type == "cuda"


def _prepare() -> None:
    use_cache_dir()
    import torch._dynamo.config as dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), RECOMPILE_LIMIT))
    if hasattr(dynamo, "accumulated_recompile_limit"):
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 16 * RECOMPILE_LIMIT)


def compiled(fn, settings: CompileSettings = CompileSettings()):
    """``fn``, a function or module, compiled by Inductor with static shapes. The caches are under :func:`cache_dir`.

    It is ``fn`` itself when ``settings.inductor`` is False.
    Compilation happens at the first call of each shape.
    """
    if not settings.inductor:
        return fn
    _prepare()
    return torch.compile(fn, dynamic=False)


def compile_in_place(module: torch.nn.Module, settings: CompileSettings = CompileSettings()) -> torch.nn.Module:
    """Compile ``module``'s forward in place with ``nn.Module.compile``. Returns ``module``.

    Its state-dict keys and hooks are unchanged.
    This is how a repeated block of a transformer is compiled once and reused by every layer.
    """
    if settings.inductor:
        _prepare()
        module.compile(dynamic=False)
    return module
