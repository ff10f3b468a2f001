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
    m = r["memory"]
    assert m["ring_slots_reallocated"] is False
    assert m["python_live_blocks_growth_per_frame"] < 0.5  # no per-frame leak
    assert abs(m["rss_growth_percent"]) < 10
    assert (tmp_path / "runtime.png").stat().st_size > 1000
