"""`framegraph bench runtime` runs end to end and writes the JSON and PNG it promises."""
import json

from framegraph.apps.cli import main


def test_bench_runtime_quick_writes_json_and_png(tmp_path):
    out = tmp_path / "runtime.json"
    assert main(["bench", "runtime", "--out", str(out), "--quick", "--hops", "3"]) == 0
    r = json.loads(out.read_text())
    for key in ("device", "command", "versions", "git_commit", "date"):
        assert key in r
    assert r["hop_overhead"]["hops"] == 3 and r["hop_overhead"]["hop_latency_us"]["p50"] > 0
    o = r["overload"]
    assert o["frames_delivered"] < o["frames_generated"]  # the sink is 2x too slow: frames were dropped
    assert o["dropped_at_source"] > 0 and o["edge_drops"] == 0
    assert o["end_to_end_ms"]["p50_ms"] < 10 * o["bound_ms"]
    assert o["stages"]["relay0"]["p50_ms"] >= 5.0  # the relay's 5 ms sleep is its work
    b = r["backpressure"]["stages"]  # fast source → 5 ms relay → 20 ms sink, one-slot block rings
    assert b["source"]["p50_ms"] < 5 and b["source"]["input_wait_p50_ms"] is None
    assert 12 < b["source"]["output_wait_p50_ms"] < 60  # the source waits for the sink's pace: not its work
    assert 5 <= b["relay0"]["p50_ms"] < 15 and 7 < b["relay0"]["output_wait_p50_ms"] < 45
    assert 20 <= b["sink"]["p50_ms"] < 60 and b["sink"]["output_wait_p50_ms"] is None
    m = r["memory"]
    assert m["ring_slots_reallocated"] is False
    assert m["python_live_blocks_growth_per_frame"] < 0.5  # no per-frame leak
    assert abs(m["rss_growth_percent"]) < 10
    assert (tmp_path / "runtime.png").stat().st_size > 1000
