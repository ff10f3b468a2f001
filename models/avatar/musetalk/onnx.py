"""MuseTalk on ONNX Runtime: its export and its engines. This is runtime ``"onnx"`` of model ``"avatar-musetalk"``.

Files written by :func:`export_musetalk` are below. The batch axis ``B`` is dynamic. The bundle fixes the rest.

- ``unet.onnx``: the UNet at timestep 0.
  It maps ``latents [B, 8, h, w], windows [B, N, D] → latent [B, 4, h, w]``.
  The position code is added inside, as :class:`~.step.MuseTalkStep` adds it.
- ``vae_decoder.onnx``: the VAE decode, ``latent [B, 4, h, w] → face [B, S, S, 3]``.
  The face is float32 in 0..255, already rounded and clamped. The engine casts it to ``uint8``.

Whisper's encoder stays in torch. ``manifest.json`` has the layout of every export. See
:mod:`framegraph.models.onnx.manifest`; the format is :data:`FORMAT`. Its hash covers the fixed shapes and the
UNet's and the VAE's files. So an export of other files is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn

from framegraph.models.onnx import CheckedExport, ExportError, OrtGraph, default_threads
from framegraph.models.onnx.manifest import OPSET, check_manifest, write_manifest
from framegraph.models.onnx.trace import export_module, io_entries, require_onnx

from ..base import onnx_dir
from .audio import ROWS

FORMAT = "framegraph-onnx-musetalk/1"
PARTS = ("unet", "vae_decoder")
MEANING = {"latents": "the masked face's latents, then the whole face's", "windows": "each frame's audio context",
           "latent": "the redrawn face's latent", "face": "the redrawn face, RGB 0..255 (rounded)"}


class UNetAtZero(nn.Module):
    """The UNet of a :class:`~.step.MuseTalkStep` as it is exported.

    It adds the position code and runs at timestep 0."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def forward(self, latents: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
        step = self.step
        context = windows + step.code[:windows.shape[1]].to(windows.dtype)
        return step.unet(latents, step.timestep, encoder_hidden_states=context).sample


class FaceDecoder(nn.Module):
    """The VAE decode of a :class:`~.step.MuseTalkStep`: ``latent [B, 4, h, w]`` → ``float32 [B, S, S, 3]``.

    The pixel values are in 0..255, rounded."""

    def __init__(self, step):
        super().__init__()
        self.vae = step.vae

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        image = self.vae.decode(latent / self.vae.config.scaling_factor).sample
        return (image / 2 + 0.5).clamp(0, 1).mul(255).round().permute(0, 2, 3, 1)


def geometry(avatar, context_rows: int, width: int) -> dict:
    """The shapes an export is fixed to. They are the latents' ``[8, h, w]`` and the context's ``[N, D]``."""
    return {"latents": list(avatar.latents.shape[1:]), "context": [int(context_rows), int(width)]}


def files_hash(avatar, geo: dict) -> str:
    """A sha256 over the fixed shapes and the bytes of the model files.

    The files are the UNet's config and weights and the VAE folder's files. MuseTalk's models are the user's
    files. So the export is tied to them, not to a model loaded in memory."""
    h = hashlib.sha256(json.dumps(geo, sort_keys=True).encode())
    f = avatar.files
    vae_files = sorted(p for p in Path(f.vae).rglob("*") if p.is_file())
    for path in (Path(f.unet_config), Path(f.unet_weights), *vae_files):
        h.update(path.name.encode())
        with open(path, "rb") as src:
            while block := src.read(1 << 24):
                h.update(block)
    return h.hexdigest()


def _hint(export_dir: str) -> str:
    return f"run `framegraph export --avatar BUNDLE --out {export_dir}`"


def load_manifest(export_dir: str, avatar, context_rows: int, width: int) -> dict:
    """The manifest of the MuseTalk export ``export_dir``, checked against ``avatar``'s files and shapes.

    Raises :class:`~framegraph.models.onnx.ExportError` naming the export command."""
    geo = geometry(avatar, context_rows, width)
    key = ("files_hash", json.dumps(geo, sort_keys=True))  # the model files are read once per loaded bundle
    if key not in avatar.engines_cache:
        avatar.engines_cache[key] = files_hash(avatar, geo)
    return check_manifest(export_dir, fmt=FORMAT, want_hash=avatar.engines_cache[key], parts=PARTS,
                          hint=_hint(export_dir), source="MuseTalk model", geometry=geo)


@torch.no_grad()
def export_step(step, latents: torch.Tensor, windows: torch.Tensor, out_dir: str) -> dict:
    """Write ``unet.onnx`` and ``vae_decoder.onnx`` of a float32 CPU :class:`~.step.MuseTalkStep` into ``out_dir``.

    ``latents [1, 8, h, w]`` and ``windows [1, N, D]`` are the example inputs; they fix every axis but the batch.
    Returns the manifest's ``files`` section."""
    require_onnx()
    os.makedirs(out_dir, exist_ok=True)
    unet_io = {name: {0: "batch"} for name in ("latents", "windows", "latent")}
    export_module(UNetAtZero(step), (latents, windows), os.path.join(out_dir, "unet.onnx"), ["latents", "windows"],
                  ["latent"], dynamic_axes=unet_io)
    latent = UNetAtZero(step)(latents, windows)
    export_module(FaceDecoder(step), (latent,), os.path.join(out_dir, "vae_decoder.onnx"), ["latent"], ["face"],
                  dynamic_axes={name: {0: "batch"} for name in ("latent", "face")})
    face = FaceDecoder(step)(latent)
    return {"unet": {"file": "unet.onnx", "inputs": io_entries(["latents", "windows"], [latents, windows], MEANING),
                     "outputs": io_entries(["latent"], [latent], MEANING), "batch": "dynamic"},
            "vae_decoder": {"file": "vae_decoder.onnx", "inputs": io_entries(["latent"], [latent], MEANING),
                            "outputs": io_entries(["face"], [face], MEANING), "batch": "dynamic"}}


