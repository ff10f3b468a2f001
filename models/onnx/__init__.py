"""ONNX Runtime backend for the avatar's stages: export (:mod:`.export`, needs the ``onnx`` package), the
manifest that ties an export to its bundle (:mod:`.manifest`), sessions bound zero-copy to torch tensors
(:mod:`.runtime`) and the stages that run on them (:mod:`.stages`); the same for the generate pipeline's
causal VAE decoder (:mod:`.wan_vae`, :mod:`.wan_stage`)."""
from .manifest import ExportError, avatar_hash, load_manifest

__all__ = ["ExportError", "avatar_hash", "load_manifest"]
