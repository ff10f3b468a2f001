"""Graph semantics: validation, policies in a running graph, errors, drain, cancel, flow limiting."""
import time

import pytest
import torch
from helpers import AddOne, Boom, Collect, framegraph_threads

from framegraph.stream import Clock, CountSource, Flag, Graph, GraphError, PortSpec, Stage, StageError, prometheus_text


def chain(n=10, clock=None, fps: float = 100, **edge):
    """source → AddOne → Collect; ``n=None``: the source never ends."""
    g = Graph(clock)
    s, a, k = g.add(CountSource(n, fps=fps)), g.add(AddOne()), g.add(Collect())
    g.connect(s, a, **edge)
    g.connect(a, k, **edge)
    return g, s, a, k


def test_chain_delivers_every_frame_in_order_with_metadata():
    g, s, a, k = chain(20)
    report = g.run(timeout=10)
    assert k.values() == [float(i + 1) for i in range(20)]
    assert [seq for _, _, seq, _, _ in k.got] == list(range(20))
    assert [pts for *_, pts, _ in k.got] == [i * 480 for i in range(20)]  # 100 fps at 48 kHz ticks
    assert report["sink_frames"] == 20
    assert report["stages"]["add"]["frames"] == 20
    assert report["edges"][0]["drops"] == 0
    assert report["end_to_end"]["count"] == 20
    assert report["time_to_first_frame_ms"] is not None
    assert k.torn_down == 1 and not framegraph_threads()


def test_fan_out_and_fan_in():
    g = Graph()
    s = g.add(CountSource(5))
    a, b = g.add(AddOne("a")), g.add(AddOne("b"))
    k = g.add(Collect(ports=("p", "q")))
    g.connect(s, a)
    g.connect(s, b)
    g.connect(a, k, dst_port="p")
    g.connect(b, k, dst_port="q")
    g.run(timeout=10)
    assert k.values("p") == k.values("q") == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_any_trigger_consumes_inputs_at_their_own_rates():
    class Mux(Collect):
        trigger = "any"

    g = Graph()
    fast, slow = g.add(CountSource(20, name="fast")), g.add(CountSource(5, name="slow"))
    k = g.add(Mux(ports=("a", "b")))
    g.connect(fast, k, dst_port="a")
    g.connect(slow, k, dst_port="b")
    g.run(timeout=10)
    assert k.values("a") == [float(i) for i in range(20)]
    assert k.values("b") == [float(i) for i in range(5)]


def test_latest_edge_feeds_the_newest_value_without_gating():
    class Pose(Stage):  # a slow-changing value, produced much less often than frames
        def __init__(self):
            super().__init__("pose")
            self.outputs = {"x": PortSpec((4,))}
            self.i = 0

        def process(self, inputs, out):
            from framegraph.stream import EndOfStream
            if self.i >= 3:
                raise EndOfStream
            out.write().data.fill_(100 + self.i)
            self.i += 1

    class Render(Collect):
        def process(self, inputs, out):
            self.pairs.append((inputs["frame"].seq, float(inputs["pose"].data[0])))

    g = Graph()
    frames, pose = g.add(CountSource(30, name="frames")), g.add(Pose())
    r = g.add(Render(name="render", ports=("frame", "pose")))
    r.pairs = []
    g.connect(frames, r, dst_port="frame")
    g.connect(pose, r, dst_port="pose", policy="latest")
    g.run(timeout=10)
    assert [seq for seq, _ in r.pairs] == list(range(30))  # every frame rendered, none gated away
    poses = [p for _, p in r.pairs]
    assert poses == sorted(poses) and set(poses) <= {100.0, 101.0, 102.0}


def test_drop_oldest_under_a_slow_consumer_drops_and_counts():
    g = Graph(Clock("fast"))
    s, k = g.add(CountSource(60)), g.add(Collect(delay_s=0.005))
    g.connect(s, k, policy="drop_oldest", capacity=2)
    report = g.run(timeout=20)
    got = k.values()
    assert report["edges"][0]["drops"] == 60 - len(got) > 0
    assert got == sorted(got) and got[-1] == 59.0  # the newest frame always arrives


