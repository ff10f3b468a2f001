"""Stage: the unit of work in a graph.

A stage declares its ports and computes. Scheduling, threads, queues, pacing and timing belong to the
graph. Subclasses set ``inputs`` and ``outputs`` in ``__init__``. Each maps a port name to a
:class:`PortSpec`. Subclasses implement :meth:`Stage.process`::

    class Invert(Stage):
        def __init__(self, shape):
            super().__init__("invert")
            self.inputs = {"video": PortSpec(shape, torch.uint8)}
            self.outputs = {"video": PortSpec(shape, torch.uint8)}

        def process(self, inputs, out):
            frame = out.write("video")          # a preallocated slot; metadata copied from the input
            torch.sub(255, inputs["video"].data, out=frame.data)

A stage with no inputs is a **source**. The graph calls ``process`` repeatedly. In realtime mode it paces
it by the pts it sets. It stamps ``seq`` and ``capture_ns``. It applies the flow limiter. A source ends the
stream by raising :class:`EndOfStream`. A stage with no outputs is a **sink**.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .frame import Frame, PortSpec

if TYPE_CHECKING:  # pragma: no cover
    from .clock import Clock
    from .telemetry import Telemetry

TRIGGERS = ("all", "any")


class EndOfStream(Exception):
    """Raised by a source's ``process`` when it has nothing more to produce."""


@dataclass
class StageContext:
    """What the graph hands a stage at ``setup``.

    Attributes:
        clock: the session clock. It converts ticks and gives the pts of the stage's outputs.
        device: the stage's device, from its ports, or ``cpu``.
        stream: the stage's own CUDA stream, None on CPU. Work inside ``process`` runs on it.
        telemetry: the graph's telemetry. Sinks report A/V offset through it.
        index: the stage's index in the graph.
        cancelled: ``cancelled()`` is True when the graph was cancelled or a stage failed. It is False on a
            normal end or drain. A file sink's ``teardown`` uses it. It then keeps what it wrote under a
            name that says it is partial.
        input_waited: ``input_waited(ns)`` is for a source with ``waits_outside``. It reports the ns its
            ``process`` just waited for input from outside the graph. They count as its ``input_wait``, not
            its work.
        waiting: ``waiting(port)`` counts frames queued on input ``port`` behind the ones ``process`` was
            just given. A live stage skips to the newest with :meth:`Stage.stale`.
    """

    clock: Clock
    device: Any
    stream: Any = None
    telemetry: Telemetry | None = None
    index: int = 0
    cancelled: Callable[[], bool] = lambda: False
    input_waited: Callable[[int], None] = lambda ns: None
    waiting: Callable[[str], int] = lambda port: 0


class Stage:
    """Base class of every stage.

    Class or instance attributes a subclass sets:
        inputs / outputs: ``dict[str, PortSpec]``.
        budget_ms: per-frame budget of ``process`` in ms. None means no budget. Overruns count as
            deadline misses. With ``fallbacks``, they make the graph step down to a cheaper level.
        fallbacks: names of cheaper levels, best first, such as ``("2 steps", "1 step")``. The graph
            calls :meth:`set_fallback` with 1..len(fallbacks), or 0 for full quality.
        device: where the stage computes, when its ports don't say. An example is a renderer that reads
            CPU poses and writes CPU frames but renders on ``"cuda"``. None: derived from the ports.
        trigger: with ``"all"``, ``process`` runs when every input has a frame. That is a lock-step join.
            With ``"any"``, it runs whenever at least one has. A muxer takes audio and video at their own
            rates this way. An input on a ``latest`` edge never gates ``process`` once it holds a value.
            A camera pose is one. It is re-read until a newer one arrives.
        waits_outside: set on a source whose ``process`` waits for input pushed from outside the graph.
            A client's audio or camera is such input. The source reports that wait through
            ``ctx.input_waited``. Its telemetry then has an ``input_wait`` like a consumer's.
            The class :class:`~.push.Pushed` sets it.
        torch_threads: torch's intra-op threads in the stage's worker thread. They are set there before
            ``setup``. OpenMP keeps the count per thread. None leaves it as torch gives a new thread. That
            is the last count set in any thread.
    """

    inputs: dict[str, PortSpec] = {}
    outputs: dict[str, PortSpec] = {}
    budget_ms: float | None = None
    fallbacks: tuple[str, ...] = ()
    trigger: str = "all"
    device: str | None = None
    waits_outside: bool = False
    torch_threads: int | None = None

    def __init__(self, name: str | None = None):
        self.name = name or type(self).__name__.lower()
        self.inputs = dict(type(self).inputs)
        self.outputs = dict(type(self).outputs)
        self.fallback_level = 0
        self.ctx: StageContext | None = None

    # ---- life cycle (override) ----------------------------------------------------------------
    def setup(self, ctx: StageContext) -> None:
        """Called once in the stage's worker thread before the first frame. Load weights and warm up here."""
        self.ctx = ctx

    def process(self, inputs: dict[str, Frame], out: Outputs) -> None:
        """Compute one step.

        ``inputs`` maps port → frame. When ``trigger == "any"`` it holds only the ports that have one. Write
        results into slots from ``out.write(port)``.
        """
        raise NotImplementedError

    def flush(self, out: Outputs) -> None:
        """End of stream reached every input: emit what is still held back.

        Examples are frames waiting for look-ahead and an encoder's delayed packets. Not called on cancel.
        The default does nothing.
        """

    def teardown(self) -> None:
        """Called once in the worker thread after the last frame, also after errors and cancel."""

    def reset(self) -> None:
        """Forget stream state on barge-in. Stateful stages override it. It is called between frames."""

    def stale(self, frame: Frame, port: str, max_lag_ms: float | None) -> bool:
        """Should the input ``frame`` on ``port`` be skipped rather than computed?

        This applies to live streams only: a realtime clock with ``max_lag_ms`` set. It is True when a newer
        frame already waits on ``port``. It is also True when the frame's data arrived more than
        ``max_lag_ms`` ago, by ``capture_ns``. A stage that skips these computes from the freshest input it
        has. A machine slower than the stream then shows fewer frames. It never shows a growing delay, or a
        frame from input older than it must be. Always False offline, on any other clock.
        """
        ctx = self.ctx
        if max_lag_ms is None or ctx is None or getattr(ctx.clock, "mode", None) != "realtime":
            return False
        if ctx.waiting(port) > 0:
            return True
        return bool(frame.capture_ns) and (time.monotonic_ns() - frame.capture_ns) > max_lag_ms * 1e6

    def set_fallback(self, level: int) -> None:
        """Switch to cheaper level ``level``; 0 is full quality. Override when ``fallbacks`` is set."""
        self.fallback_level = level

    def interrupt(self) -> None:
        """The graph is stopping: return from a ``process`` that waits on outside input soon."""

    # ---- helpers ------------------------------------------------------------------------------
    @property
    def is_source(self) -> bool:
        return not self.inputs

    @property
    def is_sink(self) -> bool:
        return not self.outputs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class IndexedSource(Stage):
    """A source that counts its frames.

    ``index`` counts from 0, and from 0 again when the graph is set up again. Frame ``index`` gets the
    ``pts`` of frame ``index`` at ``fps``. The stream ends after ``n_frames``. None means no end. A subclass
    gives :meth:`emit`, which writes frame ``index`` into ``out``.
    """

    def __init__(self, name: str, *, fps: float, n_frames: int | None = None):
        super().__init__(name)
        self.fps, self.n_frames = fps, n_frames
        self.index = 0

    def setup(self, ctx: StageContext) -> None:
        super().setup(ctx)
        self.index = 0

    def emit(self, out: Outputs) -> Frame:
        """Write frame :attr:`index` into ``out`` with ``out.write(port)`` and return it.

        Raise :class:`EndOfStream` when there is none.
        """
        raise NotImplementedError

    def process(self, inputs: dict[str, Frame], out: Outputs) -> None:
        if self.n_frames is not None and self.index >= self.n_frames:
            raise EndOfStream
        frame = self.emit(out)
        frame.pts = self.ctx.clock.ticks_from_frame(self.index, self.fps)
        self.index += 1


