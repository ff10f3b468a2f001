"""Tracing a torch module into an ONNX file, and describing its inputs and outputs for the manifest.

Every model's export uses this one exporter. Two do so: the avatar's
:mod:`framegraph.models.avatar.portrait.onnx` and the generate pipeline's :mod:`framegraph.models.generate.onnx`.
It is the TorchScript tracer at :data:`~.manifest.OPSET`. It writes ``aten::rms_norm`` out, since opset 17 has no
RMSNormalization.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from .manifest import OPSET


def _rms_norm(g, x, normalized_shape, weight, eps):
    """ONNX for ``aten::rms_norm`` over the last axis, as in ``nn.RMSNorm(dim)``.

    Opset 17 has no RMSNormalization. The graph is ``x / sqrt(mean(x², -1) + eps) * weight``."""
    from torch.onnx import symbolic_helper as sh

    eps = sh._maybe_get_const(eps, "f")
    eps = 1e-6 if sh._is_none(eps) or eps is None else float(eps)
    mean = g.op("ReduceMean", g.op("Mul", x, x), axes_i=[-1], keepdims_i=1)
    y = g.op("Div", x, g.op("Sqrt", g.op("Add", mean, g.op("Constant", value_t=torch.tensor(eps)))))
    return y if sh._is_none(weight) else g.op("Mul", y, weight)


def export_module(module: nn.Module, args: tuple, path: str, inputs: list[str], outputs: list[str],
            dynamic_axes: dict | None = None) -> None:
    """Trace ``module`` on ``args`` into the ONNX file ``path``.

    It uses the TorchScript exporter at opset :data:`~.manifest.OPSET`, with constants folded. The inputs and
    outputs get these names and ``dynamic_axes``."""
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm, OPSET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python ints taken from shapes (fixed per bundle)
        torch.onnx.export(module, args, path, input_names=inputs, output_names=outputs, opset_version=OPSET,
                          dynamic_axes=dynamic_axes, do_constant_folding=True, dynamo=False)


def io_entries(names: list[str], tensors, meaning: dict[str, str]) -> list[dict]:
    """The manifest's description of graph inputs and outputs.

    Each entry has a name, shape and dtype. Its meaning is the value of the first key of ``meaning`` that the
    name starts with. Without one, the meaning is the name."""
    return [{"name": n, "shape": list(t.shape), "dtype": "float32",
             "meaning": next((v for k, v in meaning.items() if n.startswith(k)), n)}
            for n, t in zip(names, tensors)]


def require_onnx() -> None:
    """The ``onnx`` package, which ``torch.onnx.export`` needs, or a clear error naming the extra."""
    try:
        import onnx  # noqa: F401
    except ImportError as e:
        raise RuntimeError("exporting to ONNX needs the onnx package: pip install 'framegraph[export]'") from e


__all__ = ["export_module", "io_entries", "require_onnx"]
