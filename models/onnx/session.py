"""ONNX Runtime sessions bound to torch tensors' memory.

On the CPU they use IOBinding on ``data_ptr()``, with no copies. :class:`OrtGraph` is one session.
:class:`CheckedExport` is an export folder whose manifest was checked; it makes the sessions.

A model's engine in :mod:`framegraph.models.runtime` holds its stream state as torch tensors. They are bound to
its sessions in two sets that swap roles each step. The step reads one set and writes the other. So the state
never goes through numpy and stays bound between calls.

:class:`OrtVAEStream` is shared by every streamed decoder. Those are the avatar's
:class:`~framegraph.models.vae.VideoVAE` and the generate pipeline's causal ``AutoencoderKLWan``. The other
engines live with their models.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from .manifest import ExportError


def default_threads() -> int:
    """Intra-op threads for each of a graph's heavy sessions: half the cores, at least 1.

    The stages run side by side on successive frames. Two full-width pools would fight for the same cores."""
    return max(1, (os.cpu_count() or 2) // 2)


def session_options(threads: int):
    """Latency settings for one session.

    ``threads`` is the intra-op thread count. It is what this stage may use while the graph's other stages run
    beside it. There is one inter-op thread and sequential execution. Every graph optimisation is on.
    Spin-waiting is off: a spinning pool would take the cores the other stages need."""
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
    """One ``InferenceSession`` of an exported file on the CPU execution provider, with IOBinding helpers."""

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
        """Bind ``t``'s memory to input or output ``name``.

        ``t`` is float32, contiguous, on the CPU. Inputs that the graph dropped as unused are skipped."""
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
    """Streamed decoding on ORT.

    The first chunk of a stream runs ``vae_first``, with the reference in when the decoder has one. The next
    chunks run ``vae_next`` with the temporal cache and the reference features. The cache is two bound sets,
    swapped each chunk. The reference features are bound once.

    ``entry`` is the manifest's ``files``: ``vae_first``, ``vae_next`` and ``vae_cache``. ``vae_cache`` holds
    the ``temporal`` and ``reference`` cache keys. The avatar's VAE uses this class. So does the generate
    pipeline's causal Wan VAE (:mod:`.wan_vae`). Its first chunk decodes to fewer frames than the next ones.
    So each graph writes its own frames buffer."""

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
        """Latent chunk ``z [1, C, T, h, w]`` → frames ``[1, 3, T', H, W]`` in [-1, 1].

        The frames are a buffer that the next call reuses."""
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
    """An export directory whose manifest was checked by :mod:`.manifest`; it makes the sessions of its files."""

    def __init__(self, export_dir: str, manifest: dict):
        self.dir, self.manifest = export_dir, manifest

    def graph(self, key: str, threads: int = 1) -> OrtGraph:
        return OrtGraph(os.path.join(self.dir, self.manifest["files"][key]["file"]), threads)


__all__ = ["OrtGraph", "OrtVAEStream", "CheckedExport", "session_options", "default_threads"]
