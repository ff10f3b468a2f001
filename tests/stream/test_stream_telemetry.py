"""Telemetry tells a stage's own work from its waiting: blocked on a full downstream ring (output_wait) or
waiting for upstream input (input_wait). Stage "costs" are sleeps (they release the GIL, as a GPU wait does),
so the expected times hold on a loaded CPU."""

import re
import threading
import time

import pytest
import torch
from helpers import AddOne, Collect, CountSource

from framegraph.stream import Clock, Graph, PortSpec, PushSource, prometheus_text

SLOW_S = 0.050  # the slow stage's time per frame
N = 16


class Governed:
    """Mix-in: a budget with one fallback level; records every level the governor asks for."""

    budget_ms = 35.0  # under the 50 ms a blocked neighbour waits, far above a quick stage's work
    fallbacks = ("cheaper",)

    def set_fallback(self, level):
        self.levels.append(level)
        self.fallback_level = level


class BudgetedSource(Governed, CountSource):
    def __init__(self, n):
        super().__init__(n, name="src")
        self.levels = []


class BudgetedAddOne(Governed, AddOne):
    def __init__(self, name, delay_s=0.0):
        super().__init__(name, delay_s=delay_s)
        self.levels = []


@pytest.fixture(scope="module")
def backpressured():
    """src (fast, budget 35 ms) → slow (sleeps 50 ms, budget 35 ms) → sink, through one-slot block rings."""
    g = Graph(Clock("fast"))
    src, slow, sink = g.add(BudgetedSource(N)), g.add(BudgetedAddOne("slow", SLOW_S)), g.add(Collect())
    g.connect(src, slow, capacity=1)
    g.connect(slow, sink, capacity=1)
    report = g.run(timeout=30)
    assert sink.values() == [float(i + 1) for i in range(N)]
    return g, report, src, slow


def test_a_fast_source_blocked_by_a_slow_stage_reports_waiting_not_work(backpressured):
    _, report, src, _ = backpressured
    s = report["stages"]["src"]
    assert s["frames"] == N
    assert s["work"]["p50_ms"] < 10, s["work"]  # filling a 4-float frame; it used to read ≈ 50 ms here
    assert 0.7 * SLOW_S * 1e3 < s["output_wait"]["p50_ms"] < 3 * SLOW_S * 1e3, s["output_wait"]
    assert s["output_wait"]["total_s"] > (N - 4) * SLOW_S * 0.7  # all but the first frames waited ≈ 50 ms
    assert s["input_wait"] is None  # a source has no input
    # the governor and the budget look at work only: the waiting source is neither late nor stepped down
    assert s["deadline_misses"] == 0 and s["fallback_level"] == 0 and src.levels == [], s


def test_the_slow_stage_reports_its_own_work_and_is_governed(backpressured):
    _, report, _, slow = backpressured
    s = report["stages"]["slow"]
    assert SLOW_S * 1e3 <= s["work"]["p50_ms"] < 3 * SLOW_S * 1e3, s["work"]
    assert s["input_wait"]["p50_ms"] < 10, s["input_wait"]  # the source always has the next frame ready
    assert s["output_wait"]["p50_ms"] < 10, s["output_wait"]  # the sink is quick
    # over its 35 ms budget on every frame: the same governor steps it down and counts the misses
    assert s["deadline_misses"] == N and slow.levels == [1] and s["fallback_level"] == 1


def test_a_stage_after_a_slow_one_waits_for_its_input(backpressured):
    _, report, *_ = backpressured
    s = report["stages"]["sink"]
    assert s["work"]["p50_ms"] < 10, s["work"]
    assert 0.7 * SLOW_S * 1e3 < s["input_wait"]["p50_ms"] < 3 * SLOW_S * 1e3, s["input_wait"]
    assert s["input_wait"]["total_s"] > (N - 1) * SLOW_S * 0.7
    assert s["output_wait"] is None  # a sink has no output


def _series(text: str, name: str) -> dict[str, float]:
    """``{stage: value}`` of one sample name (``_sum``, ``_count`` or a bucket with its ``le``) in exposition text."""
    out = {}
    for m in re.finditer(rf'^{name}\{{stage="([^"]+)"(?:,le="([^"]+)")?\}} (\S+)$', text, re.M):
        out[m[1] if m[2] is None else f"{m[1]}@{m[2]}"] = float(m[3])
    return out


