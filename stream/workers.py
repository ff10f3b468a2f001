"""Worker threads that outlive a graph.

A session's stages start on threads that already ran stages like them.

A new thread pays on its first frames for what is kept per thread. That is oneDNN's scratchpad and primitive
caches, OpenMP's team, torch's thread-local state and the pages of its stack. Starting a thread also costs a
fraction of a millisecond. With small models this makes a session's first frame slow. ``bench first_frame``
measures it.

So :meth:`Graph.start <framegraph.stream.graph.Graph.start>` hands each node to :func:`start_worker`. A parked
worker that last ran a stage of the same kind takes it. The kind is the class and name. Else any parked worker of
the same group takes it. The group is the stage's torch thread count, which OpenMP keeps per thread. Else a new
worker thread starts. No stage sets any other per-thread state. A stage could leave torch's grad mode behind. It
is put back after each run.

An idle worker is named ``framegraph-idle:<stage>:<n>``. It ends after ``IDLE_S`` seconds without work, or at
:func:`retire_idle_workers`. While it runs a node it carries the node's thread name,
``framegraph:<graph>:<stage>``. It is renamed before its run is reported done. A forked child starts with no
parked workers.
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
    """One node's run on a worker. It has ``is_alive()`` and ``join(timeout)``, as a ``threading.Thread`` does."""

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
        """Give it its next run. None ends it. It was then taken off the idle list."""
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
    """Idle workers by key, as the module's docstring says.

    ``idle_s`` is how long an idle worker waits for work.
    """

    def __init__(self, idle_s: float = IDLE_S):
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[_Worker]] = {}
        self._ids = itertools.count()

    def start(self, kind: Hashable, group: Hashable, target: Callable[[], None], name: str, label: str) -> Run:
        """Run ``target`` on the idle worker of ``(kind, group)`` parked last.

        Else it runs on one of ``group`` that ran another kind. Else it runs on a new one. ``name`` is the
        thread's name while it runs. ``label`` is the worker's name after ``framegraph-idle:`` from then on.
        """
        run = Run(target, name)
        key = (kind, group)
        with self._lock:
            parked = self._idle.get(key) or next((v for (_, g), v in self._idle.items() if g == group and v), None)
            worker = parked.pop() if parked else None
        if worker is None:
            worker = _Worker(self, key, f"{label}:{next(self._ids)}")
        else:
            worker.key, worker.label = key, f"{label}:{next(self._ids)}"
        worker.give(run)
        return run

    def park(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.setdefault(worker.key, []).append(worker)

    def leave(self, worker: _Worker) -> bool:
        """An idle worker's wait ran out. True means it ends. It is False when :meth:`start` has just taken it."""
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
        """End every parked worker now. For a test that counts the threads left."""
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


def start_worker(kind: Hashable, group: Hashable, target: Callable[[], None], name: str, label: str) -> Run:
    """:meth:`WorkerPool.start` on the process's pool."""
    return POOL.start(kind, group, target, name, label)


def retire_idle_workers() -> None:
    """End the process's parked workers now."""
    POOL.retire()