def test_drop_newest_keeps_old_frames():
    g = Graph(Clock("fast"))
    s, k = g.add(CountSource(60)), g.add(Collect(delay_s=0.005))
    g.connect(s, k, policy="drop_newest", capacity=2)
    report = g.run(timeout=20)
    assert report["edges"][0]["drops"] == 60 - len(k.values()) > 0
    assert k.values()[:2] == [0.0, 1.0]


# ---- validation ---------------------------------------------------------------------------------

def test_shape_mismatch_names_both_stages():
    g = Graph()
    s, k = g.add(CountSource(shape=(4,))), g.add(Collect(shape=(5,)))
    g.connect(s, k)
    with pytest.raises(GraphError, match=r"src\.x -> sink\.x: shape mismatch: "
                                         r"'src' produces \[4\].*'sink' expects \[5\]"):
        g.start()


def test_dtype_and_device_mismatch():
    g = Graph()
    s, k = g.add(CountSource(dtype=torch.float16)), g.add(Collect())
    g.connect(s, k)
    with pytest.raises(GraphError, match="dtype mismatch.*float16.*float32"):
        g.validate()
    g = Graph()
    s, k = g.add(CountSource(device="meta")), g.add(Collect())
    g.connect(s, k)
    with pytest.raises(GraphError, match="device mismatch.*meta.*cpu"):
        g.validate()


def test_cycle_is_reported_with_its_path():
    g = Graph()
    src = g.add(CountSource())

    class Join(AddOne):
        def __init__(self, name):
            super().__init__(name)
            self.inputs = {"x": PortSpec((4,)), "y": PortSpec((4,))}

    a, b = g.add(Join("a")), g.add(AddOne("b"))
    g.connect(src, a, dst_port="x")
    g.connect(a, b)
    g.connect(b, a, dst_port="y")
    with pytest.raises(GraphError, match="cycle: a -> b -> a"):
        g.validate()


@pytest.mark.parametrize("build, match", [
    (lambda g: g.add(Collect()), "no source"),
    (lambda g: (g.add(CountSource()), g.add(Collect())), r"input port\(s\) \['x'\] not connected"),
    (lambda g: g.connect(g.add(CountSource()), g.add(Collect()), "y"), "no output port 'y'"),
    (lambda g: (g.add(CountSource()), g.add(CountSource())), "already in the graph"),
    (lambda g: g.connect(g.add(CountSource()), g.add(Collect()), policy="fifo"), "unknown policy"),
])
def test_malformed_graphs_are_refused_before_start(build, match):
    g = Graph()
    with pytest.raises(GraphError, match=match):
        build(g)
        g.validate()


def test_input_fed_twice_is_refused():
    g = Graph()
    a, b, k = g.add(CountSource(name="a")), g.add(CountSource(name="b")), g.add(Collect())
    g.connect(a, k)
    g.connect(b, k)
    with pytest.raises(GraphError, match="fed twice: by a.x and by b.x"):
        g.validate()


# ---- errors, drain, cancel ----------------------------------------------------------------------

