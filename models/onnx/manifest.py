"""``manifest.json`` of an ONNX export: what each file's inputs / outputs are, the opset, and the hash of the
models it came from — so an export that does not match the models being run is refused with a clear message.

One layout for every kind of export (``format``, ``opset``, ``bundle_hash``, ``files`` with each file's
inputs / outputs), whatever model it holds — the avatar bundle's (:mod:`framegraph.models.avatar.portrait.onnx`)
or the generate pipeline's causal VAE decoder (:mod:`framegraph.models.generate.onnx`): each hashes its models
with :func:`weights_hash` and checks an export with :func:`check_manifest`. An export may also hold int8
versions of its files (:mod:`.quantize`), listed in the manifest's ``int8`` section (:func:`int8_parts`)."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

import torch

from framegraph.stream.files import write_json

OPSET = 17
MANIFEST = "manifest.json"
BUNDLE_KEY = "framegraph.bundle_hash"  # metadata of an int8 file: the bundle it was quantized from


class ExportError(ValueError):
    """A missing, stale, foreign or unreadable ONNX export."""


def model_config(model: torch.nn.Module) -> dict:
    """A diffusers model's config without diffusers' own bookkeeping (``_name_or_path`` — the folder it was loaded
    from, as spelt —, ``_class_name``, ``_diffusers_version``): the same bundle hashes the same wherever it lies
    and however its path is written."""
    return {k: v for k, v in dict(model.config).items() if not k.startswith("_")}


def weights_hash(geometry: dict, models: dict[str, torch.nn.Module],
                 config: Callable[[torch.nn.Module], dict] = model_config) -> str:
    """sha256 over the stream geometry (JSON) and, per model in order, its ``config(model)`` and its weights
    (buffers included) as float32."""
    h = hashlib.sha256()
    h.update(json.dumps(geometry, sort_keys=True).encode())
    for name, model in models.items():
        h.update(json.dumps({name: config(model)}, sort_keys=True, default=str).encode())
        for key, t in model.state_dict().items():
            h.update(key.encode())
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def write_manifest(out_dir: str, manifest: dict) -> dict:
    write_json(os.path.join(out_dir, MANIFEST), manifest, indent=1)
    return manifest


def check_manifest(export_dir: str, *, fmt: str, want_hash: str, parts: tuple[str, ...], hint: str,
                   source: str = "bundle", extra: tuple[str, ...] = (), geometry: dict | None = None) -> dict:
    """The manifest of ``export_dir`` if it has format ``fmt``, the fields ``geometry`` (shapes fixed at export),
    the hash ``want_hash`` (of the ``source`` being run) and files for ``parts`` (and entries ``extra``); else
    :class:`ExportError` ending with ``hint`` (the command that makes a fresh export)."""
    path = os.path.join(export_dir, MANIFEST)
    if not os.path.isfile(path):
        raise ExportError(f"no ONNX export at {export_dir} ({MANIFEST} not found); {hint}")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ExportError(f"{path} is not a readable export manifest ({e}); {hint}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise ExportError(f"{path}: format {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                          f"expected {fmt!r}; {hint}")
    for key, want in (geometry or {}).items():
        if manifest.get(key) != want:
            raise ExportError(f"the ONNX export at {export_dir} was made for {key}={manifest.get(key)!r}; this run "
                              f"needs {key}={want!r} (an export's shapes are fixed); {hint}")
    if manifest.get("bundle_hash") != want_hash:
        raise ExportError(f"the ONNX export at {export_dir} was made from another or an older {source} "
                          f"({manifest.get('bundle')!r}, hash {str(manifest.get('bundle_hash'))[:12]}…; this "
                          f"{source}'s is {want_hash[:12]}…): it is stale; {hint}")
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    missing = [k for k in (*parts, *extra) if k not in files]
    if missing:
        raise ExportError(f"{path} does not describe {', '.join(missing)}; {hint}")
    for key in parts:
        name = files[key].get("file", "")
        if not os.path.isfile(os.path.join(export_dir, name)):
            raise ExportError(f"the ONNX export at {export_dir} lacks {name} ({key}); {hint}")
    return manifest


def int8_parts(export_dir: str, manifest: dict, models: dict[str, tuple[str, ...]], hint: str) -> dict[str, str]:
    """``{part: path}`` of the int8 files the export's ``int8`` section keeps (its ``models``: the models that run
    int8, each one of ``models`` (model → its parts); the others stay float32). Raises :class:`ExportError`
    when the export has no int8 files (ending with ``hint``, the command that makes them)."""
    section = manifest.get("int8")
    if not isinstance(section, dict) or not isinstance(section.get("files"), dict):
        raise ExportError(f"the ONNX export at {export_dir} has no int8 files; {hint}")
    out = {}
    for model in section.get("models", []):
        if model not in models:
            raise ExportError(f"{export_dir}/{MANIFEST}: int8 model {model!r}; expected some of {list(models)}")
        for part in models[model]:
            name = section["files"].get(part, {}).get("file", "")
            if not name or not os.path.isfile(os.path.join(export_dir, name)):
                raise ExportError(f"the ONNX export at {export_dir} lacks the int8 file of {part} "
                                  f"({name or 'not recorded'}); {hint}")
            out[part] = os.path.join(export_dir, name)
    return out


def check_int8_file(path: str, metadata: dict, manifest: dict, hint: str) -> None:
    """Refuse an int8 file whose metadata (:data:`BUNDLE_KEY`) names other models than ``manifest``'s (the
    error ends with ``hint``, the command that makes a fresh one)."""
    got, want = metadata.get(BUNDLE_KEY), manifest.get("bundle_hash")
    if got != want:
        raise ExportError(f"{path} was quantized from another bundle (hash {str(got)[:12]}…, this export's is "
                          f"{str(want)[:12]}…); {hint}")


__all__ = ["OPSET", "MANIFEST", "BUNDLE_KEY", "ExportError", "weights_hash", "write_manifest", "check_manifest",
           "int8_parts", "check_int8_file"]
