"""One home for backend choice, for every fast op in framegraph. Kernels and renderers alike use it.

Every fast op has the same layout. ``reference.py`` is pure torch. ``triton.py`` holds the kernels. The
public function is in ``__init__.py``. It calls :func:`resolve_backend` to turn ``backend: Backend = "auto"``
into ``"triton"`` or ``"torch"``:

- ``"auto"``: Triton when the inputs are on CUDA and Triton imports. Elsewhere the pure-torch reference.
- ``"triton"``: the Triton kernels. On CPU tensors this is only allowed under Triton's interpreter. That needs
  ``TRITON_INTERPRET=1`` in the environment *before* triton is first imported. The tests check the kernels
  without a GPU that way.
- ``"torch"``: the reference, differentiable by plain autograd.

The ``check_*`` helpers below are the argument checks the ops share.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Literal, get_args

import torch

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = get_args(Backend)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_installed() -> bool:
    """Whether the ``triton`` package is installed. It may still have no GPU to run on."""
    return _TRITON_INSTALLED


def triton_interpret_enabled() -> bool:
    """Whether Triton's interpreter is switched on with ``TRITON_INTERPRET=1``."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_available(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on tensors on ``device``.

    That is CUDA with a GPU present, or the CPU under Triton's interpreter.
    """
    kind = torch.device(device).type
    if not _TRITON_INSTALLED:
        return False
    return (kind == "cuda" and torch.cuda.is_available()) or (kind == "cpu" and triton_interpret_enabled())


def device_capability(device: torch.device) -> int:
    """Compute capability of a CUDA device, such as 89 for sm_89. It picks a kernel's launch configuration.

    It is 89 on the CPU. There Triton's interpreter runs sm_89's choice, the tightest, with the least shared
    memory.
    """
    if device.type != "cuda":
        return 89
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def resolve_backend(backend: Backend, *tensors: torch.Tensor | None, op: str,
                    auto_dtypes: Iterable[torch.dtype] | None = None) -> Literal["triton", "torch"]:
    """Return ``"triton"`` or ``"torch"`` for ``backend`` given the op's input tensors.

    Where ``auto_dtypes`` is given, ``"auto"`` picks Triton only when the first tensor has one of these
    dtypes. The 3DGS / 4DGS kernels compute in float32 and pass ``(torch.float32,)``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend={backend!r}; expected one of {BACKENDS}")
    if backend == "torch":
        return "torch"
    present = [t for t in tensors if t is not None]
    # len(), not bool(list): torch.compile traces this function, and dynamo of torch 2.11 cannot trace bool()
    # of a list ("Failed to trace builtin operator bool with argument types ['list']").
    on_cuda = len(present) > 0 and all(t.is_cuda for t in present)
    if backend == "auto":
        dtype_ok = auto_dtypes is None or present[0].dtype in tuple(auto_dtypes)
        return "triton" if on_cuda and _TRITON_INSTALLED and dtype_ok else "torch"
    # backend == "triton"
    if not _TRITON_INSTALLED:
        raise RuntimeError(f"{op}: backend='triton' but triton is not installed; use backend='torch'")
    if not on_cuda and not triton_interpret_enabled():
        devices = sorted({str(t.device) for t in present})
        raise ValueError(
            f"{op}: backend='triton' needs CUDA tensors, got tensors on {devices}; "
            "set TRITON_INTERPRET=1 (before triton is imported) to run the kernels on CPU, or use backend='torch'"
        )
    return "triton"


def check_float_dtype(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name}.dtype={t.dtype}; expected one of float32, float16, bfloat16")


def check_rank(op: str, name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} (rank {t.dim()}); expected rank {rank} {layout}")


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{op}: inputs are on different devices {devices}; expected one device")


def check_broadcastable(op: str, name: str, t: torch.Tensor, shape: torch.Size, layout: str) -> None:
    """Check that ``t`` broadcasts to exactly ``shape``.

    The check is plain Python. ``torch.broadcast_shapes`` is slow on the CPU for a per-frame check.
    """
    have, want = tuple(t.shape), tuple(shape)
    ok = len(have) <= len(want) and all(a == 1 or a == b for a, b in zip(reversed(have), reversed(want)))
    if not ok:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected a shape broadcastable to "
                         f"{layout}={tuple(shape)}")