def test_stage_exception_stops_graph_quickly_names_stage_and_leaves_no_thread():
    g = Graph(Clock("realtime"))
    s, b, k = g.add(CountSource(None, fps=200)), g.add(Boom(at=3)), g.add(Collect())
    g.connect(s, b)
    g.connect(b, k)
    t0 = time.monotonic()
    with pytest.raises(StageError, match="stage 'boom' failed: RuntimeError: kaboom") as info:
        g.run(timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert info.value.stage == "boom" and isinstance(info.value.__cause__, RuntimeError)
    assert not framegraph_threads()
    assert k.torn_down == 1


def test_setup_failure_is_raised_by_start():
    class BadSetup(Collect):
        def setup(self, ctx):
            raise OSError("no such model file")

    g = Graph()
    s, k = g.add(CountSource(None)), g.add(BadSetup())
    g.connect(s, k)
    with pytest.raises(StageError, match="'sink' failed: OSError: no such model file"):
        g.start()
    assert not framegraph_threads()


def test_drain_lets_end_of_stream_flow_through():
    g, s, a, k = chain(None, Clock("realtime"))
    g.start()
    time.sleep(0.2)
    g.drain()
    report = g.join(timeout=5)
    assert 5 <= len(k.got) <= 40
    assert report["sink_frames"] == len(k.got) == report["sources"]["src"]["frames"]  # none lost
    assert k.torn_down == 1 and not framegraph_threads()


def test_cancel_stops_a_graph_blocked_on_backpressure():
    g = Graph()
    s, k = g.add(CountSource(None)), g.add(Collect(delay_s=0.05))
    g.connect(s, k, capacity=1)
    g.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    g.cancel()
    g.join(timeout=2)
    assert time.monotonic() - t0 < 1.0 and not framegraph_threads()


def test_thousand_start_stop_cycles_do_not_hang_or_leak_threads():
    g, s, a, k = chain(3)
    for i in range(1000):
        g.start()
        if i % 2:
            g.cancel()
        g.join(timeout=5)
    assert k.set_up == k.torn_down == 1000
    assert not framegraph_threads()


def test_reset_reaches_the_stage_between_frames():
    g, s, a, k = chain(None, Clock("realtime"), fps=200)
    g.start()
    time.sleep(0.05)
    g.reset()
    time.sleep(0.05)
    g.drain()
    g.join(timeout=5)
    assert a.resets == 1


# ---- clock, flow limiter, fallbacks -------------------------------------------------------------

def test_realtime_mode_paces_sources_by_pts():
    g, s, a, k = chain(11, Clock("realtime"))  # 100 fps → frame 10 is due at 100 ms
    t0 = time.monotonic()
    g.run(timeout=5)
    assert 0.09 <= time.monotonic() - t0 < 0.5


def test_flow_limiter_bounds_latency_and_drops_at_the_source_under_overload():
    fps, sink_s = 100, 0.02  # the sink needs 2 frame periods per frame
    g = Graph(Clock("realtime"))
    s = g.add(CountSource(None, fps=fps), max_in_flight=1)
    k = g.add(Collect(delay_s=sink_s))
    g.connect(s, k, capacity=2)
    g.start()
    time.sleep(1.0)
    g.drain()
    report = g.join(timeout=5)
    assert report["sources"]["src"]["dropped_in_flight_limit"] > 10
    e2e = report["end_to_end"]
    # bounded: one frame period + the stage time (+ scheduling slack), not growing with run time
    assert e2e["p95_ms"] < 1000 / fps + sink_s * 1000 + 25
    assert report["edges"][0]["drops"] == 0
    seqs = [seq for *_, seq, _, _ in k.got]
    assert seqs == list(range(len(seqs)))
    assert any(f & Flag.DISCONTINUITY for *_, f in k.got)


class Freshest(Stage):
    """A slow live stage (20 ms a frame) that computes only the freshest input (``Stage.stale``)."""

    def __init__(self):
        super().__init__("freshest")
        self.inputs = {"x": PortSpec((4,))}
        self.outputs = {"x": PortSpec((4,))}
        self.skipped = 0

    def process(self, inputs, out):
        if self.stale(inputs["x"], "x", max_lag_ms=1000):
            self.skipped += 1
            return
        time.sleep(0.02)
        out.write("x").data.copy_(inputs["x"].data)


@pytest.mark.parametrize("mode", ["realtime", "fast"])
def test_a_live_stage_skips_to_the_newest_waiting_frame_and_offline_computes_every_one(mode):
    """Frames every 5 ms into a stage that needs 20: live, each computed frame is the newest it had (the
    ones queued behind were skipped, the last frame is always computed); offline every frame is."""
    g = Graph(Clock(mode))
    s, f, k = g.add(CountSource(40, fps=200)), g.add(Freshest()), g.add(Collect())
    g.connect(s, f, capacity=8)
    g.connect(f, k, capacity=8)
    g.run(timeout=10)
    got = k.values()
    assert got == sorted(got) and got[-1] == 39.0 and f.skipped + len(got) == 40
    if mode == "realtime":
        assert f.skipped >= 20, (f.skipped, got)  # at most one computed frame per 20 ms of a 200-ms stream
    else:
        assert f.skipped == 0


def test_flow_limiter_in_fast_mode_waits_instead_of_dropping():
    g = Graph(Clock("fast"))
    s = g.add(CountSource(50), max_in_flight=2)
    k = g.add(Collect(delay_s=0.001))
    g.connect(s, k, capacity=4)
    report = g.run(timeout=10)
    assert k.values() == [float(i) for i in range(50)]
    assert report["sources"]["src"]["dropped_in_flight_limit"] == 0


def test_budget_overrun_steps_down_to_a_fallback_and_counts_misses():
    class Heavy(AddOne):
        budget_ms = 4.0
        fallbacks = ("half", "quarter")

        def __init__(self):
            super().__init__("heavy")
            self.levels = []

        def set_fallback(self, level):
            self.levels.append(level)
            self.delay_s = [0.010, 0.005, 0.001][level]

    g = Graph()
    s, h, k = g.add(CountSource(80)), g.add(Heavy()), g.add(Collect())
    h.delay_s = 0.010
    g.connect(s, h)
    g.connect(h, k)
    report = g.run(timeout=20)
    assert h.levels[:2] == [1, 2]
    st = report["stages"]["heavy"]
    assert st["deadline_misses"] >= 2 and st["fallback_level"] in (1, 2)


def test_telemetry_json_and_prometheus_text():
    g, *_ = chain(10)
    report = g.run()
    for key in ("time_to_first_frame_ms", "fps", "end_to_end", "av_offset", "stages", "edges", "sources"):
        assert key in report
    assert set(report["stages"]["add"]["work"]) >= {"p50_ms", "p95_ms", "p99_ms"}
    text = prometheus_text(g.telemetry, [g.edge_report()], labels=[{"session": "1"}])
    assert '# TYPE framegraph_stage_work_seconds histogram' in text
    assert 'framegraph_stage_work_seconds_count{session="1",stage="add"} 10' in text
    assert 'framegraph_stage_work_seconds_bucket{session="1",stage="add",le="+Inf"} 10' in text
    assert 'framegraph_edge_drops_total{session="1",edge="src.x -> add.x"} 0' in text
    assert 'framegraph_sink_frames_total{session="1"} 10' in text


def test_flush_lets_a_stage_emit_what_it_holds_at_end_of_stream():
    class Pairs(AddOne):  # emits the sum of each pair; an odd last frame comes out at flush
        def __init__(self):
            super().__init__("pairs")
            self.held = None

        def process(self, inputs, out):
            x = float(inputs["x"].data[0])
            if self.held is None:
                self.held = x
                return
            out.write("x").data.fill_(self.held + x)
            self.held = None

        def flush(self, out):
            if self.held is not None:
                out.write("x").data.fill_(self.held)

    g = Graph()
    s, p, k = g.add(CountSource(5)), g.add(Pairs()), g.add(Collect())
    g.connect(s, p)
    g.connect(p, k)
    g.run(timeout=10)
    assert k.values() == [1.0, 5.0, 4.0]
    assert [seq for _, _, seq, _, _ in k.got] == [1, 3, 4]  # lineage of the newest input


def test_a_stage_runs_torch_on_its_own_threads_in_its_worker():
    """``Stage.torch_threads`` is set in the stage's worker before ``setup``; the caller's setting stays."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch without OpenMP: one intra-op pool for every thread")

    class Threads(AddOne):
        def setup(self, ctx):
            super().setup(ctx)
            self.at_setup = torch.get_num_threads()

        def process(self, inputs, out):
            self.at_process = torch.get_num_threads()
            super().process(inputs, out)

    before = torch.get_num_threads()
    g = Graph()
    s, a, b, k = g.add(CountSource(3)), g.add(Threads("two")), g.add(Threads("one")), g.add(Collect())
    a.torch_threads, b.torch_threads = 2, 1
    g.connect(s, a)
    g.connect(a, b)
    g.connect(b, k)
    g.run(timeout=10)
    assert (a.at_setup, a.at_process) == (2, 2)
    assert (b.at_setup, b.at_process) == (1, 1)
    assert torch.get_num_threads() == before
