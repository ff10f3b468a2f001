"""`framegraph bench server`: sessions against a real loopback server, RSS and soak latency in the JSON."""
import json

from framegraph.apps.cli import main


def test_bench_server_small_run(tmp_path):
    out = tmp_path / "server.json"
    assert main(["bench", "server", "--out", str(out), "--sessions", "3", "--session-seconds", "0.5",
                 "--soak-seconds", "2"]) == 0
    r = json.loads(out.read_text())
    s, k = r["sessions"], r["soak"]
    assert s["sessions"] == 3 and len(s["rss_mib"]) == 3 and s["framegraph_threads_left"] == 0
    assert k["per_bin"] and k["fps"] > 0 and k["glass_to_glass"]["p50_ms"] < 1000
    assert r["device"] and r["command"].startswith("framegraph bench server")
    assert (tmp_path / "server.png").stat().st_size > 1000
