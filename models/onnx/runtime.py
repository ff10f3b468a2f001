"""ONNX Runtime sessions bound to torch tensors' memory (CPU: IOBinding on ``data_ptr()``, no copies).

:class:`OrtGraph` is one session; the runners hold the stream state of one model as torch tensors bound
to the session, in two sets that swap roles each step (the step reads one set and writes the other), so
the state never goes through numpy and stays bound between calls:

- :class:`OrtAudioEncoder`: the audio conv stack (the streaming context is the window it is handed);
- :class:`OrtDiTStream`: denoising calls and commits of one :class:`~framegraph.models.dit.AvatarDiT` stream;
- :class:`OrtVAEStream`: streamed decoding of one :class:`~framegraph.models.vae.VideoVAE` stream, or of
  diffusers' causal ``AutoencoderKLWan`` (the generate pipeline, :mod:`.wan_vae`).
"""
from __future__ import annotations

import os

import numpy as np
import torch

from .export import dit_state_names, dit_state_outputs
from .manifest import ExportError, check_int8_file, int8_parts, load_manifest


def session_options(threads: int):
    """Latency settings: ``threads`` intra-op threads (what this stage may use while the graph's other stages
    run beside it), one inter-op thread, sequential execution, no spin-waiting (a spinning pool would take
    the cores the other stages need), every graph optimisation."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, int(threads))
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


class OrtGraph:
    """One ``InferenceSession`` (CPU execution provider) of an exported file, with IOBinding helpers."""

    def __init__(self, path: str, threads: int = 1):
        import onnxruntime as ort

        try:
            self.session = ort.InferenceSession(path, session_options(threads), providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own Fail / InvalidProtobuf / NoSuchFile types
            raise ExportError(f"{path} is not a loadable ONNX model ({type(e).__name__}: {str(e)[:200]}); "
                              f"re-run `framegraph export`") from e
        self.path = path
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.record: list[dict[str, np.ndarray]] | None = None  # a list: each run appends a copy of its inputs
        self._bound: dict[int, dict[str, torch.Tensor]] = {}  # per binding: the input tensors bound to it

    def binding(self):
        return self.session.io_binding()

    def bind(self, io, name: str, t: torch.Tensor, output: bool = False) -> None:
        """Bind ``t``'s memory (float32, contiguous, CPU) to input / output ``name``; inputs the graph
        dropped (unused) are skipped."""
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"{os.path.basename(self.path)}: {name} must be a contiguous float32 CPU tensor, "
                             f"got {t.dtype} on {t.device} (contiguous={t.is_contiguous()})")
        if output:
            io.bind_output(name, "cpu", 0, np.float32, list(t.shape), t.data_ptr())
        elif name in self.inputs:
            io.bind_input(name, "cpu", 0, np.float32, list(t.shape), t.data_ptr())
            self._bound.setdefault(id(io), {})[name] = t

    def run(self, io) -> None:
        if self.record is not None:  # calibration (models/onnx/quantize.py): the inputs as this run reads them
            self.record.append({n: t.numpy().copy() for n, t in self._bound.get(id(io), {}).items()})
        self.session.run_with_iobinding(io)


class OrtAudioEncoder:
    """``log_mel float32 [1, n_mels, T]`` → ``features [1, D, T - R + 1]`` on ORT (the callable
    :class:`~framegraph.models.audio.features.StreamingFeatures` takes as ``encode``). Its window is a
    column slice of the rolling mel context, so it is made dense first (one copy of ``n_mels × T`` floats,
    a few KB); the output is written by ORT straight into the returned tensor."""

    def __init__(self, graph: OrtGraph, receptive_field: int, feature_dim: int):
        self.graph, self.r, self.d = graph, receptive_field, feature_dim
        self.io = graph.binding()

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        log_mel = log_mel.float().contiguous()
        out = torch.empty(1, self.d, log_mel.shape[-1] - self.r + 1)
        self.graph.bind(self.io, "log_mel", log_mel)
        self.graph.bind(self.io, "features", out, output=True)
        self.graph.run(self.io)
        return out


class OrtDiTStream:
    """One DiT stream on ORT: :meth:`velocity` (read only) and :meth:`commit` (advances the state).

    ``stream``: a fresh :class:`~framegraph.models.dit.state.DiTStreamState` from ``model.init_stream``
    (torch, once per stream: the identity keys / values); its tensors are set A of the state, set B is a
    copy; ``x`` / ``audio`` / ``state_label`` are bound where they lie at each call."""

    def __init__(self, model, stream, velocity: OrtGraph, commit: OrtGraph):
        from dataclasses import replace

        self.model, self.velocity_graph, self.commit_graph = model, velocity, commit
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
        self.cio = [self._bind(commit, s) for s in self.sets]
        for p in (0, 1):
            velocity.bind(self.vio[p], "velocity", self.v, output=True)
            for name, t in zip(dit_state_outputs(len(model.blocks)), self._streamed(self.sets[1 - p])):
                commit.bind(self.cio[p], name, t, output=True)
        self.parity = 0

    @staticmethod
    def _streamed(s) -> list[torch.Tensor]:
        return [t for layer in s.layers for t in layer.tensors()] + [s.audio_history]

    def _bind(self, graph: OrtGraph, s):
        io = graph.binding()
        flat = [t for layer in s.layers for t in layer.tensors()]
        flat += [t for kv in s.ref_kv if kv is not None for t in kv]
        for name, t in zip(self.names, [s.ref, s.audio_history, *flat, *self.rope]):
            graph.bind(io, name, t)
        return io

    @property
    def frames(self) -> int:
        return self.sets[self.parity].frames

    def velocity(self, x: torch.Tensor, t: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor) -> torch.Tensor:
        """``x [1, C, k, h, w]``, ``t [1]``, ``audio [1, k, F]``, ``state_label [1, k, S]`` → velocity (a buffer
        reused by the next call)."""
        io, g = self.vio[self.parity], self.velocity_graph
        keep = [v.float().contiguous() for v in (x, t, audio, state_label)]  # alive until the run is done
        for name, v in zip(("x", "t", "audio", "state_label"), keep):
            g.bind(io, name, v)
        g.run(io)
        return self.v

    def commit(self, x0: torch.Tensor, audio: torch.Tensor, state_label: torch.Tensor) -> None:
        """Advance the stream past the clean block ``x0``: writes the other state set, which becomes current."""
        io, g = self.cio[self.parity], self.commit_graph
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


class OrtVAEStream:
    """Streamed decoding on ORT: the first chunk of a stream runs ``vae_first`` (reference in, when the
    decoder has one), the next ones ``vae_next`` with the temporal cache (two bound sets, swapped each chunk)
    and the reference features (bound once). ``entry``: the manifest's ``files`` (``vae_first``, ``vae_next``,
    ``vae_cache``: its ``temporal`` and ``reference`` cache keys). Shared by the avatar's VAE and the generate
    pipeline's causal Wan VAE (:mod:`.wan_vae`), whose first chunk decodes to fewer frames than the next ones:
    each graph writes its own frames buffer."""

    def __init__(self, first: OrtGraph, nxt: OrtGraph, entry: dict, reference: torch.Tensor | None = None):
        self.first, self.next = first, nxt
        shapes = {o["name"]: o["shape"] for o in entry["vae_first"]["outputs"]}
        next_frames = next(o["shape"] for o in entry["vae_next"]["outputs"] if o["name"] == "frames")
        keys = entry["vae_cache"]
        self.temporal, self.refkeys = keys["temporal"], keys["reference"]
        self.first_frames = torch.empty(shapes["frames"])
        self.next_frames = self.first_frames if next_frames == shapes["frames"] else torch.empty(next_frames)
        self.caches = [{k: torch.empty(shapes[f"cache:{k}"]) for k in self.temporal} for _ in (0, 1)]
        self.ref = {k: torch.empty(shapes[f"cache:{k}"]) for k in self.refkeys}
        self.reference = None if reference is None else reference.float().contiguous()
        self.fio = first.binding()
        first.bind(self.fio, "frames", self.first_frames, output=True)
        for k in self.temporal:
            first.bind(self.fio, f"cache:{k}", self.caches[0][k], output=True)
        for k in self.refkeys:
            first.bind(self.fio, f"cache:{k}", self.ref[k], output=True)
        if self.reference is not None:
            first.bind(self.fio, "reference", self.reference)
        self.nio = []
        for p in (0, 1):
            io = nxt.binding()
            nxt.bind(io, "frames", self.next_frames, output=True)
            for k in self.temporal:
                nxt.bind(io, f"cache:{k}", self.caches[p][k])
                nxt.bind(io, f"cache:{k}:out", self.caches[1 - p][k], output=True)
            for k in self.refkeys:
                nxt.bind(io, f"cache:{k}", self.ref[k])
            self.nio.append(io)
        self.started, self.parity = False, 0

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Latent chunk ``z [1, C, T, h, w]`` → frames ``[1, 3, T', H, W]`` in [-1, 1] (a buffer reused by the
        next call)."""
        z = z.float().contiguous()
        if not self.started:
            self.first.bind(self.fio, "z", z)
            self.first.run(self.fio)
            self.started, self.parity = True, 0
            return self.first_frames
        io = self.nio[self.parity]
        self.next.bind(io, "z", z)
        self.next.run(io)
        self.parity = 1 - self.parity
        return self.next_frames

    def reset(self) -> None:
        self.started = False


