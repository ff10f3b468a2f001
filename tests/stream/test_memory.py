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