def export_musetalk(avatar, out_dir: str) -> dict:
    """Write the ONNX files of ``avatar``'s UNet step and VAE decoder into ``out_dir``.

    Their ``manifest.json`` goes beside them. Returns the manifest. The models are loaded from the bundle's files,
    in float32 on the CPU."""
    from .engines import cpu_float_models

    models = cpu_float_models(avatar)
    rows, width = ROWS * models.whisper.layers, models.whisper.width
    files = export_step(models.step, avatar.latents[:1].float(), torch.zeros(1, rows, width), out_dir)
    geo = geometry(avatar, rows, width)
    return write_manifest(out_dir, {"format": FORMAT, "opset": OPSET, "bundle_hash": files_hash(avatar, geo),
                                    "bundle": avatar.root, "torch": torch.__version__, **geo, "files": files})


class OrtStep:
    """The UNet step and the VAE decode on ONNX Runtime. It is called as :class:`~.step.MuseTalkStep` is.

    The call maps ``(latents [B, 8, h, w], windows [B, N, D]) → uint8 [B, S, S, 3]``. Buffers are kept per ``B``.
    The next call of that size reuses them. Raises :class:`~framegraph.models.onnx.ExportError` for a graph whose
    batch axis is fixed."""

    def __init__(self, unet: OrtGraph, decoder: OrtGraph, manifest: dict):
        for graph in (unet, decoder):
            batch = graph.session.get_inputs()[0].shape[0]
            if not isinstance(batch, str):
                raise ExportError(f"{graph.path}: its batch axis is fixed to {batch}; this framegraph exports it "
                                  f"dynamic: {_hint(os.path.dirname(graph.path))}")
        self.unet, self.decoder = unet, decoder
        self.graphs = {"unet": unet, "vae_decoder": decoder}
        self.io = (unet.binding(), decoder.binding())
        self.max_rows, self.width = manifest["context"]
        self.latent_shape = tuple(manifest["files"]["unet"]["outputs"][0]["shape"][1:])
        self.face_shape = tuple(manifest["files"]["vae_decoder"]["outputs"][0]["shape"][1:])
        self._out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, latents: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
        B = latents.shape[0]
        if B not in self._out:
            self._out[B] = (torch.empty(B, *self.latent_shape), torch.empty(B, *self.face_shape))
        latent, face = self._out[B]
        keep = (latents.float().contiguous(), windows.float().contiguous())  # alive until the run is done
        unet_io, decoder_io = self.io
        self.unet.bind(unet_io, "latents", keep[0])
        self.unet.bind(unet_io, "windows", keep[1])
        self.unet.bind(unet_io, "latent", latent, output=True)
        self.unet.run(unet_io)
        self.decoder.bind(decoder_io, "latent", latent)
        self.decoder.bind(decoder_io, "face", face, output=True)
        self.decoder.run(decoder_io)
        return face.to(torch.uint8)


def checked_export(avatar, settings, context_rows: int, width: int) -> CheckedExport:
    """The bundle's export with its manifest checked. It is in ``settings.onnx_dir``, else ``<bundle>/onnx``.

    CPU only: raises :class:`ValueError` for another device."""
    if str(settings.device) != "cpu":
        raise ValueError(f"the ONNX Runtime engines run on the CPU; got device {settings.device!r} (use runtime "
                         f"'torch' on a GPU)")
    where = onnx_dir(avatar, settings)
    return CheckedExport(where, load_manifest(where, avatar, context_rows, width))


def onnx_step(avatar, settings, threads: int) -> OrtStep:
    """An :class:`OrtStep` of the bundle's checked export. Each graph has ``threads`` intra-op threads."""
    from .engines import whisper_engine

    whisper = whisper_engine(avatar)
    export = checked_export(avatar, settings, ROWS * whisper.layers, whisper.width)
    return OrtStep(export.graph("unet", threads), export.graph("vae_decoder", threads), export.manifest)


def onnx_engines(avatar, settings):
    """The ONNX runtime. The step comes from the bundle's export. Whisper runs in torch, in float32 on the CPU.

    The step has ``torch_threads`` intra-op threads. The default is half the cores."""
    from .engines import MuseTalkEngines, whisper_engine

    step = onnx_step(avatar, settings, settings.torch_threads or default_threads())
    return MuseTalkEngines(step, whisper_engine(avatar), torch.float32)


def onnx_batch(avatar, settings) -> OrtStep:
    """The exported step for batches of sessions, with ``torch_threads`` intra-op threads.

    The default is every core. One lane runs it for all the sessions."""
    return onnx_step(avatar, settings, settings.torch_threads or os.cpu_count() or 1)


__all__ = ["FORMAT", "PARTS", "UNetAtZero", "FaceDecoder", "geometry", "files_hash", "load_manifest",
           "export_step", "export_musetalk", "OrtStep", "checked_export", "onnx_step", "onnx_engines", "onnx_batch"]