class CheckedExport:
    """An export directory whose manifest has been checked (:mod:`.manifest`); makes the sessions of its files."""

    def __init__(self, export_dir: str, manifest: dict):
        self.dir, self.manifest = export_dir, manifest

    def graph(self, key: str, threads: int = 1) -> OrtGraph:
        return OrtGraph(os.path.join(self.dir, self.manifest["files"][key]["file"]), threads)


class AvatarExport(CheckedExport):
    """An export directory checked against ``avatar`` (see :func:`~.manifest.load_manifest`); makes the
    sessions of each stage. ``int8``: the parts of the models the export keeps in int8 (its manifest's
    ``int8.models``, :mod:`.quantize`) load their int8 file, checked to come from the same bundle."""

    def __init__(self, export_dir: str, avatar, *, int8: bool = False):
        super().__init__(export_dir, load_manifest(export_dir, avatar))
        self.avatar = avatar
        self.int8 = int8_parts(export_dir, self.manifest) if int8 else {}

    def graph(self, key: str, threads: int = 1) -> OrtGraph:
        if key in self.int8:
            g = OrtGraph(self.int8[key], threads)
            check_int8_file(self.int8[key], g.session.get_modelmeta().custom_metadata_map, self.manifest)
            return g
        return super().graph(key, threads)
