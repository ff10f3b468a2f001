"""The command-line runner: a long run says how long it will take, and how to make it faster."""
import time

from helpers import Collect

from framegraph.stream import Clock, CountSource, Graph
from framegraph.stream.progress import run_with_progress


def slow_graph(n: int, seconds_per_frame: float):
    g = Graph(Clock("fast"))
    s, k = g.add(CountSource(n)), g.add(Collect(delay_s=seconds_per_frame))
    g.connect(s, k)
    return g, k


def test_a_long_run_prints_its_estimated_total_and_the_hint(capsys):
    g, k = slow_graph(30, 0.1)  # about 3 s
    report = run_with_progress(g, k, 30, desc="t", slow_hint="use a smaller --size", slow_s=2.0,
                               estimate_from_s=1.0)
    assert report["sink_frames"] == 30 and not report["interrupted"]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "estimated total" in ln]
    assert len(lines) == 1, lines  # once
    seconds = float(lines[0].split("estimated total: ")[1].split(" s ")[0])
    assert 2.0 <= seconds <= 9.0, lines  # the pace measured, not a constant
    assert "for 30 frames" in lines[0] and lines[0].endswith("use a smaller --size")


def test_a_short_run_says_nothing_about_time(capsys):
    g, k = slow_graph(10, 0.01)
    run_with_progress(g, k, 10, desc="t", slow_hint="use a smaller --size")
    assert "estimated total" not in capsys.readouterr().err


class SlowsDown(Collect):
    """A sink whose first ``fast`` frames take ``fast_s`` each, the rest ``slow_s``: a render whose first frames
    were waiting in the rings."""

    def __init__(self, fast: int, fast_s: float, slow_s: float):
        super().__init__()
        self.fast, self.fast_s, self.slow_s, self.n = fast, fast_s, slow_s, 0

    def process(self, inputs, out):
        self.n += 1
        time.sleep(self.fast_s if self.n <= self.fast else self.slow_s)
        super().process(inputs, out)


def test_the_estimate_follows_the_pace_measured_when_it_changes(capsys):
    g = Graph(Clock("fast"))
    k = SlowsDown(fast=60, fast_s=0.01, slow_s=0.08)
    g.connect(g.add(CountSource(120)), g.add(k))
    t0 = time.monotonic()
    run_with_progress(g, k, 120, desc="t", estimate_from_s=0.5)
    took = time.monotonic() - t0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "total: " in ln]
    assert lines and "estimated total" in lines[0], lines
    last = float(lines[-1].split("total: ")[1].split(" s ")[0])
    assert abs(last - took) <= 0.35 * took, (lines, took)  # the last one said is near what it took
