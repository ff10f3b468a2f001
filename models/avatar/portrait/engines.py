"""The portrait avatar's engines, per runtime: :mod:`framegraph.models.runtime`, model ``"avatar-portrait"``.

- ``torch``: the stages' own defaults. They are the audio encoder itself,
  :class:`~framegraph.models.dit.TorchDiT` and :class:`~framegraph.models.vae.TorchVAE`.
- ``onnx`` / ``onnx-int8``: ONNX Runtime on the CPU from the bundle's export. It is made by :mod:`.onnx` and
  ``framegraph export --avatar``. It is checked against the bundle. An :class:`~framegraph.models.onnx.ExportError` says
  when it is missing, stale or foreign. ``onnx-int8`` runs the models the export keeps in int8 from their int8 files
  (:mod:`framegraph.models.avatar.int8`). The classes :class:`OrtAudioEncoder`, :class:`OrtDiT` and the shared
  :class:`~framegraph.models.onnx.OrtVAEStream` hold each model's stream state as torch tensors bound to the sessions.

Batched, model ``"avatar-portrait-batch"``: :func:`torch_batch` and :func:`onnx_batch` give the lanes' steps. The
ONNX Runtime ones, :class:`OrtBlockStep` and :class:`OrtDecodeStep`, need the export's dynamic batch axis.

Threads: each session gets intra-op threads. The audio encoder gets 1, for 20 ms chunks of small work. The DiT
and the decoder get ``torch_threads`` each. The default is half the cores. They run side by side on successive
frames. Two full-width pools would fight for the same cores.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import torch

from framegraph.models import runtime
from framegraph.models.audio.onnx import OrtAudioEncoder
from framegraph.models.buckets import BucketedStep
from framegraph.models.compile import CompileSettings
from framegraph.models.dit import TorchDiT
from framegraph.models.dit.batch import BatchedDiT, BlockStep
from framegraph.models.onnx import CheckedExport, ExportError, OrtGraph, OrtVAEStream, default_threads
from framegraph.models.onnx.manifest import MANIFEST, check_int8_file, int8_parts
from framegraph.models.sampler import sample_euler
from framegraph.models.vae import TorchVAE
from framegraph.models.vae.batch import BatchedVAE, DecodeStep

from ..base import onnx_dir
from .onnx import MODELS, dit_state_names, dit_state_outputs, load_manifest

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover - the engines' argument and result types
    from framegraph.models.audio import AudioEncoder
    from framegraph.models.dit import AvatarDiT, DiTEngine
    from framegraph.models.vae import VAEEngine


class PortraitEngines(NamedTuple):
    """What each stage of a portrait run computes with; see :mod:`framegraph.models.runtime`."""

    audio: Callable[[AudioEncoder], Callable] | None  # AudioFeatures': → the log-mel conv stack runner
    dit: Callable[[AvatarDiT], DiTEngine]  # the Denoiser's
    vae: Callable[..., VAEEngine]  # VAEDecode's: (model, reference) → its engine


class AvatarExport(CheckedExport):
    """An export directory checked against ``avatar``; it makes the sessions of each stage.

    See :func:`~.onnx.load_manifest`. ``int8``: the models the export keeps in int8 load their parts' int8
    files. Those are its manifest's ``int8.models``, from :mod:`framegraph.models.avatar.int8`. Each file is
    checked to come from the same bundle."""

    def __init__(self, export_dir: str, avatar, *, int8: bool = False):
        super().__init__(export_dir, load_manifest(export_dir, avatar))
        self.avatar = avatar
        hint = (f"run `framegraph export --avatar BUNDLE --out {export_dir} --int8` (or use the runtime 'onnx')")
        self.int8 = int8_parts(export_dir, self.manifest, MODELS, hint) if int8 else {}

    def graph(self, key: str, threads: int = 1) -> OrtGraph:
        if key in self.int8:
            g = OrtGraph(self.int8[key], threads)
            check_int8_file(self.int8[key], g.session.get_modelmeta().custom_metadata_map, self.manifest,
                            "re-run `framegraph export --avatar BUNDLE --int8` into this folder")
            return g
        return super().graph(key, threads)


class OrtDiTStream:
    """One DiT stream on ORT: :meth:`velocity` reads only, :meth:`append` advances the state.

    ``stream`` is a fresh :class:`~framegraph.models.dit.state.DiTStreamState` from ``model.init_stream``.
    That runs in torch, once per stream, for the identity keys and values. Its tensors are set A of the state.
    Set B is a copy. ``x`` / ``audio`` / ``state_label`` are bound where they lie at each call."""

    def __init__(self, model, stream, velocity: OrtGraph, append: OrtGraph):
        
        self.model, self.velocity_graph, self.append_graph = model, velocity, append
        c = model.config
        h, w = stream.ref.shape[-2:]
        self.block = (1, c.latent_channels, c.frames_per_block, h, w)
        self.sets = [stream, replace(stream, layers=[type(lay)(type(lay.attn)(*(t.clone() for t in lay.attn)),
                                                               lay.ffn_cache.clone()) for lay in stream.layers],
                                     audio_history=stream.audio_history.clone())]
        self.rope = [t.clone() for t in model.stream_rope(stream)]
        self.v = torch.empty(self.block)
        self.names = dit_state_names(len(model.blocks), stream.ref_kv[0] is not None)
        self.vio = [self._bind(velocity, s) for s in self.sets]
        self.cio = [self._bind(append, s) for s in self.sets]
        for p in (0, 1):
            velocity.bind(self.vio[p], "velocity", self.v, output=True)
            for name, t in zip(dit_state_outputs(len(model.blocks)), self._streamed(self.sets[1 - p])):
                append.bind(self.cio[p], name, t, output=True)
        self.parity = 0

    @staticmethod
    def _streamed(s) -> list[torch.Tensor]:
        return [t for layer in s.layers for t in layer.tensors()] + [s.audio_history]

    def _bind(self, graph: OrtGraph, s):
        io = graph.binding()
        flat = [t for layer in s.layers for t in layer.tensors()]
        flat += [t for kv in s.ref_kv if kv is not None for t in kv]
        rank = {i.name: len(i.shape) for i in graph.session.get_inputs()}.get("rope_cos", 2)
        rope = [t[None] for t in self.rope] if rank == 3 else self.rope  # [1, N, d]: an export with a batch axis
        for name, t in zip(self.names, [s.ref, s.audio_history, *flat, *rope]):
            graph.bind(io, name, t)
        return io

    @property
    def frames(self) -> int:
        return self.sets[self.parity].frames

    def velocity(self, x: torch.Tensor, t: torch.Tensor, audio: torch.Tensor,
                 state_label: torch.Tensor) -> torch.Tensor:
        """``x [1, C, k, h, w]``, ``t [1]``, ``audio [1, k, F]``, ``state_label [1, k, S]`` → velocity.

        The velocity is a buffer that the next call reuses."""
        io, g = self.vio[self.parity], self.velocity_graph
        keep = [v.float().contiguous() for v in (x, t, audio, state_label)]  # alive until the run is done
        for name, v in zip(("x", "t", "audio", "state_label"), keep):
            g.bind(io, name, v)
        g.run(io)
        return self.v

    def append(self, x0: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor) -> None:
        """Advance the stream past the clean block ``x0``. It writes the other state set, which becomes current."""
        io, g = self.cio[self.parity], self.append_graph
        keep = [v.float().contiguous() for v in (x0, audio, state_label)]  # alive until the run is done
        for name, v in zip(("x0", "audio", "state_label"), keep):
            g.bind(io, name, v)
        g.run(io)
        self.parity = 1 - self.parity
        for s in self.sets:
            s.frames += self.block[2]
        for buf, t in zip(self.rope, self.model.stream_rope(self.sets[self.parity])):
            buf.copy_(t)  # the next block's positions, into the bound buffers

    def reset(self) -> None:
        for s in self.sets:
            s.reset()
        self.parity = 0
        for buf, t in zip(self.rope, self.model.stream_rope(self.sets[0])):
            buf.copy_(t)


class OrtDiT:
    """The :class:`~framegraph.models.dit.DiTEngine` on ONNX Runtime.

    It runs the same few-step Euler sampler over the exported velocity call. Then it runs the exported append. The
    stream state is bound in place (:class:`OrtDiTStream`)."""

    def __init__(self, model, velocity: OrtGraph, append: OrtGraph):
        if model.dtype != torch.float32:
            raise ValueError(f"the ONNX Runtime DiT is float32; the model is {model.dtype}")
        self.model, self.ort = model, None
        self.graphs = {"dit_velocity": velocity, "dit_commit": append}

    def start(self, reference: torch.Tensor) -> None:
        stream = self.model.init_stream(reference)  # torch, once per stream: the identity keys / values (set A)
        self.ort = OrtDiTStream(self.model, stream, self.graphs["dit_velocity"], self.graphs["dit_commit"])

    def reset(self) -> None:
        self.ort.reset()

    def generate(self, noise, audio, labels, steps, shift):
        x0 = sample_euler(lambda x, t: self.ort.velocity(x, t, audio, labels), noise, steps=steps, shift=shift)
        self.ort.append(x0, audio, labels)
        return x0


def _ort_engines(avatar, settings, *, int8: bool) -> PortraitEngines:
    if str(settings.device) != "cpu":
        raise ValueError(f"the ONNX Runtime engines run on the CPU; got device {settings.device!r} (use runtime "
                         f"'torch' on a GPU)")
    export = AvatarExport(onnx_dir(avatar, settings), avatar, int8=int8)
    n = settings.torch_threads or default_threads()
    files = export.manifest["files"]
    return PortraitEngines(
        audio=lambda model: OrtAudioEncoder(export.graph("audio", 1), model.receptive_field, model.feature_dim),
        dit=lambda model: OrtDiT(model, export.graph("dit_velocity", n), export.graph("dit_commit", n)),
        vae=lambda model, reference: OrtVAEStream(export.graph("vae_first", n), export.graph("vae_next", n), files,
                                                  reference))


def torch_engines(avatar, settings) -> PortraitEngines:
    return PortraitEngines(audio=None, dit=TorchDiT, vae=TorchVAE)


def onnx_engines(avatar, settings) -> PortraitEngines:
    return _ort_engines(avatar, settings, int8=False)


def onnx_int8_engines(avatar, settings) -> PortraitEngines:
    return _ort_engines(avatar, settings, int8=True)


class PortraitBatch(NamedTuple):
    """The batched engines of the lanes, by what tells one lane from another."""

    dit: Callable[[int], BlockStep]  # sampler steps ↦ the DiT's block step
    vae: Callable[[list[str], dict], DecodeStep]  # cache keys, shared entries ↦ the decoder's chunk step


def torch_batch(avatar, settings) -> PortraitBatch:
    """The torch DiT's and VAE decoder's steps for a batch of streams."""
    dit, vae = avatar.dit.to(settings.device).eval(), avatar.vae.to(settings.device).eval()
    return PortraitBatch(dit=lambda steps: BlockStep(dit, steps=steps, shift=avatar.shift),
                         vae=lambda keys, shared: DecodeStep(vae, keys, shared))


def compiled_batch(avatar, settings) -> PortraitBatch:
    """:func:`torch_batch`'s steps, each run per batch bucket: compiled once per bucket and, on CUDA, replayed
    from a CUDA graph per bucket (:mod:`framegraph.models.buckets`)."""
    steps, options = torch_batch(avatar, settings), CompileSettings(cuda_graphs=settings.cuda_graphs)
    return PortraitBatch(
        dit=lambda n: BucketedStep(steps.dit(n), device=settings.device, settings=options, name=f"portrait-dit-{n}"),
        vae=lambda keys, shared: BucketedStep(steps.vae(keys, shared), device=settings.device, settings=options,
                                              name="portrait-vae"))


def dynamic_batch(graph: OrtGraph) -> OrtGraph:
    """``graph`` if its first input's batch axis is dynamic. Else an ExportError naming the command that re-exports."""
    batch = graph.session.get_inputs()[0].shape[0]
    if not isinstance(batch, str):
        raise ExportError(f"{graph.path} runs one session at a time (batch axis fixed to {batch}); batching needs an "
                          f"export with a dynamic batch axis: run `framegraph export --avatar BUNDLE` again")
    return graph


