"""A graph's worker threads reuse the pages of their per-frame tensors: the video avatar's mouth generator at
240² faults thousands of pages in per frame in a plain thread (glibc hands the freed blocks back), and none
once a graph has started (stream/memory.py). Run in a process of its own: the setting is process-wide."""
import json
import subprocess
import sys

import pytest

CHILD = """
import json, resource, threading, torch
from framegraph.models.avatar.video.lipsync import MouthGenerator
from framegraph.stream import Graph, IterableSource, PortSpec, Stage

torch.set_num_threads(1)
S = 240
gen = MouthGenerator(sample_size=S).eval()
inputs = (torch.rand(1, 3, S, S), torch.ones(1, 1, S, S), torch.rand(1, 3, S, S), torch.zeros(1, gen.config.shape_dim))


def frame():
    with torch.inference_mode():
        gen(*inputs)


def plain_thread(n):  # page faults per frame in a thread of its own, before any graph ran
    out = []
    def run():
        frame()
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(n):
            frame()
        out.append((resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before) / n)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


class Redraw(Stage):
    def __init__(self):
        super().__init__("redraw")
        self.inputs = {"x": PortSpec((1,))}
        self.faults = []

    def process(self, inputs, out):
        frame()
        self.faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)


plain = plain_thread(8)
g = Graph(name="memory")
src = g.add(IterableSource([[0.0]] * 10, PortSpec((1,))))
stage = g.add(Redraw())
g.connect(src, stage)
g.run()
print(json.dumps({"plain": plain, "graph": (stage.faults[-1] - stage.faults[1]) / (len(stage.faults) - 2)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings (Linux)")
def test_a_graph_stage_reuses_its_per_frame_memory():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    faults = json.loads(done.stdout.strip().splitlines()[-1])
    if faults["plain"] < 1000:  # what the setting is for: here the C library hands the blocks back each frame
        pytest.skip(f"this C library keeps freed blocks in a plain thread too ({faults['plain']:.0f} faults/frame)")
    assert faults["graph"] < 0.05 * faults["plain"], faults


ARENAS = """
import ctypes, ctypes.util, json, os, tempfile, threading
from framegraph.stream.memory import arena_count, keep_freed_memory

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
assert keep_freed_memory()
n = 4 * arena_count() + 4  # more threads than arenas, all allocating at once
barrier = threading.Barrier(n + 1)

def hold():
    libc.malloc(256 << 10)
    barrier.wait()  # every thread holds its block ...
    barrier.wait()  # ... until the arenas are counted

threads = [threading.Thread(target=hold) for _ in range(n)]
for t in threads:
    t.start()
barrier.wait()
path = os.path.join(tempfile.mkdtemp(), "malloc_info.xml")
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, f)
libc.fclose(f)
barrier.wait()
for t in threads:
    t.join()
print(json.dumps({"threads": n, "arenas": open(path).read().count("<heap nr="), "limit": arena_count()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings (Linux)")
def test_new_worker_threads_share_the_arenas_a_warm_up_filled():
    """A session's new threads take an arena that exists (its pages faulted in by the warm-up) rather than a fresh
    one, whose pages the session's first frame would fault in: no more arenas than cores."""
    done = subprocess.run([sys.executable, "-c", ARENAS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert 1 <= seen["arenas"] <= seen["limit"] < seen["threads"], seen


COLLECTOR = """
import gc, json, time, torch
from framegraph.stream import Clock, Graph, IterableSource, PortSpec, RecordingSink
from framegraph.stream.memory import freeze_loaded_objects

model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(200)])  # something loaded


def full_collection_ms():
    t = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t) * 1e3


def run(mode):
    g = Graph(Clock(mode), name=mode)
    src = g.add(IterableSource([[0.0]] * 3, PortSpec((1,))))
    g.connect(src, g.add(RecordingSink({"out": PortSpec((1,))})))
    g.run()
    return gc.get_freeze_count()


before = min(full_collection_ms() for _ in range(3))
offline = run("fast")
live = run("realtime")
after = min(full_collection_ms() for _ in range(3))
print(json.dumps({"offline": offline, "live": live, "again": freeze_loaded_objects(), "before_ms": before,
                  "after_ms": after}))
"""


def test_the_first_live_graph_takes_the_loaded_objects_out_of_the_collectors_full_walks():
    """A full collection walks every tracked object with all threads stopped (150-190 ms with an avatar and Pipecat
    loaded on 2 cores: the picture stream paused). An offline graph leaves the collector alone; the first live one
    freezes what is loaded, once, and a full collection then walks only what came after."""
    done = subprocess.run([sys.executable, "-c", COLLECTOR], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["offline"] == 0 and seen["live"] > 10_000 and seen["again"] is False, seen
    assert seen["after_ms"] < 0.3 * seen["before_ms"], seen