class SlotProvider(Protocol):
    """What :class:`Outputs` needs from the runtime for one stage. ``stream.node.Node`` provides it."""

    stage: Stage

    def connected(self, port: str) -> bool:
        """True when some consumer reads ``port``."""

    def acquire(self, port: str) -> Frame:
        """A writable slot for ``port``. It may block under a ``block`` edge."""

    def unacquire(self, port: str, frame: Frame) -> None:
        """Give back a slot that will not be published."""

    def publish(self, port: str, frame: Frame) -> None:
        """Hand a written slot on to the consumers of ``port``."""

    def count_discarded(self, port: str) -> None:
        """A frame was written to ``port``, which nobody reads."""


class Outputs:
    """Hands a stage writable output slots during one ``process`` call.

    ``write(port)`` acquires a slot. It may block under a ``block`` edge: that is backpressure. The slot
    has the lineage metadata of the newest input already copied in. It is published when ``process``
    returns. It is also published when ``write`` is called again for the same port. So one call can give
    several outputs.

    A port nobody reads in this graph still hands out a slot. So a stage need not know how it is wired.
    That frame is released at once. It is counted as ``discarded`` in the stage's report. It never holds
    its source's flow-limiter credit. ``written`` counts every slot handed out in this call. ``emitted``
    counts only those that travel on to a consumer.

    A stage only calls ``write``. ``begin``, ``finish``, ``abandon`` and ``newest_pts`` are the runtime's
    side. ``begin`` opens one ``process`` call. ``finish`` closes it, or ``abandon`` when it raised.
    """

    def __init__(self, slots: SlotProvider):
        self._slots = slots
        self._pending: dict[str, Frame] = {}
        self._template: Frame | None = None
        self.written = 0
        self.emitted = 0

    def write(self, port: str | None = None) -> Frame:
        slots = self._slots
        outputs = slots.stage.outputs
        if port is None:
            if len(outputs) != 1:
                raise ValueError(f"stage {slots.stage.name!r} has outputs {list(outputs)}: "
                                 f"name the port in out.write(port)")
            port = next(iter(outputs))
        if port not in outputs:
            raise KeyError(f"stage {slots.stage.name!r} has no output port {port!r}; it has {list(outputs)}")
        if port in self._pending:
            slots.publish(port, self._pending.pop(port))
        frame = slots.acquire(port)
        if self._template is not None:
            frame.copy_meta_from(self._template)
        self._pending[port] = frame
        self.written += 1
        if slots.connected(port):
            self.emitted += 1
        else:
            slots.count_discarded(port)
        return frame

    # ---- the runtime's side ---------------------------------------------------------------------
    def begin(self, template: Frame | None) -> None:
        """A ``process`` call starts. Its outputs carry ``template``'s lineage. It is None at a source."""
        self._template = template
        self.written = self.emitted = 0

    def newest_pts(self) -> int:
        """The largest pts among the slots written in this call. There is at least one."""
        return max(f.pts for f in self._pending.values())

    def finish(self) -> None:
        """Publish every slot still held."""
        for port, frame in self._pending.items():
            self._slots.publish(port, frame)
        self._pending.clear()

    def abandon(self) -> None:
        """Give back every slot still held, unpublished."""
        for port, frame in self._pending.items():
            self._slots.unacquire(port, frame)
        self._pending.clear()