class OrtBlockStep:
    """:class:`~framegraph.models.dit.batch.BlockStep` on ONNX Runtime: one block for each row, denoised and appended.

    Called as ``BlockStep`` is, each input ``[B, ...]``. The sampler runs ``steps`` exported velocity calls, then the
    exported append. Returns new tensors: the clean block ``[B, C, k, h, w]``, then each layer's new ``kv``,
    ``k_sum`` and FFN cache, then the new audio history. Nothing passed in is changed."""

    def __init__(self, model, velocity: OrtGraph, append: OrtGraph, *, steps: int, shift: float):
        if model.dtype != torch.float32:
            raise ValueError(f"the ONNX Runtime DiT is float32; the model is {model.dtype}")
        self.model, self.steps, self.shift = model, steps, shift
        self.velocity_graph, self.append_graph = dynamic_batch(velocity), dynamic_batch(append)
        self.graphs = {"dit_velocity": velocity, "dit_commit": append}
        self.vio, self.cio = velocity.binding(), append.binding()  # one each, bound anew at each call

    def __call__(self, noise, audio, labels, cos, sin, *tensors):
        depth = len(self.model.blocks)
        state = [t.float().contiguous() for t in (*tensors, cos, sin)]  # alive until the runs are done
        names = dit_state_names(depth, len(tensors) > 2 + 3 * depth)
        audio, labels = audio.float().contiguous(), labels.float().contiguous()

        def velocity(x, t):
            g, io, v = self.velocity_graph, self.vio, torch.empty_like(x)
            x = x.contiguous()
            for name, value in zip(("x", "t", "audio", "state_label", *names), (x, t, audio, labels, *state)):
                g.bind(io, name, value)
            g.bind(io, "velocity", v, output=True)
            g.run(io)
            return v

        x0 = sample_euler(velocity, noise.float().contiguous(), steps=self.steps, shift=self.shift).contiguous()
        g, io = self.append_graph, self.cio
        for name, value in zip(("x0", "audio", "state_label", *names), (x0, audio, labels, *state)):
            g.bind(io, name, value)
        new = [torch.empty_like(t) for t in [*tensors[2:2 + 3 * depth], tensors[1]]]
        for name, t in zip(dit_state_outputs(depth), new):
            g.bind(io, name, t, output=True)
        g.run(io)
        return (x0, *new)


