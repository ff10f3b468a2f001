"""The command-line runner: a long run says how long it will take, and how to make it faster."""
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
