"""Node: one stage at run time.

A node holds the stage's rings, worker thread, CUDA stream, telemetry and fallback governor.

The :class:`~.graph.Graph` builds one node per stage when it starts. The graph owns the life cycle: start,
drain, cancel and join. The node runs the stage in its own thread. Their contract, both ways:

- The node asks the graph for the run's state. That is ``clock``, ``telemetry``, ``aborted``, ``stopping``
  and ``wait_go()``. It calls ``fail(node, exc)`` when a stage raised. It calls ``frame_done(frame)`` when a
  frame's lineage ended. Its source's flow-limiter credit then comes back.
- :class:`~.stage.Outputs` asks the node for slots through :class:`~.stage.SlotProvider`. That is
  ``connected``, ``acquire``, ``unacquire``, ``publish`` and ``count_discarded``. The node drives the outputs
  through their runtime side: ``begin``, ``finish``, ``abandon`` and ``newest_pts``.

Timing, per frame, as in :class:`~.telemetry.StageStats`:

- ``input_wait`` is the time in :meth:`Node._wait_inputs`.
- Every blocking ``acquire_write`` on an output ring adds to ``out_wait_ns``. So does a fast-mode source's wait
  for a flow-limiter credit.
- A source fed from outside the graph reports its wait for that input through ``ctx.input_waited``. It goes
  into ``in_wait_ns``.
- ``work`` is the ``process`` call less the waits inside it.

Each wait costs two ``monotonic_ns`` reads and no allocation.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

import torch

from .clock import FlowLimiter
from .frame import Flag, Frame
from .ring import Ring, RingAborted
from .stage import EndOfStream, Outputs, Stage, StageContext

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Graph
    from .workers import Run

# Step down a fallback level when a stage's smoothed work time exceeds its budget; step back up
# after this many frames comfortably (below half the budget) inside it.
_EMA = 0.2
_RECOVER_FRAMES = 30


class Node:
    """Runtime state of one stage: its rings, thread, CUDA stream, telemetry and fallback governor."""

    def __init__(self, graph: Graph, stage: Stage, index: int, max_in_flight: int | None):
        self.graph, self.stage, self.index = graph, stage, index
        self.max_in_flight = max_in_flight
        self.in_rings: dict[str, Ring] = {}
        self.out_rings: dict[str, list[Ring]] = {}
        self.scratch: dict[str, Frame] = {}
        self.limiter: FlowLimiter | None = None
        self.doorbell = threading.Condition()
        self.thread: Run | None = None  # its run on a worker thread (stream/workers.py)
        self.stream = None
        self.stats = None
        self.seq = 0
        self.enter_ns = 0
        self.out_wait_ns = 0  # ns blocked on output during the current frame
        self.in_wait_ns = 0  # ns a ``waits_outside`` source's process waited for outside input, this frame
        self.reset_requested = False
        self.setup_done = threading.Event()
        self.ema_ms = 0.0
        self.calm_frames = 0
        self.outputs = Outputs(self)
        self.source_drops = 0
        self.discontinuity = False
        self.terminal = False  # a sink, or every output unconnected: lineages end here

    # ---- device -------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The stage's device: its CUDA device if any port is on one, else the CPU.

        An upload or download stage then still orders its work after its producers' with events.
        """
        if self.stage.device is not None:
            return torch.device(self.stage.device)
        devices = [torch.device(s.device) for s in (*self.stage.outputs.values(), *self.stage.inputs.values())]
        return next((d for d in devices if d.type == "cuda"), torch.device("cpu"))

    def stream_context(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    # ---- producer side, used by Outputs -------------------------------------------------------
    def connected(self, port: str) -> bool:
        """True when some consumer reads ``port`` in this graph."""
        return bool(self.out_rings.get(port))

    def count_discarded(self, port: str) -> None:
        """A frame was written to ``port``, which nobody reads. It is released at once and only counted."""
        self.stats.discarded += 1

    def acquire(self, port: str) -> Frame:
        rings = self.out_rings.get(port)
        if not rings:
            frame = self.scratch[port]
            frame.reset_meta()
            return frame
        frame = self._acquire_write(rings[0])
        if self.stream is not None and frame.done_event is not None:
            self.stream.wait_event(frame.done_event)  # the last reader of this slot has finished
        return frame

    def unacquire(self, port: str, frame: Frame) -> None:
        rings = self.out_rings.get(port)
        if rings:
            rings[0].cancel_write(frame)

    def publish(self, port: str, frame: Frame) -> None:
        now = time.monotonic_ns()
        if self.stage.is_source:
            frame.seq, frame.origin = self.seq, self.index
            frame.capture_ns = frame.capture_ns or now
            if self.discontinuity:
                frame.flags |= Flag.DISCONTINUITY
        frame.stage_ns[self.index, 0] = self.enter_ns
        frame.stage_ns[self.index, 1] = now
        rings = self.out_rings.get(port)
        if not rings:
            return
        if self.stream is not None and frame.ready_event is not None:
            frame.ready_event.record(self.stream)
        for ring in rings[1:]:  # fan-out: each further consumer gets its own copy
            copy = self._acquire_write(ring)
            if self.stream is not None and copy.done_event is not None:
                self.stream.wait_event(copy.done_event)
            copy.data.copy_(frame.data, non_blocking=True)
            copy.copy_meta_from(frame)
            copy.flags, copy.length = frame.flags, frame.length
            if self.stream is not None and copy.ready_event is not None:
                copy.ready_event.record(self.stream)
            ring.publish(copy)
        rings[0].publish(frame)

    def _acquire_write(self, ring: Ring) -> Frame:
        """``ring.acquire_write()``. Its time blocked on a full ring is added to ``out_wait_ns``."""
        t0 = time.monotonic_ns()
        frame = ring.acquire_write()
        self.out_wait_ns += time.monotonic_ns() - t0
        return frame

    def _input_waited(self, ns: int) -> None:
        self.in_wait_ns += ns

    def _waiting(self, port: str) -> int:
        """Frames ready on input ``port`` and not yet given to the stage."""
        ring = self.in_rings.get(port)
        return ring.depth if ring is not None else 0

    def close_outputs(self) -> None:
        for rings in self.out_rings.values():
            for ring in rings:
                ring.close()

    # ---- fallback governor --------------------------------------------------------------------
    def govern(self, ms: float) -> None:
        """Step the fallback level from this frame's ``work`` in ms. Waits on neighbours are left out."""
        stage, budget = self.stage, self.stage.budget_ms
        if budget is None or not stage.fallbacks:
            return
        self.ema_ms = ms if self.ema_ms == 0 else (1 - _EMA) * self.ema_ms + _EMA * ms
        level = stage.fallback_level
        if self.ema_ms > budget and level < len(stage.fallbacks):
            self._switch(level + 1)
        elif level > 0 and self.ema_ms < 0.5 * budget:
            self.calm_frames += 1
            if self.calm_frames >= _RECOVER_FRAMES:
                self._switch(level - 1)
        else:
            self.calm_frames = 0

    def _switch(self, level: int) -> None:
        self.stage.set_fallback(level)
        self.stage.fallback_level = level
        self.stats.fallback_level = level
        self.stats.fallback_changes += 1
        self.ema_ms = 0.0
        self.calm_frames = 0

    # ---- worker -------------------------------------------------------------------------------
    def run(self) -> None:
        """The worker thread: setup, then the source or consumer loop, then teardown."""
        graph = self.graph
        stage = self.stage
        try:
            try:
                ctx = StageContext(graph.clock, self.device, self.stream, graph.telemetry, self.index,
                                   cancelled=lambda: graph.aborted, input_waited=self._input_waited,
                                   waiting=self._waiting)
                if stage.torch_threads and "OpenMP" in torch.__config__.parallel_info():
                    torch.set_num_threads(stage.torch_threads)  # OpenMP: this worker thread only
                with self.stream_context():
                    stage.setup(ctx)
                    if stage.ctx is None:
                        stage.ctx = ctx
            except BaseException as exc:  # noqa: BLE001 - recorded before start() hears setup ended
                graph.fail(self, exc)
                return
            finally:
                self.setup_done.set()
            graph.wait_go()
            if not graph.aborted:
                with self.stream_context():
                    if stage.is_source:
                        self._source_loop()
                    else:
                        self._consumer_loop()
        except RingAborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - any stage error stops the graph, named
            graph.fail(self, exc)
        finally:
            if not graph.aborted:
                self.close_outputs()
            try:
                if self.stream is not None:
                    self.stream.synchronize()  # this stage's work only, never the whole device
                stage.teardown()
            except BaseException as exc:  # noqa: BLE001
                graph.fail(self, exc)

    def _source_loop(self) -> None:
        graph = self.graph
        stage, out, limiter, clock = self.stage, self.outputs, self.limiter, graph.clock
        while not graph.stopping:
            credit_wait_ns = 0
            if limiter is not None and clock.mode == "fast":
                t0 = time.monotonic_ns()
                if not limiter.wait_for_room():
                    break
                credit_wait_ns = time.monotonic_ns() - t0
            if self.reset_requested:
                self.reset_requested = False
                stage.reset()
            self.out_wait_ns = self.in_wait_ns = 0
            self.enter_ns = time.monotonic_ns()
            out.begin(None)
            try:
                stage.process({}, out)
            except EndOfStream:
                out.abandon()
                break
            except BaseException:
                out.abandon()
                raise
            proc_exit_ns = time.monotonic_ns()
            work_ns = proc_exit_ns - self.enter_ns - self.out_wait_ns - self.in_wait_ns
            if out.written == 0:
                continue
            pts = out.newest_pts()
            if clock.mode == "realtime" and not clock.wait_until(pts):
                out.abandon()
                break
            held = limiter is not None and out.emitted > 0  # this frame takes a flow-limiter credit
            if held and clock.mode == "realtime" and not limiter.has_room():
                out.abandon()  # overload: drop at the source rather than queue
                self.source_drops += 1
                self.discontinuity = True
                continue
            out.finish()
            if out.emitted:
                self.discontinuity = False
                self.seq += 1
            if held:
                limiter.emitted_one()
            self.stats.record(self.enter_ns, proc_exit_ns, work_ns, self.out_wait_ns + credit_wait_ns,
                              self.in_wait_ns)
            self.govern(work_ns / 1e6)

    def _wait_inputs(self) -> dict[str, Frame] | None:
        graph = self.graph
        rings = self.in_rings
        gating = {p: r for p, r in rings.items() if r.policy != "latest"}
        with self.doorbell:
            while True:
                if graph.aborted:
                    return None
                if self.stage.trigger == "all":
                    if any(r.finished for r in gating.values()):
                        return None
                    if all(r.has_frame() for r in rings.values()):
                        return {p: r.take() for p, r in rings.items()}
                else:
                    ready = [p for p, r in gating.items() if r.has_frame()]
                    if ready:
                        frames = {p: gating[p].take() for p in ready}
                        frames.update({p: r.take() for p, r in rings.items()
                                       if r.policy == "latest" and r.has_frame()})
                        return frames
                    if all(r.finished for r in gating.values()):
                        return None
                self.doorbell.wait()

    def _consumer_loop(self) -> None:
        graph = self.graph
        stage, out, stream = self.stage, self.outputs, self.stream
        gating = [p for p in stage.inputs if self.in_rings[p].policy != "latest"]
        primary = gating[0]  # its frames count for end-to-end latency and FPS at a sink
        last: Frame | None = None
        while True:
            t0 = time.monotonic_ns()
            inputs = self._wait_inputs()
            input_wait_ns = time.monotonic_ns() - t0
            if inputs is None:
                if not graph.aborted:
                    self._flush(last)
                return
            if self.reset_requested:
                self.reset_requested = False
                stage.reset()
            self.out_wait_ns = 0
            self.enter_ns = time.monotonic_ns()
            for frame in inputs.values():
                if frame.ready_event is not None:
                    if stream is not None and frame.data.is_cuda:
                        stream.wait_event(frame.ready_event)
                    else:  # host memory a CUDA stage copied into (a download): wait for that copy only
                        frame.ready_event.synchronize()
            last = next(inputs[p] for p in gating if p in inputs)
            out.begin(last)
            try:
                stage.process(inputs, out)
            except BaseException:
                out.abandon()
                raise
            exit_ns = time.monotonic_ns()
            work_ns = exit_ns - self.enter_ns - self.out_wait_ns
            out.finish()  # fan-out copies may wait on their rings: output_wait, not work
            # The outputs carry the lineage of ``last`` (its source and seq) on to the sinks; every
            # other input's lineage ends here, so its source's flow-limiter credit is returned now.
            carried = last.origin if out.emitted and not self.terminal else None
            for port, frame in inputs.items():
                if stream is not None and frame.done_event is not None:
                    frame.done_event.record(stream)
                if frame.origin != carried:
                    graph.frame_done(frame)
                if self.terminal and port == primary:
                    graph.telemetry.sink_frame(frame.capture_ns, exit_ns)
                self.in_rings[port].release(frame)  # under "latest": kept, re-read until a newer one
            self.stats.record(self.enter_ns, exit_ns, work_ns, self.out_wait_ns, input_wait_ns)
            self.govern(work_ns / 1e6)

    def _flush(self, last: Frame | None) -> None:
        """End of stream: let the stage emit what it still holds, with the metadata of its last input."""
        out = self.outputs
        self.enter_ns = time.monotonic_ns()
        out.begin(last)
        try:
            self.stage.flush(out)
        except BaseException:
            out.abandon()
            raise
        out.finish()
