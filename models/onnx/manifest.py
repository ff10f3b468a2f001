"""``manifest.json`` of an ONNX export.

The manifest says what each file's inputs and outputs are, the opset, and the hash of the models the export
came from. An export that does not match the models being run is refused with a clear message.

Every kind of export has one layout: ``format``, ``opset``, ``bundle_hash``, and ``files`` with each file's
inputs and outputs. That holds whatever model it is. Two use it: the avatar bundle's
:mod:`framegraph.models.avatar.portrait.onnx` and the generate pipeline's causal VAE decoder in
:mod:`framegraph.models.generate.onnx`. Each hashes its models with :func:`weights_hash`. Each checks an export
with :func:`check_manifest`. An export may also hold int8 versions of its files, made by :mod:`.quantize`. The
manifest's ``int8`` section lists them; :func:`int8_parts` reads it."""
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
    """A diffusers model's config without diffusers' own bookkeeping.

    Dropped are ``_name_or_path``, ``_class_name`` and ``_diffusers_version``. ``_name_or_path`` is the folder
    it was loaded from, as spelt. So the same bundle hashes the same wherever it lies and however its path is
    written."""
    return {k: v for k, v in dict(model.config).items() if not k.startswith("_")}


def weights_hash(geometry: dict, models: dict[str, torch.nn.Module],
                 config: Callable[[torch.nn.Module], dict] = model_config) -> str:
    """sha256 over the stream geometry and the models.

    The geometry is hashed as JSON. Then, per model in order, its ``config(model)`` and its weights as float32.
    Buffers count as weights."""
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
    """The manifest of ``export_dir``, checked.

    The manifest must have format ``fmt`` and the fields ``geometry``, the shapes fixed at export. Its hash must
    be ``want_hash``, the hash of the ``source`` being run. It must list files for ``parts`` and the entries
    ``extra``. Else raises :class:`ExportError`, ending with ``hint``: the command that makes a fresh export."""
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
    """``{part: path}`` of the int8 files kept in the export's ``int8`` section.

    The section's ``models`` are the models that run int8. Each is one of ``models``, which maps a model to its
    parts. The others stay float32. Raises :class:`ExportError` when the export has no int8 files. The error
    ends with ``hint``, the command that makes them."""
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
    """Refuse an int8 file whose metadata names other models than ``manifest``'s.

    The metadata key is :data:`BUNDLE_KEY`. The error ends with ``hint``, the command that makes a fresh file."""
    got, want = metadata.get(BUNDLE_KEY), manifest.get("bundle_hash")
    if got != want:
        raise ExportError(f"{path} was quantized from another bundle (hash {str(got)[:12]}…, this export's is "
                          f"{str(want)[:12]}…); {hint}")


__all__ = ["OPSET", "MANIFEST", "BUNDLE_KEY", "ExportError", "weights_hash", "write_manifest", "check_manifest",
           "int8_parts", "check_int8_file"]
