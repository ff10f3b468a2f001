"""Flow-limiter credits: every frame a source releases comes back to it, whatever path it takes.

Each path runs 10⁴ frames in fast mode, where a source waits for a credit: a credit that never comes
back stops the source for good, so a leak shows as a graph that never ends (``join`` times out). At
the end every source reports ``in_flight == 0``: credits in = credits out.
"""
import time

import pytest
from helpers import AddOne, Collect, framegraph_threads

from framegraph.stream import Clock, CountSource, EndOfStream, Graph, PortSpec, Stage, StageError

N = 10_000


class EveryKth(Stage):
    """Consumes every frame; emits on ``x`` every ``k``-th one only (a stage that skips, like the
    Denoiser's late chunks) and, optionally, a copy of every frame on ``echo``."""

    def __init__(self, k: int, name="every", echo=False):
        super().__init__(name)
        self.k = k
        self.inputs = {"x": PortSpec((4,))}
        self.outputs = {"x": PortSpec((4,))}
        if echo:
            self.outputs["echo"] = PortSpec((4,))
        self.n = 0

    def process(self, inputs, out):
        if "echo" in self.outputs:
            out.write("echo").data.copy_(inputs["x"].data)
        if self.n % self.k == 0:
            out.write("x").data.copy_(inputs["x"].data)
        self.n += 1


class Mix(Stage):
    """Two inputs, one output (its metadata comes from the first input)."""

    def __init__(self, name="mix"):
        super().__init__(name)
        self.inputs = {"a": PortSpec((4,)), "b": PortSpec((4,))}
        self.outputs = {"x": PortSpec((4,))}

    def process(self, inputs, out):
        f = out.write("x")
        f.data.copy_(inputs["a"].data)
        if "b" in inputs:
            f.data.add_(inputs["b"].data)


def run_to_end(g: Graph, timeout_s: float = 120) -> dict:
    try:
        return g.run(timeout=timeout_s)
    except TimeoutError:
        report = g.report()
        g.cancel()
        g.join(10)
        pytest.fail(f"the graph stalled (a source waits for credits that never come back): {report['sources']}")


def assert_all_credits_back(report: dict, frames: int = N) -> None:
    for name, src in report["sources"].items():
        assert src["frames"] == frames, (name, src)
        assert src["in_flight"] == 0, (name, src)
    assert not framegraph_threads()


def test_a_port_nobody_reads_never_holds_a_credit():
    # scope with echo off: the audio copy goes to an unconnected port, video only every 10th chunk.
    g = Graph(Clock("fast"))
    s = g.add(CountSource(N), max_in_flight=2)
    e = g.add(EveryKth(10, echo=True))
    k = g.add(Collect())
    g.connect(s, e)
    g.connect(e, k, "x")
    report = run_to_end(g)
    assert_all_credits_back(report)
    assert k.values() == [float(i) for i in range(0, N, 10)]
    assert report["stages"]["every"]["discarded"] == N  # released at once, counted
    assert report["stages"]["src"]["discarded"] == 0


def test_a_live_source_keeps_sending_past_an_unread_port():
    # The defect as seen live: once max_in_flight frames passed per downstream frame, every further
    # source frame was dropped. 400 frames at 1000 fps pts: nearly all must arrive.
    g = Graph(Clock("realtime"))
    s = g.add(CountSource(400, fps=1000), max_in_flight=4)
    e = g.add(EveryKth(8, echo=True))
    k = g.add(Collect())
    g.connect(s, e)
    g.connect(e, k, "x")
    report = run_to_end(g, 60)
    assert report["sources"]["src"]["dropped_in_flight_limit"] < 100, report["sources"]
    assert len(k.got) > 300 // 8
    assert report["sources"]["src"]["in_flight"] == 0


def test_frames_consumed_without_output_return_their_credit():
    g = Graph(Clock("fast"))
    s = g.add(CountSource(N), max_in_flight=1)
    e = g.add(EveryKth(7))
    k = g.add(Collect())
    g.connect(s, e)
    g.connect(e, k)
    report = run_to_end(g)
    assert_all_credits_back(report)
    assert len(k.got) == len(range(0, N, 7))


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest"])
def test_frames_dropped_on_an_edge_return_their_credit(policy):
    g = Graph(Clock("fast"))
    s = g.add(CountSource(N), max_in_flight=6)
    a = g.add(AddOne())
    k = g.add(Collect())
    g.connect(s, a, policy=policy, capacity=1)
    g.connect(a, k)
    report = run_to_end(g)
    assert_all_credits_back(report)
    dropped = sum(e["drops"] for e in report["edges"])
    assert len(k.got) + dropped == N