def test_prometheus_exposes_work_and_both_waits_with_the_reports_values(backpressured):
    g, report, *_ = backpressured
    text = prometheus_text(g.telemetry)
    assert "framegraph_stage_latency_seconds" not in text  # replaced by the three families
    for part in ("work", "output_wait", "input_wait"):
        assert f"# TYPE framegraph_stage_{part}_seconds histogram" in text
    sums = {
        part: _series(text, f"framegraph_stage_{part}_seconds_sum") for part in ("work", "output_wait", "input_wait")
    }
    assert set(sums["work"]) == {"src", "slow", "sink"}
    assert set(sums["output_wait"]) == {"src", "slow"} and set(sums["input_wait"]) == {"slow", "sink"}
    for part in ("output_wait", "input_wait"):
        for stage, seconds in sums[part].items():
            assert seconds == pytest.approx(report["stages"][stage][part]["total_s"], rel=1e-9)
    assert sums["output_wait"]["src"] > (N - 4) * SLOW_S * 0.7
    assert sums["work"]["src"] < N * 0.01
    counts = _series(text, "framegraph_stage_work_seconds_count")
    assert counts == {"src": N, "slow": N, "sink": N}
    buckets = _series(text, "framegraph_stage_work_seconds_bucket")
    assert buckets["slow@0.025"] == 0 and buckets["slow@0.05"] == 0 and buckets["slow@+Inf"] == N  # ≥ 50 ms each
    misses = _series(text, "framegraph_deadline_misses_total")
    assert misses == {"src": 0, "slow": N, "sink": 0}


def test_a_relay_blocked_by_a_slow_sink_waits_on_output_and_stays_inside_its_budget():
    g = Graph(Clock("fast"))
    src, relay, sink = g.add(CountSource(N)), g.add(BudgetedAddOne("relay")), g.add(Collect(delay_s=SLOW_S))
    g.connect(src, relay, capacity=1)
    g.connect(relay, sink, capacity=1)
    s = g.run(timeout=30)["stages"]["relay"]
    assert s["work"]["p50_ms"] < 10, s["work"]
    assert 0.7 * SLOW_S * 1e3 < s["output_wait"]["p50_ms"] < 3 * SLOW_S * 1e3, s["output_wait"]
    assert s["deadline_misses"] == 0 and relay.levels == []


def test_a_fan_out_copy_waiting_on_its_ring_is_output_wait():
    # src's first consumer is quick; the copy for the second, slow one waits after process() returned
    g = Graph(Clock("fast"))
    src, quick, slow = g.add(CountSource(N)), g.add(Collect(name="quick")), g.add(Collect(name="slow", delay_s=SLOW_S))
    g.connect(src, quick, capacity=4)
    g.connect(src, slow, capacity=1)
    s = g.run(timeout=30)["stages"]["src"]
    assert s["work"]["p50_ms"] < 10, s["work"]
    assert 0.7 * SLOW_S * 1e3 < s["output_wait"]["p50_ms"] < 3 * SLOW_S * 1e3, s["output_wait"]


def test_a_fast_mode_source_waiting_for_a_flow_limiter_credit_is_output_wait():
    g = Graph(Clock("fast"))
    src = g.add(CountSource(N), max_in_flight=1)
    g.add(sink := Collect(delay_s=SLOW_S))
    g.connect(src, sink, capacity=4)  # room on the ring: only the credit holds the source back
    report = g.run(timeout=30)
    s = report["stages"]["src"]
    assert report["edges"][0]["depth"] == 0 and sink.values() == [float(i) for i in range(N)]
    assert s["work"]["p50_ms"] < 10, s["work"]
    assert 0.7 * SLOW_S * 1e3 < s["output_wait"]["p50_ms"] < 3 * SLOW_S * 1e3, s["output_wait"]


def test_a_pushed_source_waiting_for_its_client_reports_input_wait_not_work():
    g = Graph(Clock("realtime"))
    src = g.add(PushSource(PortSpec((4,)), name="pose"))
    g.add(sink := Collect())
    g.connect(src, sink, capacity=4)

    def client():  # a value every 50 ms, as a client's camera would send them
        for i in range(N):
            time.sleep(SLOW_S)
            src.push(torch.full((4,), float(i)))
        src.close()

    g.start()
    pusher = threading.Thread(target=client)
    pusher.start()
    pusher.join()
    s = g.join(timeout=30)["stages"]["pose"]
    assert sink.values() == [float(i) for i in range(N)]
    assert s["work"]["p50_ms"] < 10, s["work"]  # it used to read ≈ 50 ms: the time the client took
    assert 0.7 * SLOW_S * 1e3 < s["input_wait"]["p50_ms"] < 3 * SLOW_S * 1e3, s["input_wait"]
    assert s["output_wait"]["p50_ms"] < 10, s["output_wait"]


@pytest.mark.parametrize("n", [1, 2, 3, 17, 4096])
def test_latency_percentiles_are_numpys_linear_percentiles(n):
    import numpy as np

    from framegraph.stream.telemetry import LatencyWindow

    window = LatencyWindow()
    values = np.random.default_rng(n).exponential(20.0, size=n)
    for ms in values:
        window.add(float(ms))
    s = window.summary()
    assert [s["p50_ms"], s["p95_ms"], s["p99_ms"]] == pytest.approx(np.percentile(values, [50, 95, 99]), rel=1e-12)
