"""Worker threads that outlive a graph (stream/workers.py): a stage starts on a thread that ran a stage like it."""
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from helpers import AddOne, Collect, framegraph_threads, wait_for

from framegraph.stream import CountSource, Graph
from framegraph.stream.workers import POOL, WorkerPool, retire_idle_workers


class Where(AddOne):
    """AddOne that records the thread of its setup and of its frames, and what grad mode its setup found."""

    def __init__(self, name="add", torch_threads=None, disable_grad=False):
        super().__init__(name)
        self.torch_threads = torch_threads
        self.disable_grad = disable_grad
        self.threads: set[int] = set()
        self.grad_at_setup: bool | None = None

    def setup(self, ctx):
        super().setup(ctx)
        self.grad_at_setup = torch.is_grad_enabled()
        if self.disable_grad:
            torch.set_grad_enabled(False)  # left so: the worker puts it back after the run
        self.threads.add(threading.get_ident())

    def process(self, inputs, out):
        self.threads.add(threading.get_ident())
        super().process(inputs, out)


def chain(*stages, n=5) -> tuple[Graph, Collect]:
    """source → stages → sink, not started."""
    g = Graph()
    prev = g.add(CountSource(n, fps=1000))
    for s in stages:
        g.add(s)
        g.connect(prev, s)
        prev = s
    sink = g.add(Collect())
    g.connect(prev, sink)
    return g, sink


def run_chain(*stages, n=5) -> Collect:
    g, sink = chain(*stages, n=n)
    g.run(timeout=10)
    return sink


def test_a_second_graph_runs_its_stages_on_the_first_graphs_threads_and_no_node_thread_is_left():
    retire_idle_workers()
    first, second = Where(), Where()
    run_chain(first)
    assert not framegraph_threads()  # renamed before join returned
    idle = [t.name for t in threading.enumerate() if t.name.startswith("framegraph-idle:")]
    assert len(idle) == 3, idle  # source, stage, sink: parked
    sink = run_chain(second)
    assert sink.values() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(first.threads) == 1 and first.threads == second.threads
    assert POOL.idle() == 3


def test_a_stage_takes_the_worker_of_its_kind_else_one_of_its_torch_thread_count_never_another_count():
    retire_idle_workers()
    a, b = Where("add"), Where("plus")
    run_chain(a, b)  # parked: source, add, plus, sink (all of torch_threads None)
    run_chain(b2 := Where("plus"), a2 := Where("add"))  # the same kinds, in the other order
    assert a2.threads == a.threads and b2.threads == b.threads
    one = Where("add", torch_threads=1)
    run_chain(one)  # another thread count: a new worker, even though an "add" one is parked
    assert one.threads.isdisjoint(a.threads | b.threads)
    retire_idle_workers()
    run_chain(Where("add"))
    other = Where("other")
    run_chain(other)  # no "other" parked: it takes the parked "add" worker (same count) instead of a new thread
    assert POOL.idle() == 3


def test_overlapping_graphs_get_their_own_workers_and_both_are_kept():
    retire_idle_workers()
    release = threading.Event()

    class Held(Where):
        def process(self, inputs, out):
            release.wait(10)  # both graphs are running before either gets past its first frame
            super().process(inputs, out)

    held = [Held("add"), Held("add")]
    graphs = [chain(s)[0] for s in held]
    for g in graphs:
        g.start()
    release.set()
    for g in graphs:
        g.join(10)
    assert held[0].threads.isdisjoint(held[1].threads)
    assert POOL.idle() == 6


def test_grad_mode_is_put_back_after_a_run():
    retire_idle_workers()
    run_chain(Where("add", disable_grad=True))
    after = Where("add")
    run_chain(after)
    assert after.grad_at_setup is True


def test_an_idle_worker_ends_after_its_wait_and_retire_ends_the_rest():
    pool = WorkerPool(idle_s=0.2)
    done = threading.Event()
    run = pool.start("k", None, done.set, "framegraph:test:k", "k")
    run.join(5)
    assert done.is_set() and not run.is_alive()
    assert pool.idle() == 1
    wait_for(lambda: pool.idle() == 0, 5, "the idle worker to end")
    wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("framegraph-idle:k:")], 5,
             "its thread to end")
    long = WorkerPool(idle_s=60)
    for key in "ab":
        long.start(key, key, lambda: None, f"framegraph:test:{key}", key).join(5)
    assert long.idle() == 2
    t0 = time.monotonic()
    long.retire()
    assert long.idle() == 0 and time.monotonic() - t0 < 5
    assert not [t for t in threading.enumerate() if t.name.startswith(("framegraph-idle:a:", "framegraph-idle:b:"))]


def test_an_error_in_a_run_leaves_the_worker_usable():
    pool = WorkerPool(idle_s=60)

    def boom():
        raise RuntimeError("kaboom")

    pool.start("k", None, boom, "framegraph:test:k", "k").join(5)
    done = threading.Event()
    pool.start("k", None, done.set, "framegraph:test:k", "k").join(5)
    assert done.is_set() and pool.idle() == 1
    pool.retire()


FORK = """
import multiprocessing, sys
sys.path.insert(0, sys.argv[1])
from helpers import AddOne, Collect
from framegraph.stream import CountSource, Graph
from framegraph.stream.workers import POOL


def run_chain(n):
    g = Graph()
    src, add, sink = g.add(CountSource(n, fps=1000)), g.add(AddOne()), g.add(Collect())
    g.connect(src, add)
    g.connect(add, sink)
    g.run(timeout=10)
    return sink.values()


def child(queue):
    queue.put((POOL.idle(), run_chain(3)))


run_chain(5)  # parked workers in the parent
assert POOL.idle() > 0, POOL.idle()
ctx = multiprocessing.get_context("fork")
queue = ctx.Queue()
proc = ctx.Process(target=child, args=(queue,), daemon=True)  # a daemon: never waited for at exit
proc.start()
try:
    idle_at_start, values = queue.get(timeout=60)
    proc.join(30)
finally:
    if proc.is_alive():
        proc.kill()
print(idle_at_start, values, proc.exitcode)
"""


def test_a_forked_child_starts_its_own_workers():
    """In a fresh interpreter (a fork of the test process itself would copy whatever threads the earlier tests
    left running, with their locks): its workers park, then a forked child finds none and runs a graph."""
    tests = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", FORK, tests], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "[1.0,", "2.0,", "3.0]", "0"], done.stdout