class OrtDecodeStep:
    """:class:`~framegraph.models.vae.batch.DecodeStep` on ONNX Runtime: the exported ``vae_next`` for each row.

    Called as ``(z, *entries)``, each ``[B, ...]``: the latents and the cache's ``keys`` entries, in order.
    ``shared`` holds the reference's entries, batch 1, for every row. ``files`` is the manifest's. Returns new
    tensors: the frames ``[B, 3, T, H, W]``, then each key's new entry."""

    def __init__(self, graph: OrtGraph, files: dict, keys: list[str], shared: dict[str, torch.Tensor]):
        self.graph, self.keys = dynamic_batch(graph), keys
        self.graphs = {"vae_next": graph}
        self.io = graph.binding()  # bound anew at each call
        missing = sorted(set(keys) - set(files["vae_cache"]["temporal"]))
        if missing:
            raise ExportError(f"{graph.path} has no cache entries {missing}; run `framegraph export --avatar BUNDLE` "
                              f"again")
        self.shared = {k: v.float().contiguous() for k, v in shared.items()}
        self.frames = next(o["shape"] for o in files["vae_next"]["outputs"] if o["name"] == "frames")[1:]

    def __call__(self, z, *entries):
        g, io = self.graph, self.io
        z, entries = z.float().contiguous(), [t.float().contiguous() for t in entries]  # alive until the run is done
        g.bind(io, "z", z)
        for k, t in (*zip(self.keys, entries), *self.shared.items()):
            g.bind(io, f"cache:{k}", t)
        frames, new = torch.empty(z.shape[0], *self.frames), [torch.empty_like(t) for t in entries]
        g.bind(io, "frames", frames, output=True)
        for k, t in zip(self.keys, new):
            g.bind(io, f"cache:{k}:out", t, output=True)
        g.run(io)
        return (frames, *new)


