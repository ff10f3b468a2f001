"""ONNX Runtime sessions bound to torch tensors' memory (CPU: IOBinding on ``data_ptr()``, no copies).

:class:`OrtGraph` is one session; :class:`CheckedExport` an export folder whose manifest was checked, which
makes them. A model's engine (:mod:`framegraph.models.runtime`) holds its stream state as torch tensors
bound to its sessions, in two sets that swap roles each step (the step reads one set and writes the other),
so the state never goes through numpy and stays bound between calls. :class:`OrtVAEStream` is the one
every streamed decoder shares — the avatar's :class:`~framegraph.models.vae.VideoVAE` and the generate
pipeline's causal ``AutoencoderKLWan``; the others live with their models.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from .manifest import ExportError


def default_threads() -> int:
    """Intra-op threads for each of a graph's heavy sessions: half the cores (at least 1) — the stages run side
    by side on successive frames, so two full-width pools would fight for the same cores."""
    return max(1, (os.cpu_count() or 2) // 2)


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
        if self.record is not None:  # calibration (quantize.py): the inputs as this run reads them
            self.record.append({n: t.numpy().copy() for n, t in self._bound.get(id(io), {}).items()})
        self.session.run_with_iobinding(io)


class OrtVAEStream:
    """Streamed decoding on ORT: the first chunk of a stream runs ``vae_first`` (reference in, when the
    decoder has one), the next ones ``vae_next`` with the temporal cache (two bound sets, swapped each chunk)
    and the reference features (bound once). ``entry``: the manifest's ``files`` (``vae_first``, ``vae_next``,
    ``vae_cache``: its ``temporal`` and ``reference`` cache keys). Shared by the avatar's VAE and the generate
    pipeline's causal Wan VAE (:mod:`.wan_vae`), whose first chunk decodes to fewer frames than the next ones:
    each graph writes its own frames buffer."""

    def __init__(self, first: OrtGraph, nxt: OrtGraph, entry: dict, reference: torch.Tensor | None = None):
        self.first, self.next = first, nxt
        self.graphs = {"vae_first": first, "vae_next": nxt}
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


__all__ = ["OrtGraph", "OrtVAEStream", "CheckedExport", "session_options", "default_threads"]
