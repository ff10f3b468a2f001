"""Backend choice for the NeRF ops: ``"auto" | "triton" | "torch"``.

- ``"auto"``: Triton when the inputs are on CUDA (and Triton imports), the pure-torch reference elsewhere.
- ``"triton"``: the kernels; on CPU tensors only under Triton's interpreter (``TRITON_INTERPRET=1`` set
  before Triton is first imported) — how the tests check the kernels without a GPU.
- ``"torch"``: the reference, differentiable by plain autograd.
"""
from __future__ import annotations

import importlib.util
import os

from torch import Tensor

BACKENDS = ("auto", "triton", "torch")
_HAS_TRITON = importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether Triton's CPU interpreter is switched on (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def triton_usable(device) -> bool:
    """Whether the Triton kernels can run on ``device`` (CUDA, or CPU under the interpreter)."""
    dev_type = getattr(device, "type", str(device).split(":")[0])
    return _HAS_TRITON and (dev_type == "cuda" or (dev_type == "cpu" and interpreter_enabled()))


def resolve_backend(backend: str, *tensors: Tensor, op: str) -> str:
    """``"triton"`` or ``"torch"`` for ``backend`` given the op's input tensors."""
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend={backend!r}; expected one of {BACKENDS}")
    if backend == "torch":
        return "torch"
    on_cuda = bool(tensors) and all(t.is_cuda for t in tensors)
    if backend == "auto":
        return "triton" if on_cuda and _HAS_TRITON else "torch"
    if not _HAS_TRITON:
        raise RuntimeError(f"{op}: backend='triton' but triton is not installed; use backend='torch'")
    if not on_cuda and not interpreter_enabled():
        raise ValueError(f"{op}: backend='triton' needs CUDA tensors, got {sorted({str(t.device) for t in tensors})}; "
                         "set TRITON_INTERPRET=1 before triton is imported to run the kernels on CPU, "
                         "or use backend='torch'")
    return "triton"