def onnx_batch(avatar, settings, *, int8: bool = False) -> PortraitBatch:
    """The exported DiT's and VAE decoder's steps for a batch of streams, checked against the bundle.

    The graphs are made once, at the first lane's first call, and shared by the lanes. Each gets ``torch_threads``
    intra-op threads, by default half the cores: the DiT's lane and the decoder's run side by side. An export
    without the dynamic batch axis raises :class:`~framegraph.models.onnx.ExportError`, naming the command.
    ``int8``: the parts the export keeps in int8 run their int8 files, as :func:`onnx_int8_engines`'."""
    if str(settings.device) != "cpu":
        raise ValueError(f"the ONNX Runtime engines run on the CPU; got device {settings.device!r}")
    export = AvatarExport(onnx_dir(avatar, settings), avatar, int8=int8)
    n, graphs = settings.torch_threads or default_threads(), {}

    def graph(key: str) -> OrtGraph:
        if key not in graphs:
            graphs[key] = export.graph(key, n)
        return graphs[key]

    return PortraitBatch(
        dit=lambda steps: OrtBlockStep(avatar.dit, graph("dit_velocity"), graph("dit_commit"), steps=steps,
                                       shift=avatar.shift),
        vae=lambda keys, shared: OrtDecodeStep(graph("vae_next"), export.manifest["files"], keys, shared))


