"""Graph: stages joined by rings, validated before start, one worker thread per stage.

    g = Graph(Clock("fast"))
    card = g.add(TestCardVideo(...))
    sink = g.add(MP4Sink(...))
    g.connect(card, sink, "video")            # policy="block", capacity=2 by default
    report = g.run()                           # start() + join(); raises StageError if a stage failed

Life cycle:

- ``start()`` validates and allocates every ring once. It runs each stage's ``setup`` in its own thread. It
  waits for all of them.
- ``drain()`` asks sources to end. End-of-stream flows through, so every stage finalizes. A file sink closes a
  playable file.
- ``cancel()`` stops everything at once.
- ``join()`` waits for the workers. It raises :class:`StageError` naming the stage whose exception stopped the
  graph.

No stage runs after ``join``. The worker threads park for the next graph's stages of the same kind. So a
session starts on threads whose per-thread state is warm. See :mod:`.workers`.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from .clock import Clock, FlowLimiter
from .frame import Frame
from .memory import freeze_loaded_objects, keep_freed_memory
from .node import Node
from .ring import POLICIES, Policy, Ring
from .stage import TRIGGERS, Stage
from .telemetry import Telemetry
from .workers import start_worker


class GraphError(ValueError):
    """The graph is malformed. Validation finds it before anything starts."""


class StageError(RuntimeError):
    """A stage raised and the graph stopped. ``stage`` names it. The original is ``__cause__``."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"stage {stage!r} failed: {type(cause).__name__}: {cause}")
        self.stage = stage
        self.__cause__ = cause


@dataclass
class Edge:
    src: Stage
    src_port: str
    dst: Stage
    dst_port: str
    policy: Policy = "block"
    capacity: int = 2

    @property
    def name(self) -> str:
        return f"{self.src.name}.{self.src_port} -> {self.dst.name}.{self.dst_port}"