def test_a_source_read_through_a_latest_edge_gets_its_credits_back():
    # A pose source (limited) read by a renderer through a "latest" edge, paced by another source.
    g = Graph(Clock("fast"))
    frames = g.add(CountSource(N, name="frames"), max_in_flight=2)
    poses = g.add(CountSource(N, name="poses"), max_in_flight=2)
    r = g.add(Collect(name="render", ports=("frame", "pose")))
    g.connect(frames, r, dst_port="frame")
    g.connect(poses, r, dst_port="pose", policy="latest")
    report = run_to_end(g)
    assert_all_credits_back(report)


def test_a_second_source_merged_into_a_stage_gets_its_credits_back():
    # The mixer's output carries the first input's lineage; the second input's ends at the mixer.
    g = Graph(Clock("fast"))
    a = g.add(CountSource(N, name="a"), max_in_flight=2)
    b = g.add(CountSource(N, name="b"), max_in_flight=2)
    m = g.add(Mix())
    k = g.add(Collect())
    g.connect(a, m, dst_port="a")
    g.connect(b, m, dst_port="b")
    g.connect(m, k)
    report = run_to_end(g)
    assert_all_credits_back(report)
    assert k.values() == [2.0 * i for i in range(N)]


def test_fan_out_with_a_dropping_branch_returns_every_credit():
    g = Graph(Clock("fast"))
    s = g.add(CountSource(N), max_in_flight=3)
    a, b = g.add(AddOne("a")), g.add(AddOne("b"))
    ka, kb = g.add(Collect("ka")), g.add(Collect("kb"))
    g.connect(s, a)
    g.connect(s, b, policy="drop_oldest", capacity=1)
    g.connect(a, ka)
    g.connect(b, kb)
    report = run_to_end(g)
    assert_all_credits_back(report)
    assert len(ka.got) == N


def test_a_stage_error_releases_a_source_waiting_for_credits():
    class FailLate(Stage):
        def __init__(self):
            super().__init__("fail")
            self.inputs = {"x": PortSpec((4,))}
            self.n = 0

        def process(self, inputs, out):
            self.n += 1
            if self.n == N:
                raise RuntimeError("boom at the last frame")

    g = Graph(Clock("fast"))
    s = g.add(CountSource(None), max_in_flight=1)  # endless: only the error ends it
    f = g.add(FailLate())
    g.connect(s, f)
    t0 = time.monotonic()
    with pytest.raises(StageError, match="boom at the last frame"):
        g.run(timeout=120)
    assert time.monotonic() - t0 < 120
    assert f.n == N and not framegraph_threads()


def test_cancel_releases_a_source_waiting_for_credits():
    class Hold(Stage):  # never finishes a frame in time: the source waits on its only credit
        def __init__(self):
            super().__init__("hold")
            self.inputs = {"x": PortSpec((4,))}

        def process(self, inputs, out):
            time.sleep(0.05)

    g = Graph(Clock("fast"))
    s = g.add(CountSource(None), max_in_flight=1)
    g.connect(s, g.add(Hold()))
    g.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    g.cancel()
    g.join(5)
    assert time.monotonic() - t0 < 1.0
    assert not framegraph_threads()


def test_a_source_whose_only_port_is_unread_still_ends():
    class Quiet(Stage):
        def __init__(self):
            super().__init__("quiet")
            self.outputs = {"x": PortSpec((4,)), "unused": PortSpec((4,))}
            self.i = 0

        def process(self, inputs, out):
            if self.i >= 50:
                raise EndOfStream
            out.write("unused").pts = self.i
            if self.i % 5 == 0:
                out.write("x").data.fill_(self.i)
            self.i += 1

    g = Graph(Clock("fast"))
    q = g.add(Quiet(), max_in_flight=1)
    k = g.add(Collect())
    g.connect(q, k, "x")
    report = run_to_end(g, 30)
    assert k.values() == [float(i) for i in range(0, 50, 5)]
    assert report["sources"]["quiet"] == {"frames": 10, "dropped_in_flight_limit": 0, "max_in_flight": 1,
                                          "in_flight": 0}
    assert report["stages"]["quiet"]["discarded"] == 50
