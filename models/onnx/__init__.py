"""ONNX Runtime, whatever the model.

The package has four modules. :mod:`.trace` traces a module to a file. :mod:`.manifest` ties an export to
the models it came from. :mod:`.session` binds sessions zero-copy to torch tensors and holds the streamed
decoder every VAE shares. :mod:`.quantize` writes int8 files.

Each model's own export and engines live with the model. The avatar's are in
:mod:`framegraph.models.avatar.portrait.onnx`. The generate pipeline's VAE decoder is in
:mod:`framegraph.models.generate.onnx`. :mod:`framegraph.models.runtime` chooses them per run.
onnxruntime itself is imported when a session is made, not with this package.
"""
from .manifest import ExportError, check_manifest, weights_hash, write_manifest
from .session import CheckedExport, OrtGraph, OrtVAEStream, default_threads

__all__ = ["ExportError", "check_manifest", "weights_hash", "write_manifest", "CheckedExport", "OrtGraph",
           "OrtVAEStream", "default_threads"]
