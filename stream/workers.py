"""Worker threads that outlive a graph: a session's stages start on threads that already ran stages like them.

A new thread pays on its first frames for what is kept per thread: oneDNN's scratchpad and primitive caches,
OpenMP's team, torch's thread-local settings, the pages of its stack and heap arena. On a small region a session's
first video-avatar frame took 1.3x a steady one in a fresh thread, and starting a graph's seven threads took
1.2 ms of a 9.6-ms first frame (``bench first_frame``, 2-core CPU). So :meth:`Graph.start
<framegraph.stream.graph.Graph.start>` hands each node to :func:`start_worker`: a parked worker that last ran a
stage of the same class, name and torch thread count takes it; otherwise a new worker thread starts. A worker
runs only stages of one key, so the thread state it keeps is what that stage itself left; torch's grad mode is
put back after each run. An idle worker is named ``framegraph-idle:<stage>`` and ends after ``IDLE_S`` seconds
without work (or at :func:`retire_idle_workers`); while it runs a node it carries the node's thread name
(``framegraph:<graph>:<stage>``) and is renamed before its run is reported done.
"""
from __future__ import annotations

import itertools
import os
import threading
import traceback
from collections.abc import Callable, Hashable

import torch

IDLE_S = 60.0  # an idle worker thread ends after this long without a node to run


class Run:
    """One node's run on a worker: ``is_alive()`` and ``join(timeout)``, as a ``threading.Thread``'s."""

    def __init__(self, target: Callable[[], None], name: str):
        self.target, self.name = target, name
        self._done = threading.Event()

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)


class _Worker:
    """A daemon thread that runs the :class:`Run` it is given, then parks with its pool until the next one."""

    def __init__(self, pool: WorkerPool, key: Hashable, label: str):
        self.pool, self.key, self.label = pool, key, label
        self._cv = threading.Condition()
        self._run: Run | None = None
        self._retired = False
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"framegraph-idle:{label}")
        self.thread.start()

    def give(self, run: Run | None) -> None:
        """Its next run; None: end (it was taken off the idle list)."""
        with self._cv:
            self._run, self._retired = run, run is None
            self._cv.notify()

    def _main(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._run is not None or self._retired, self.pool.idle_s)
                run = self._run
                if run is None:
                    if self._retired or self.pool.leave(self):
                        return
                    continue  # taken at the moment its wait ran out: its run is on the way
            grad = torch.is_grad_enabled()
            me.name = run.name
            try:
                run.target()
            except BaseException:  # noqa: BLE001 - a node reports its own errors; anything else is printed
                traceback.print_exc()
            finally:
                torch.set_grad_enabled(grad)
                me.name = f"framegraph-idle:{self.label}"
                with self._cv:
                    self._run = None
                self.pool.park(self)
                run._done.set()


class WorkerPool:
    """Idle workers by key (see the module's docstring). ``idle_s``: how long an idle worker waits for work."""

    def __init__(self, idle_s: float = IDLE_S):
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[_Worker]] = {}
        self._ids = itertools.count()

    def start(self, key: Hashable, target: Callable[[], None], name: str, label: str) -> Run:
        """Run ``target`` on an idle worker of ``key`` (the one parked last) or on a new one; ``name``: the
        thread's name while it runs; ``label``: the idle worker's name after ``framegraph-idle:``."""
        run = Run(target, name)
        with self._lock:
            parked = self._idle.get(key)
            worker = parked.pop() if parked else None
        if worker is None:
            worker = _Worker(self, key, f"{label}:{next(self._ids)}")
        worker.give(run)
        return run

    def park(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.setdefault(worker.key, []).append(worker)

    def leave(self, worker: _Worker) -> bool:
        """An idle worker's wait ran out: True (it ends) unless :meth:`start` has just taken it."""
        with self._lock:
            parked = self._idle.get(worker.key, [])
            if worker not in parked:
                return False
            parked.remove(worker)
            return True

    def idle(self) -> int:
        """How many workers are parked."""
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def retire(self) -> None:
        """End every parked worker now (a test counting threads; a process about to fork)."""
        with self._lock:
            workers = [w for v in self._idle.values() for w in v]
            self._idle.clear()
        for w in workers:
            w.give(None)
        for w in workers:
            w.thread.join(5.0)

    def _forget(self) -> None:
        """In a forked child: the parent's workers are not there."""
        self._lock = threading.Lock()
        self._idle = {}


POOL = WorkerPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL._forget)


def start_worker(key: Hashable, target: Callable[[], None], name: str, label: str) -> Run:
    """:meth:`WorkerPool.start` on the process's pool."""
    return POOL.start(key, target, name, label)


def retire_idle_workers() -> None:
    """End the process's parked workers now."""
    POOL.retire()
