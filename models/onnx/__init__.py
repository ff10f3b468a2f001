"""ONNX Runtime, whatever the model: tracing a module to a file (:mod:`.trace`), the manifest that ties an
export to the models it came from (:mod:`.manifest`), sessions bound zero-copy to torch tensors and the streamed
decoder every VAE shares (:mod:`.session`), int8 files (:mod:`.quantize`).

Each model's own export and engines live with the model — the avatar's in
:mod:`framegraph.models.avatar.portrait.onnx`, the generate pipeline's VAE decoder in
:mod:`framegraph.models.generate.onnx` — and are chosen per run by :mod:`framegraph.models.runtime`.
onnxruntime itself is imported when a session is made, not with this package.
"""
from .manifest import ExportError, check_manifest, weights_hash, write_manifest
from .session import CheckedExport, OrtGraph, OrtVAEStream, default_threads

__all__ = ["ExportError", "check_manifest", "weights_hash", "write_manifest", "CheckedExport", "OrtGraph",
           "OrtVAEStream", "default_threads"]