class Graph:
    """A pipeline of stages joined by rings.

    Args:
        clock: the session clock. The default is fast mode, for offline work.
        name: used in reports and errors.
        telemetry_window: latency samples kept per stage for percentiles.
    """

    def __init__(self, clock: Clock | None = None, name: str = "graph", telemetry_window: int = 4096):
        self.clock = clock or Clock("fast")
        self.name = name
        self.telemetry_window = telemetry_window
        self.stages: list[Stage] = []
        self.edges: list[Edge] = []
        self._max_in_flight: dict[str, int | None] = {}
        self._nodes: list[Node] = []
        self.telemetry: Telemetry | None = None
        self._go = threading.Event()
        self._stopping = False
        self._aborted = False
        self._error: StageError | None = None
        self._error_lock = threading.Lock()
        self._started = False

    # ---- building -----------------------------------------------------------------------------
    def add(self, stage: Stage, *, max_in_flight: int | None = None) -> Stage:
        """Add a stage.

        ``max_in_flight`` applies to sources only. It bounds the frames of this source between it and the
        sinks. In realtime mode extra frames are dropped at the source and counted. In fast mode the source
        waits.
        """
        if not isinstance(stage, Stage):
            raise GraphError(f"graph {self.name!r}: add() takes a Stage, got {type(stage).__name__}")
        if any(s.name == stage.name for s in self.stages):
            raise GraphError(f"graph {self.name!r}: a stage named {stage.name!r} is already in the graph")
        if max_in_flight is not None and not stage.is_source:
            raise GraphError(f"stage {stage.name!r}: max_in_flight applies to sources only")
        self.stages.append(stage)
        self._max_in_flight[stage.name] = max_in_flight
        return stage

    def connect(self, src: Stage, dst: Stage, src_port: str | None = None, dst_port: str | None = None,
                *, policy: Policy = "block", capacity: int = 2) -> Edge:
        """Join ``src.src_port`` to ``dst.dst_port`` with a ring of ``capacity`` slots and ``policy``.

        A port name may be omitted when the stage has exactly one. ``dst_port`` defaults to ``src_port``'s
        name when ``dst`` has a port of that name.
        """
        for s in (src, dst):
            if s not in self.stages:
                raise GraphError(f"graph {self.name!r}: stage {s.name!r} was not added before connect()")
        src_port = self._pick_port(src, src.outputs, src_port, "output")
        if dst_port is None and src_port in dst.inputs:
            dst_port = src_port
        dst_port = self._pick_port(dst, dst.inputs, dst_port, "input")
        if policy not in POLICIES:
            raise GraphError(f"edge {src.name}.{src_port} -> {dst.name}.{dst_port}: unknown policy "
                             f"{policy!r}; expected one of {POLICIES}")
        edge = Edge(src, src_port, dst, dst_port, policy, capacity)
        self.edges.append(edge)
        return edge

    @staticmethod
    def _pick_port(stage: Stage, ports: dict, port: str | None, kind: str) -> str:
        if port is None:
            if len(ports) != 1:
                raise GraphError(f"stage {stage.name!r} has {kind} ports {list(ports)}: name one")
            return next(iter(ports))
        if port not in ports:
            raise GraphError(f"stage {stage.name!r} has no {kind} port {port!r}; it has {list(ports)}")
        return port

    # ---- validation ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Check the graph before anything is allocated. Raises :class:`GraphError` naming the stages."""
        if not self.stages:
            raise GraphError(f"graph {self.name!r} has no stages")
        if not any(s.is_source for s in self.stages):
            raise GraphError(f"graph {self.name!r} has no source (a stage without inputs)")
        for stage in self.stages:
            if stage.trigger not in TRIGGERS:
                raise GraphError(f"stage {stage.name!r}: trigger {stage.trigger!r} not in {TRIGGERS}")
        incoming: dict[tuple[str, str], Edge] = {}
        for e in self.edges:
            key = (e.dst.name, e.dst_port)
            if key in incoming:
                raise GraphError(f"input {e.dst.name}.{e.dst_port} is fed twice: by {incoming[key].src.name}"
                                 f".{incoming[key].src_port} and by {e.src.name}.{e.src_port}")
            incoming[key] = e
            a, b = e.src.outputs[e.src_port], e.dst.inputs[e.dst_port]
            for what, x, y in (("shape", a.shape, b.shape), ("dtype", a.dtype, b.dtype),
                               ("device", a.device, b.device), ("variable length", a.variable, b.variable)):
                if x != y:
                    raise GraphError(
                        f"edge {e.name}: {what} mismatch: {e.src.name!r} produces {a.describe()} but "
                        f"{e.dst.name!r} expects {b.describe()}")
            if e.src is e.dst:
                raise GraphError(f"edge {e.name}: stage {e.src.name!r} is connected to itself")
        for stage in self.stages:
            missing = [p for p in stage.inputs if (stage.name, p) not in incoming]
            if missing:
                raise GraphError(f"stage {stage.name!r}: input port(s) {missing} not connected")
            ins = [incoming[(stage.name, p)] for p in stage.inputs]
            if ins and all(e.policy == "latest" for e in ins):
                raise GraphError(f"stage {stage.name!r}: every input is a 'latest' edge, so nothing would "
                                 f"pace it; drive it from a source or another stage")
        self._check_cycles()

    def _check_cycles(self) -> None:
        succ: dict[str, list[str]] = {s.name: [] for s in self.stages}
        for e in self.edges:
            succ[e.src.name].append(e.dst.name)
        state: dict[str, int] = {}  # 1 = on the DFS path, 2 = finished
        path: list[str] = []

        def visit(n: str):
            state[n] = 1
            path.append(n)
            for m in succ[n]:
                if state.get(m) == 1:
                    cyc = path[path.index(m):] + [m]
                    raise GraphError(f"graph {self.name!r} has a cycle: {' -> '.join(cyc)} "
                                     f"(edge {n} -> {m} closes it)")
                if m not in state:
                    visit(m)
            path.pop()
            state[n] = 2

        for s in self.stages:
            if s.name not in state:
                visit(s.name)

    # ---- running ------------------------------------------------------------------------------
    def start(self) -> None:
        """Validate, allocate the rings and run every stage's ``setup``, then let the sources go.

        Each setup runs on its worker thread. On a CPU the setups run while the rings are allocated. Raises
        :class:`GraphError`, or :class:`StageError` for a failed setup.
        """
        if self._started and any(n.thread and n.thread.is_alive() for n in self._nodes):
            raise GraphError(f"graph {self.name!r} is already running")
        self.validate()
        keep_freed_memory()  # per-frame tensors reuse their pages (stream/memory.py)
        self._stopping = self._aborted = False
        self._error = None
        self._go.clear()
        n = len(self.stages)
        self.telemetry = Telemetry([s.name for s in self.stages], [s.budget_ms for s in self.stages],
                                   self.telemetry_window,
                                   [(bool(s.inputs) or s.waits_outside, bool(s.outputs)) for s in self.stages])
        self._nodes = [Node(self, s, i, self._max_in_flight[s.name]) for i, s in enumerate(self.stages)]
        for node in self._nodes:
            node.stats = self.telemetry.stages[node.index]
            node.stage.fallback_level = 0
            if node.max_in_flight is not None:
                node.limiter = FlowLimiter(node.max_in_flight)
            if node.device.type == "cuda":
                node.stream = torch.cuda.Stream(device=node.device)
        # On a CPU the setups run (each in its worker) while the rings are allocated here. On a GPU the rings come
        # first: a setup may capture a CUDA graph, and no other thread may allocate device memory meanwhile.
        on_gpu = any(node.stream is not None for node in self._nodes)
        if not on_gpu:
            self._start_workers()
        by_name = {node.stage.name: node for node in self._nodes}
        for e in self.edges:
            src, dst = by_name[e.src.name], by_name[e.dst.name]
            ring = Ring(e.src.outputs[e.src_port], e.capacity, e.policy, n, e.name)
            ring.attach_consumer(dst.doorbell)
            ring.on_drop = self.frame_done
            src.out_rings.setdefault(e.src_port, []).append(ring)
            dst.in_rings[e.dst_port] = ring
            if src.stream is not None and not ring.slots[0].data.is_cuda:  # a download: the host reads GPU output
                for slot in ring.slots + ([ring._spare] if ring._spare is not None else []):
                    slot.make_download()
            if dst.stream is not None:  # slots are read on the consumer's stream too
                for slot in ring.slots:
                    if slot.data.is_cuda:
                        slot.data.record_stream(dst.stream)
        for node in self._nodes:
            for port, spec in node.stage.outputs.items():
                if port not in node.out_rings:
                    node.scratch[port] = Frame(spec, n)
            node.terminal = not node.out_rings
        if on_gpu:
            self._start_workers()
        self._started = True
        for node in self._nodes:
            node.setup_done.wait()
        if self._error is not None:
            self.cancel()
            self.join()  # raises the setup error
        if self.clock.mode == "realtime":
            freeze_loaded_objects()  # the collector's full walks skip the loaded models (stream/memory.py)
        self.clock.start()  # pts 0 is now, after setup
        self.telemetry.started()
        self._go.set()

    def _start_workers(self) -> None:
        """Start each node's run on a worker thread from :mod:`.workers`.

        The run is its setup, then its loop once the graph goes.
        """
        for node in self._nodes:
            stage = node.stage
            node.thread = start_worker((type(stage), stage.name), stage.torch_threads, node.run,
                                       f"framegraph:{self.name}:{stage.name}", stage.name)

    def run(self, timeout: float | None = None) -> dict:
        """``start()`` then ``join()``. Returns the report."""
        self.start()
        return self.join(timeout)

    def drain(self) -> None:
        """Ask the sources to end. End-of-stream flows through and every stage finalizes.

        Returns at once. ``join()`` waits for the end.
        """
        self._stopping = True
        self.clock.stop()
        for node in self._nodes:
            if node.limiter is not None:
                node.limiter.cancel()
            if node.stage.is_source:
                node.stage.interrupt()

    def cancel(self) -> None:
        """Stop every stage now. Frames in flight are discarded. Returns at once."""
        self._aborted = self._stopping = True
        self.clock.stop()
        self._go.set()
        for node in self._nodes:
            if node.limiter is not None:
                node.limiter.cancel()
            # list(): a setup that fails calls this while start() may still be adding rings (start aborts
            # those when it hears of the failure)
            for ring in list(node.in_rings.values()):
                ring.abort()
            for rings in list(node.out_rings.values()):
                for ring in list(rings):
                    ring.abort()
            with node.doorbell:
                node.doorbell.notify_all()
            node.stage.interrupt()

    def join(self, timeout: float | None = None) -> dict:
        """Wait for every worker to finish. Returns the report, or raises :class:`StageError`.

        Waits in short steps so Ctrl-C reaches the caller. The caller typically calls ``drain()`` and joins
        again. With ``timeout`` in s, raises ``TimeoutError`` if workers are still running.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for node in self._nodes:
            while node.thread is not None and node.thread.is_alive():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"graph {self.name!r}: stage {node.stage.name!r} still running "
                                       f"after {timeout} s")
                node.thread.join(0.05)
        if self._error is not None:
            raise self._error
        return self.report()

    @property
    def running(self) -> bool:
        return any(n.thread is not None and n.thread.is_alive() for n in self._nodes)

    def reset(self) -> None:
        """Barge-in: every stage's ``reset()`` runs before its next frame, in its own thread."""
        for node in self._nodes:
            node.reset_requested = True

    # ---- reports ------------------------------------------------------------------------------
    def edge_report(self) -> list[dict]:
        return [{"name": r.name, "policy": r.policy, "capacity": r.capacity, "frames_in": r.frames_in,
                 "frames_out": r.frames_out, "drops": r.drops, "depth": r.depth}
                for node in self._nodes for rings in node.out_rings.values() for r in rings]

    def report(self) -> dict:
        """Telemetry of the current or last run as a JSON-ready dict."""
        if self.telemetry is None:
            return {"graph": self.name, "started": False}
        sources = {n.stage.name: {"frames": n.seq, "dropped_in_flight_limit": n.source_drops,
                                  "max_in_flight": n.max_in_flight,
                                  "in_flight": None if n.limiter is None else n.limiter.in_flight}
                   for n in self._nodes if n.stage.is_source}
        return self.telemetry.report(self.edge_report(), extra={
            "graph": self.name, "clock_mode": self.clock.mode, "sources": sources,
            "error": str(self._error) if self._error else None})

    # ---- what the nodes ask of the run (see stream/node.py) ------------------------------------------
    @property
    def aborted(self) -> bool:
        """``cancel()`` was called or a stage failed. Frames in flight are discarded."""
        return self._aborted

    @property
    def stopping(self) -> bool:
        """Sources must end: ``drain()`` or ``cancel()`` was called."""
        return self._stopping

    def wait_go(self) -> None:
        """Block until every stage is set up and the clock started, or the run was cancelled."""
        self._go.wait()

    def fail(self, node: Node, exc: BaseException) -> None:
        """A stage raised: remember the first failure and stop everything. ``join`` raises it."""
        with self._error_lock:
            if self._error is None:
                self._error = StageError(node.stage.name, exc)
        self.cancel()

    def frame_done(self, frame: Frame) -> None:
        """A frame left the graph: release its source's flow-limiter slot.

        It left at a sink, was consumed without output, or was dropped.
        """
        if 0 <= frame.origin < len(self._nodes):
            limiter = self._nodes[frame.origin].limiter
            if limiter is not None:
                limiter.done(frame.seq)
