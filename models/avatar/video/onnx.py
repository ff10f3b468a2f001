"""The video avatar on ONNX Runtime: its export and its engines, runtime ``"onnx"`` of model ``"avatar-video"``.

:func:`export_video_avatar` writes these files. The bundle fixes their shapes: batch 1, its region size ``S``.

- ``audio.onnx``: the audio encoder's conv stack (:func:`~framegraph.models.audio.onnx.export_audio_encoder`).
- ``generator.onnx``: :class:`~.lipsync.MouthGenerator`, ``masked [B, 3, S, S], mask [B, 1, S, S], reference
  [B, 3, S, S], shape [B, P] → picture [B, 3, S, S]``. Images are RGB in [0, 1]. The batch axis ``B`` is
  dynamic. One session runs ``B = 1``. A batch of sessions runs :class:`OrtBatchGenerator`.

The shape head stays in torch. It is one linear layer on a few feature vectors. So do the picture's crop,
texture and paste. They cost little next to the generator. ``manifest.json`` has the layout of every export,
from :mod:`framegraph.models.onnx.manifest`, with format :data:`FORMAT`. Its hash covers the two models' configs
and weights and the region size. So an export of another bundle, or an older one, is refused.
"""
from __future__ import annotations

import os

import torch

from framegraph.models.audio.onnx import OrtAudioEncoder, export_audio_encoder
from framegraph.models.onnx import CheckedExport, ExportError, OrtGraph, default_threads
from framegraph.models.onnx.manifest import OPSET, check_manifest, weights_hash, write_manifest
from framegraph.models.onnx.trace import export_module, io_entries, require_onnx

from ..base import onnx_dir
from .engines import VideoEngines

FORMAT = "framegraph-onnx-video-avatar/1"
PARTS = ("audio", "generator")
GENERATOR_IO = ("masked", "mask", "reference", "shape")
MEANING = {"masked": "the region with the lower face hidden, RGB in [0, 1]", "mask": "1 where the face is hidden",
           "reference": "the person's reference region, RGB in [0, 1]", "shape": "standardised mouth shape",
           "picture": "the redrawn region, RGB in [0, 1]"}


def video_avatar_hash(avatar) -> str:
    """sha256 over what the exported graphs depend on.

    That is the audio encoder's and the generator's configs and weights. It includes the region size that the
    generator's graph is fixed to."""
    return weights_hash({"region_size": avatar.region_size},
                        {"audio": avatar.audio, "generator": avatar.generator})


def load_manifest(export_dir: str, avatar) -> dict:
    """The manifest of the video avatar export ``export_dir``, checked against ``avatar``.

    Raises :class:`~framegraph.models.onnx.ExportError` naming the export command."""
    return check_manifest(export_dir, fmt=FORMAT, want_hash=video_avatar_hash(avatar), parts=PARTS,
                          hint=f"run `framegraph export --avatar BUNDLE --out {export_dir}`")


@torch.no_grad()
def export_video_avatar(avatar, out_dir: str) -> dict:
    """Write the ONNX files of the video avatar ``avatar`` and their ``manifest.json`` into ``out_dir``.

    Returns the manifest."""
    require_onnx()
    os.makedirs(out_dir, exist_ok=True)
    files = {"audio": export_audio_encoder(avatar.audio.float().eval(), out_dir)}
    gen = avatar.generator.float().eval()
    S, P = avatar.region_size, gen.config.shape_dim
    gen_args = (torch.rand(1, 3, S, S), avatar.mask.float()[None, None], torch.rand(1, 3, S, S), torch.randn(1, P))
    batch = {name: {0: "batch"} for name in (*GENERATOR_IO, "picture")}
    export_module(gen, gen_args, os.path.join(out_dir, "generator.onnx"), list(GENERATOR_IO), ["picture"],
                  dynamic_axes=batch)
    files["generator"] = {"file": "generator.onnx", "inputs": io_entries(list(GENERATOR_IO), gen_args, MEANING),
                          "outputs": io_entries(["picture"], [gen_args[0]], MEANING), "batch": "dynamic"}
    return write_manifest(out_dir, {"format": FORMAT, "opset": OPSET, "bundle_hash": video_avatar_hash(avatar),
                                    "bundle": avatar.root, "torch": torch.__version__, "files": files})


