"""A model service shared by many sessions' graphs.

Their requests to one model run together, as one batch.

Every session runs its own graph. Each of its model stages calls its model one frame at a time. N sessions
would cost N model calls per tick. Instead a stage is handed a :class:`BatchClient` as its engine. The client
submits the call's tensors to a :class:`Lane` of the process's :class:`ModelService`. There is one lane per
model, named by a key. A model is the same weights, runtime and shapes. The client waits for its own result::

    service = ModelService()
    client = service.client(("generator", bundle_hash, "onnx", 160), run=ort_batched, name="generator")
    client.open()                                  # a stage's setup
    picture = client(masked, mask, reference, shape, deadline_ns=due)   # each tensor [1, ...]: its share
    client.close()                                 # the stage's teardown; the lane's thread ends with the last

A request's deadline is the latest moment its computation may start. For a live stage that is its input's
arrival plus the lag it allows. It is the moment the stage would skip the frame itself.

Per tick the lane's thread takes the pending requests of the session served longest ago first, then by deadline,
the earliest first. Past the lane's capacity each session so gets a fair share; within it every request is served
anyway. A request without a deadline comes after those with one. The thread runs as many as one batch as finish no
later than the first would alone, started at its deadline. ``run`` is called with each input concatenated on
axis 0, ``[B, ...]``. It returns ``[B, ...]`` or a tuple of them. The thread copies each request's row into its
client's own buffer.

A request whose deadline has passed is dropped with ``on_miss="drop"``. The client then raises :class:`Missed`
and the stage skips the frame. With ``on_miss="run"`` it is run alone, late.

The lane measures its cost per batch size, at warm-up and on the way. Its :meth:`Lane.capacity` says how many
sessions it holds at a frame rate. A client that asks with a frame rate is refused with :class:`Full` when one
more session would not fit (:meth:`Lane.room`).

What one session does never holds up another:

- A cancelled request leaves the queue at once. The client raises :class:`Cancelled`, which the graph treats as
  its stop.
- A request whose batch raises is run again alone. So the error reaches only the session that caused it.
- The lane never waits on a session. Results go into the client's buffer. The client reads it when it likes.

No queue is unbounded. A client has one request in flight at a time.

On CUDA each session's stage runs on its own stream, and the lane on its own. A request carries an event recorded
on its caller's stream: the lane's stream waits for it before the batch. The row's copy into the client's buffer
records another: the caller's stream waits for that one before it reads the result. No session's stream waits for
the whole device.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable
from typing import Literal, get_args

import torch

from .ring import RingAborted

OnMiss = Literal["drop", "run"]  # a request past its deadline: dropped, so the frame is skipped, or run late
ON_MISS: tuple[str, ...] = get_args(OnMiss)
BUCKETS = (1, 2, 4, 8, 16)  # the batch sizes measured at warm-up, up to the lane's max_batch


def frame_deadline_ns(frame, max_lag_ms: float | None, clock_mode: str) -> int | None:
    """A live frame's deadline: its capture time plus the lag its stage allows, in monotonic ns.

    It is None off a realtime clock, without a lag, or for a frame with no capture time.
    """
    if max_lag_ms is None or clock_mode != "realtime" or not frame.capture_ns:
        return None
    return int(frame.capture_ns + max_lag_ms * 1e6)


class Missed(Exception):
    """The request's deadline passed before its computation could start, and its session's policy drops it."""


class Full(Exception):
    """A new session would not fit in the lane's measured capacity, by :meth:`Lane.room`.

    Refuse it and retry later.
    """


class Cancelled(RingAborted):
    """The session cancelled its request. The graph stops. To the node it is a :class:`~.ring.RingAborted`."""


class _Request:
    __slots__ = ("client", "inputs", "deadline_ns", "on_miss", "enqueued_ns", "ready")

    def __init__(self, client, inputs, deadline_ns, on_miss):
        self.client, self.inputs, self.deadline_ns, self.on_miss = client, inputs, deadline_ns, on_miss
        self.enqueued_ns = time.monotonic_ns()
        self.ready = _recorded(inputs[0].device) if inputs and inputs[0].is_cuda else None  # the inputs' writes

    def order(self) -> tuple:
        """The session served longest ago first, then the earliest deadline. Requests without one come after, in
        arrival order. Past the lane's capacity that is a fair share each: no session's frames are dropped more
        often than another's. Within it every request is served anyway."""
        return (self.deadline_ns is None, self.client.served_ns, self.deadline_ns or 0, self.enqueued_ns)