def onnx_int8_batch(avatar, settings) -> PortraitBatch:
    """:func:`onnx_batch` on the int8 files. Their static scales treat each row alone."""
    return onnx_batch(avatar, settings, int8=True)


BATCHED_PARTS = ("dit_velocity", "dit_commit", "vae_next")  # the export's files a lane runs


def export_batches(avatar, settings) -> bool:
    """Whether the bundle's sessions can batch on ``settings.runtime``. Always on torch.

    On ``onnx`` and ``onnx-int8`` the export needs the dynamic batch axis. An older export says so in the log, with
    the command that re-exports, and its sessions run alone as they did. On ``onnx-int8`` its int8 files need
    static scales: dynamic int8 scales each call's activations over the whole batch, so one session's rows would
    move another's. The manifest is read, not checked again: the session's engines checked it against the bundle
    (hashing every weight) just before."""
    if settings.runtime not in ("onnx", "onnx-int8"):
        return True
    with open(os.path.join(onnx_dir(avatar, settings), MANIFEST)) as f:
        manifest = json.load(f)
    if not all(manifest["files"][k].get("batch") == "dynamic" for k in BATCHED_PARTS):
        log.warning("%s: its ONNX export has no batch axis, so its sessions run alone; run `framegraph export "
                    "--avatar BUNDLE` again to batch them", onnx_dir(avatar, settings))
        return False
    mode = manifest.get("int8", {}).get("mode")
    if settings.runtime == "onnx-int8" and mode != "static":
        log.warning("%s: its int8 files scale each call's activations (mode %s), so a batch would mix its sessions; "
                    "they run alone (`framegraph export --avatar BUNDLE --int8` makes static ones)",
                    onnx_dir(avatar, settings), mode)
        return False
    return True


def batched_engines(service, avatar, settings) -> tuple[Callable, Callable]:
    """The Denoiser's and the VAEDecode's ``engine`` on ``service``'s lanes.

    The first maps ``model ↦`` a :class:`~framegraph.models.dit.batch.BatchedDiT`, the second ``(model, reference) ↦``
    a :class:`~framegraph.models.vae.batch.BatchedVAE`. The DiT has one lane per sampler steps level, the decoder one.
    They run this bundle's models on ``settings.runtime``: ``torch`` or ``compiled`` on the CPU or CUDA, ``onnx`` or
    ``onnx-int8`` on the CPU. On ``onnx`` a stream's
    first decoder chunk still decodes alone in torch: it starts the cache. A DiT client asks at one block per
    ``frames_per_block`` frames. A service that admits raises :class:`~framegraph.stream.batching.Full` when one
    more such session would not fit. Raises :class:`ValueError` where its batched engine does not run."""
    runtime.check_batched("avatar-portrait-batch", settings.runtime, settings.device)
    steps = runtime.engines("avatar-portrait-batch", settings.runtime, avatar, settings)
    rate = avatar.fps / avatar.dit.config.frames_per_block
    where = (settings.runtime, str(settings.device))

    def dit_client(n: int):
        return service.client(("avatar-portrait dit", id(avatar.dit), *where, n, avatar.shift),
                              lambda: steps.dit(n), build=True, name=f"portrait-dit-{n}-steps-{settings.runtime}",
                              fps=rate)

    def vae_client(keys: list[str], shared: dict):  # no frame rate: the DiT's lane admits the session
        return service.client(("avatar-portrait vae", id(avatar.vae), id(avatar), *where, tuple(keys)),
                              lambda: steps.vae(keys, shared), build=True, name=f"portrait-vae-{settings.runtime}",
                              on_miss="run")

    return (lambda model: BatchedDiT(model, dit_client),
            lambda model, reference: BatchedVAE(model, reference, vae_client))


__all__ = ["PortraitEngines", "AvatarExport", "OrtDiTStream", "OrtDiT", "torch_engines", "onnx_engines",
           "onnx_int8_engines", "PortraitBatch", "torch_batch", "compiled_batch", "dynamic_batch", "OrtBlockStep",
           "OrtDecodeStep", "onnx_batch", "onnx_int8_batch", "batched_engines", "export_batches"]