class OrtGenerator:
    """The mouth generator on ONNX Runtime, called as the torch model is.

    ``(masked, mask, reference, shape) → picture [1, 3, S, S]``. The picture is a buffer that the next call
    reuses. Inputs are bound where they lie."""

    def __init__(self, graph: OrtGraph, size: int):
        self.graph, self.io = graph, graph.binding()
        self.graphs = {"generator": graph}
        self.out = torch.empty(1, 3, size, size)
        graph.bind(self.io, "picture", self.out, output=True)

    def __call__(self, masked, mask, reference, shape) -> torch.Tensor:
        keep = [v.float().contiguous() for v in (masked, mask, reference, shape)]  # alive until the run is done
        for name, v in zip(GENERATOR_IO, keep):
            self.graph.bind(self.io, name, v)
        self.graph.run(self.io)
        return self.out


class OrtBatchGenerator:
    """The mouth generator on ONNX Runtime for a batch of sessions.

    ``(masked, mask, reference, shape)``, each ``[B, ...]`` → ``picture [B, 3, S, S]``. There is a buffer per
    ``B``, reused by the next call of that size. It needs an export with the dynamic batch axis. An older
    export is refused, naming the command that makes it again."""

    def __init__(self, graph: OrtGraph, size: int):
        batch = graph.session.get_inputs()[0].shape[0]
        if not isinstance(batch, str):
            raise ExportError(f"{graph.path} runs one session at a time (batch axis fixed to {batch}); batching "
                              f"needs an export with a dynamic batch axis: run `framegraph export --avatar BUNDLE` "
                              f"again")
        self.graph, self.io, self.size = graph, graph.binding(), size
        self.graphs = {"generator": graph}
        self.out: dict[int, torch.Tensor] = {}

    def __call__(self, masked, mask, reference, shape) -> torch.Tensor:
        B = masked.shape[0]
        out = self.out.get(B)
        if out is None:
            out = self.out[B] = torch.empty(B, 3, self.size, self.size)
        keep = [v.float().contiguous() for v in (masked, mask, reference, shape)]  # alive until the run is done
        for name, v in zip(GENERATOR_IO, keep):
            self.graph.bind(self.io, name, v)
        self.graph.bind(self.io, "picture", out, output=True)
        self.graph.run(self.io)
        return out


def onnx_batch(avatar, settings) -> OrtBatchGenerator:
    """The exported generator for batches, checked against the bundle.

    It gets ``torch_threads`` intra-op threads, by default every core. One lane runs the generator for all the
    sessions."""
    if str(settings.device) != "cpu":
        raise ValueError(f"the ONNX Runtime engines run on the CPU; got device {settings.device!r}")
    export = CheckedExport(onnx_dir(avatar, settings), load_manifest(onnx_dir(avatar, settings), avatar))
    return OrtBatchGenerator(export.graph("generator", settings.torch_threads or os.cpu_count() or 1),
                             avatar.region_size)


def onnx_engines(avatar, settings) -> VideoEngines:
    """ONNX Runtime engines from the bundle's export, checked against it.

    The generator gets ``torch_threads`` intra-op threads, by default half the cores. The audio encoder gets 1."""
    if str(settings.device) != "cpu":
        raise ValueError(f"the ONNX Runtime engines run on the CPU; got device {settings.device!r} (use runtime "
                         f"'torch' or 'compiled' on a GPU)")
    export = CheckedExport(onnx_dir(avatar, settings), load_manifest(onnx_dir(avatar, settings), avatar))
    n = settings.torch_threads or default_threads()
    size = avatar.region_size
    return VideoEngines(
        audio=lambda model: OrtAudioEncoder(export.graph("audio", 1), model.receptive_field, model.feature_dim),
        generator=lambda generator: OrtGenerator(export.graph("generator", n), size))


__all__ = ["FORMAT", "PARTS", "video_avatar_hash", "load_manifest", "export_video_avatar", "OrtGenerator",
           "OrtBatchGenerator", "onnx_batch", "onnx_engines"]