def _sync(tensors) -> None:
    """Wait for the device of CUDA ``tensors``. Nothing on a CPU."""
    if tensors and tensors[0].is_cuda:
        torch.cuda.synchronize(tensors[0].device)


def _recorded(device: torch.device) -> torch.cuda.Event:
    """An event recorded now on the calling thread's current stream of ``device``."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class LaneStats:
    """What a lane did.

    It counts batches by size and requests served, dropped for their deadline, run late and failed. It keeps
    the queue wait of the last 4096 served requests. The wait is the ns from submit to the start of the batch.
    """

    def __init__(self):
        self.batches: dict[int, int] = {}
        self.served = self.missed = self.late = self.failed = self.cancelled = 0
        self.waits_ns: list[int] = []

    def wait_ms(self, q: float) -> float | None:
        """The ``q`` quantile of the queue wait in ms, ``q`` in 0..1. None before any request was served."""
        if not self.waits_ns:
            return None
        w = sorted(self.waits_ns)
        return w[min(len(w) - 1, int(q * len(w)))] / 1e6

    def as_dict(self) -> dict:
        return {"batches": dict(sorted(self.batches.items())), "served": self.served, "missed": self.missed,
                "late": self.late, "failed": self.failed, "cancelled": self.cancelled,
                "queue_wait_ms_p50": self.wait_ms(0.5), "queue_wait_ms_p95": self.wait_ms(0.95)}


class Lane:
    """The pending requests of one model and the thread that runs them in batches.

    The module docstring says how batches are chosen.

    Args:
        run: the batched engine. ``run(*inputs)`` takes each input ``[B, ...]``. It returns ``[B, ...]`` or a
            tuple of them.
        name: for the thread's name and the metrics.
        max_batch: the most requests in one batch.
        window_ms: how long the thread waits for more requests when fewer are pending than clients are open.
            It never waits past what the earliest deadline allows.
        torch_threads: torch's intra-op threads in the lane's thread. None leaves them unchanged.
    """

    def __init__(self, run: Callable, *, name: str = "model", max_batch: int = 8, window_ms: float = 2.0,
                 torch_threads: int | None = None):
        if max_batch < 1:
            raise ValueError(f"Lane {name!r}: max_batch {max_batch}; expected at least 1")
        self.run_batch, self.name = run, name
        self.max_batch, self.window_ns = int(max_batch), int(window_ms * 1e6)
        self.torch_threads = torch_threads
        self.cost_ns: dict[int, float] = {}  # batch size -> measured time of one run in ns, smoothed
        self.stats = LaneStats()
        self.shapes: tuple | None = None  # the request's input shapes, each [1, ...], fixed by the first request
        self._cv = threading.Condition()
        # one run of the engine at a time, the lane's thread's or a warm-up's; its outputs are read before the next
        self._engine = threading.RLock()
        self._warmed = False
        self._pending: list[_Request] = []
        self._open = 0
        self._thread: threading.Thread | None = None
        self._stream: torch.cuda.Stream | None = None  # the lane's own, for CUDA requests

    # ---- clients' side ---------------------------------------------------------------------------
    def attach(self) -> None:
        """A client opens: the lane's thread runs while any client is open."""
        with self._cv:
            self._open += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"framegraph:batch:{self.name}",
                                                daemon=True)
                self._thread.start()

    def detach(self) -> None:
        """A client closes. The last one ends the thread. It is joined here, so none is left behind."""
        with self._cv:
            self._open -= 1
            thread = self._thread if self._open == 0 else None
            if thread is not None:
                self._thread = None
                self._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def check(self, inputs: tuple[torch.Tensor, ...]) -> None:
        """Raise a ValueError naming the offending input unless ``inputs`` have the lane's shapes.

        Each input must be one row.
        """
        shapes = tuple(tuple(t.shape) for t in inputs)
        if any(not s or s[0] != 1 for s in shapes):
            raise ValueError(f"{self.name}: a request's inputs have shapes {[list(s) for s in shapes]}; each must "
                             f"be one row, [1, ...] (a session submits its own frame)")
        with self._cv:
            if self.shapes is None:
                self.shapes = shapes
        if shapes != self.shapes:
            raise ValueError(f"{self.name}: a request's inputs have shapes {[list(s) for s in shapes]}; this model "
                             f"runs {[list(s) for s in self.shapes]} (another size is another model: another key)")

    def submit(self, request: _Request) -> None:
        with self._cv:
            self._pending.append(request)
            self._cv.notify_all()

    def withdraw(self, request: _Request) -> bool:
        """Take ``request`` out of the queue. False when it was already taken into a batch."""
        with self._cv:
            if request in self._pending:
                self._pending.remove(request)
                self.stats.cancelled += 1
                return True
            return False

    # ---- cost ---------------------------------------------------------------------------------------
    def cost(self, b: int) -> float:
        """The expected ns of a batch of ``b``.

        It is the measured cost, else scaled from the nearest size measured. It is 0 before any.
        """
        cost = dict(self.cost_ns)  # a copy: the lane's thread adds sizes
        if b in cost:
            return cost[b]
        if not cost:
            return 0.0
        near = min(cost, key=lambda m: abs(m - b))
        return cost[near] * b / near

    def capacity(self, fps: float) -> int:
        """How many sessions the lane serves in time, each asking once per frame at ``fps``.

        That is the largest batch size whose measured cost fits in one frame. It is 0 when even one does not,
        or when nothing was measured.
        """
        period = 1e9 / fps
        fits = [b for b, ns in dict(self.cost_ns).items() if ns <= period]
        return max(fits, default=0)

    @property
    def sessions(self) -> int:
        """How many clients are open: the sessions the lane serves now."""
        return self._open

    def room(self, fps: float) -> bool:
        """Whether one more session still fits, each asking once per frame at ``fps``.

        It fits when the expected cost of a batch of every open client and one more is within one frame.
        That cost is :meth:`cost`. True for the first session: a model slower than a frame serves one, at
        the rate it can. True before anything was measured.
        """
        return self._open == 0 or not self.cost_ns or self.cost(self._open + 1) <= 1e9 / fps

    def warm(self, example: tuple[torch.Tensor, ...], sizes=BUCKETS, repeats: int = 3) -> dict[int, float]:
        """Measure the cost of each batch size in ``sizes``, up to ``max_batch``.

        Each batch is made of ``example``, one row per input. Each size runs ``repeats`` times on the caller's
        thread. It never runs beside the lane's own run. The fastest time of each size is kept as its cost.
        Returns ms per size.
        """
        self.check(example)
        for b in (s for s in sizes if s <= self.max_batch):
            batch = tuple(t.expand(b, *t.shape[1:]).contiguous() for t in example)
            best = None
            for _ in range(repeats):
                with self._engine, torch.inference_mode():
                    _sync(batch)
                    t0 = time.perf_counter_ns()
                    self.run_batch(*batch)
                    _sync(batch)  # on CUDA the time of the work, not of its launches
                    dt = time.perf_counter_ns() - t0
                best = dt if best is None else min(best, dt)
            self.cost_ns[b] = float(best)
        self._warmed = True
        return {b: round(ns / 1e6, 3) for b, ns in sorted(self.cost_ns.items())}

    def warm_once(self, example: tuple[torch.Tensor, ...]) -> None:
        """:meth:`warm` unless it ran or runs. Of sessions set up at once, the first warms the lane."""
        with self._cv:
            if self._warmed:
                return
            self._warmed = True
        self.warm(example)

    def _measured(self, b: int, ns: int) -> None:
        old = self.cost_ns.get(b)
        self.cost_ns[b] = float(ns) if old is None else 0.8 * old + 0.2 * ns

    # ---- the lane's thread ----------------------------------------------------------------------
    def _choose(self) -> tuple[list[_Request], list[_Request]]:
        """Under the lock: the next batch and the requests dropped for their deadline.

        The batch is taken out of the queue.
        """
        self._pending.sort(key=_Request.order)
        now = time.monotonic_ns()
        late = [r.deadline_ns is not None and r.on_miss != "run" and now > r.deadline_ns for r in self._pending]
        dropped = [r for r, d in zip(self._pending, late) if d]
        self._pending = [r for r, d in zip(self._pending, late) if not d]
        if not self._pending:
            return [], dropped
        b = 1
        limit = min(self.max_batch, len(self._pending))
        due = self._pending[0].deadline_ns  # the earliest: a larger batch must not make it later than alone
        due = None if due is None else max(due, now) + self.cost(1)
        while b < limit and (due is None or now + self.cost(b + 1) <= due):
            b += 1
        batch, self._pending[:b] = self._pending[:b], []
        return batch, dropped

    def _gather(self) -> None:
        """Under the lock: wait up to the window for one request per open client.

        It waits only while the earliest deadline leaves the time.
        """
        end = time.monotonic_ns() + self.window_ns
        while self._thread is threading.current_thread() and len(self._pending) < min(self._open, self.max_batch):
            now = time.monotonic_ns()
            due = min((r.deadline_ns for r in self._pending if r.deadline_ns is not None), default=None)
            latest = end if due is None else \
                min(end, due + int(self.cost(1)) - int(self.cost(len(self._pending) + 1)))
            if now >= latest:
                return
            self._cv.wait((latest - now) / 1e9)

    def _loop(self) -> None:
        me = threading.current_thread()
        if self.torch_threads and "OpenMP" in torch.__config__.parallel_info():
            torch.set_num_threads(self.torch_threads)
        while True:
            with self._cv:
                while not self._pending and self._thread is me:
                    self._cv.wait()
                if self._thread is not me:
                    if self._thread is None:  # closed with requests queued (none is, unless cancelled)
                        for r in self._pending:
                            r.client._fail(Cancelled(f"{self.name}: the lane closed"), r)
                        self._pending.clear()
                    return  # else a new thread took over the queue
                if self.window_ns:
                    self._gather()
                batch, dropped = self._choose()
            for r in dropped:
                self.stats.missed += 1
                r.client._fail(Missed(f"{self.name}: the request's deadline passed before it could start"), r)
            if batch:
                self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        with self._engine, self._on_stream(batch) as stream:
            if stream is not None:
                for r in batch:
                    stream.wait_event(r.ready)
            self._run_locked(batch, stream)

    def _on_stream(self, batch: list[_Request]):
        """The lane's CUDA stream made current for a batch of CUDA requests; else nothing."""
        if batch[0].ready is None:
            return contextlib.nullcontext()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=batch[0].inputs[0].device)
        return torch.cuda.stream(self._stream)

    def _run_locked(self, batch: list[_Request], stream: torch.cuda.Stream | None = None) -> None:
        start = time.monotonic_ns()
        try:
            outs = self._call(batch)
            if stream is not None:
                stream.synchronize()  # the lane's thread waits for its own work: the cost is the work's
        except Exception as exc:  # noqa: BLE001 - the batch failed: each request alone, so only its cause hears it
            if len(batch) == 1:
                self.stats.failed += 1
                batch[0].client._fail(exc, batch[0])
                return
            for r in batch:
                self._run([r])
            return
        self._measured(len(batch), time.monotonic_ns() - start)
        self.stats.batches[len(batch)] = self.stats.batches.get(len(batch), 0) + 1
        waits = self.stats.waits_ns
        for i, r in enumerate(batch):
            waits.append(start - r.enqueued_ns)
            if r.deadline_ns is not None and start > r.deadline_ns:
                self.stats.late += 1  # started after its deadline (a request that runs when late)
            self.stats.served += 1
            r.client._deliver(tuple(o[i:i + 1] for o in outs), r)
        del waits[:-4096]

    def _call(self, batch: list[_Request]) -> tuple[torch.Tensor, ...]:
        if len(batch) == 1:
            inputs = batch[0].inputs
        else:
            inputs = tuple(torch.cat(parts) for parts in zip(*(r.inputs for r in batch)))
        with torch.inference_mode():
            outs = self.run_batch(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if any(o.shape[0] != len(batch) for o in outs):
            raise ValueError(f"{self.name}: the batched engine returned {[list(o.shape) for o in outs]} for "
                             f"a batch of {len(batch)}")
        return outs


class BatchClient:
    """One session stage's handle on a lane. It is called as its model is.

    ``[1, ...]`` tensors go in and the result comes out. The result lies in a buffer of the client's. The next
    call reuses it. The call takes the session's deadline in monotonic ns, or None. ``on_miss`` is its policy for
    a deadline it cannot make: ``"drop"`` or ``"run"``.

    :meth:`open` and :meth:`close` bracket a session, in a stage's setup and teardown. Its :meth:`cancel` may come
    from any thread, such as the stage's ``interrupt``. It makes a call waiting now raise :class:`Cancelled`. So
    does every call until the next :meth:`open`.
    """

    def __init__(self, lane: Lane, *, on_miss: OnMiss = "drop"):
        if on_miss not in ON_MISS:
            raise ValueError(f"BatchClient: on_miss {on_miss!r}; expected one of {ON_MISS}")
        self.lane, self.on_miss = lane, on_miss
        self.deadline_ns: int | None = None  # the next call's, when it passes none
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._request: _Request | None = None
        self._result: tuple[torch.Tensor, ...] | None = None
        self._copied: torch.cuda.Event | None = None  # on CUDA: the result's copy, on the lane's stream
        self.served_ns = 0  # when the lane last delivered to it: the lane serves the longest waiting first
        self._error: BaseException | None = None
        self._cancelled = False
        self._opened = False

    def open(self) -> None:
        """Start a session. Idempotent.

        The lane runs. A cancel from the last session is forgotten.
        """
        with self._lock:
            self._cancelled = False
            if self._opened:
                return
            self._opened = True
        self.lane.attach()

    def close(self) -> None:
        """End the session. Idempotent.

        A call in flight is cancelled. The lane stops with its last client.
        """
        self.cancel()
        with self._lock:
            opened, self._opened = self._opened, False
        if opened:
            self.lane.detach()

    def cancel(self) -> None:
        """Cancel the call in flight, and refuse calls until :meth:`open`."""
        with self._lock:
            self._cancelled = True
            request = self._request
        if request is not None and self.lane.withdraw(request):
            self._fail(Cancelled(f"{self.lane.name}: the session was cancelled"), request)
        self._done.set()

    def __call__(self, *inputs: torch.Tensor, deadline_ns: int | None = None):
        """The model's output for ``inputs``, each ``[1, ...]``.

        It is a tensor or a tuple, as the engine returns. Raises :class:`Missed` or :class:`Cancelled`. Raises
        what the model raised for these inputs.
        """
        if not self._opened:
            raise RuntimeError(f"{self.lane.name}: the client is not open (a stage opens it in its setup)")
        inputs = tuple(t.detach().contiguous() for t in inputs)
        self.lane.check(inputs)
        request = _Request(self, inputs, self.deadline_ns if deadline_ns is None else deadline_ns, self.on_miss)
        with self._lock:
            if self._cancelled:
                raise Cancelled(f"{self.lane.name}: the session was cancelled")
            self._request, self._error = request, None
            self._done.clear()
        self.lane.submit(request)
        self._done.wait()
        with self._lock:
            self._request = None
            if self._error is not None:
                raise self._error
            if self._cancelled:
                raise Cancelled(f"{self.lane.name}: the session was cancelled")
            out, copied = self._result, self._copied
        if copied is not None:
            torch.cuda.current_stream(out[0].device).wait_event(copied)
        return out[0] if len(out) == 1 else out

    # ---- the lane's side ------------------------------------------------------------------------
    def _deliver(self, rows: tuple[torch.Tensor, ...], request: _Request) -> None:
        with self._lock:
            if request is not self._request or self._cancelled:
                return  # cancelled while its batch ran: the result is dropped, nothing waits for it
            if self._result is None or any(a.shape != b.shape for a, b in zip(self._result, rows)):
                self._result = tuple(torch.empty_like(r) for r in rows)
            for dst, src in zip(self._result, rows):
                dst.copy_(src)
            self.served_ns = time.monotonic_ns()
            self._copied = _recorded(rows[0].device) if rows[0].is_cuda else None
            self._done.set()

    def _fail(self, error: BaseException, request: _Request) -> None:
        with self._lock:
            if request is not self._request:
                return
            self._error = error
            self._done.set()


class ModelService:
    """The lanes of one process, one per model key.

    A key names weights, runtime and shapes: what may share a batch.

    Args:
        max_batch / window_ms / torch_threads: each new :class:`Lane`'s.
        admit: refuse a client that asks with a frame rate that would not fit, in :meth:`client`. This is a
            server's admission. With False every client is given. A benchmark measuring past capacity wants
            that.
    """

    def __init__(self, *, max_batch: int = 8, window_ms: float = 2.0, torch_threads: int | None = None,
                 admit: bool = False):
        self.max_batch, self.window_ms, self.torch_threads = max_batch, window_ms, torch_threads
        self.admit = admit
        self._lanes: dict[Hashable, Lane] = {}
        self._lock = threading.Lock()

    def lane(self, key: Hashable, run: Callable[[], Callable] | Callable, *, name: str = "model",
             build: bool = False) -> Lane:
        """The lane of ``key``, made on first use with ``run``.

        ``run`` is the batched engine. With ``build``, ``run()`` makes it, called once.
        """
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = Lane(run() if build else run, name=name, max_batch=self.max_batch, window_ms=self.window_ms,
                            torch_threads=self.torch_threads)
                self._lanes[key] = lane
            return lane

    def client(self, key: Hashable, run, *, name: str = "model", build: bool = False,
               on_miss: OnMiss = "drop", fps: float | None = None) -> BatchClient:
        """A new :class:`BatchClient` on the lane of ``key``, from :meth:`lane`.

        ``fps`` is the session's frame rate. With ``fps`` and ``admit``, raises :class:`Full` when one more
        session would not fit in one frame. The error names the measured cost.
        """
        lane = self.lane(key, run, name=name, build=build)
        if self.admit and fps is not None and not lane.room(fps):
            raise Full(f"{lane.name}: {lane.sessions} session(s) already fill this model's time on this machine "
                       f"(a batch of {lane.sessions + 1} is expected to take {lane.cost(lane.sessions + 1) / 1e6:.1f} "
                       f"ms, one frame at {fps:g} fps is {1000 / fps:.1f} ms)")
        return BatchClient(lane, on_miss=on_miss)

    def lanes(self) -> dict[Hashable, Lane]:
        with self._lock:
            return dict(self._lanes)

    def metrics(self) -> dict:
        """Per lane: its :class:`LaneStats`, the measured ms per batch size and whether its thread runs."""
        return {lane.name: {**lane.stats.as_dict(), "cost_ms": {b: round(ns / 1e6, 3) for b, ns in
                                                                sorted(lane.cost_ns.items())},
                            "running": lane.running} for lane in self.lanes().values()}


__all__ = ["ModelService", "Lane", "LaneStats", "BatchClient", "Missed", "Full", "Cancelled", "ON_MISS", "BUCKETS",
           "frame_deadline_ns"]
