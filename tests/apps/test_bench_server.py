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


def test_bench_server_cluster_small_run(tmp_path):
    """The cluster bench on a local Ray cluster: sessions held through the front door, glass-to-glass of
    the three paths (frames came back through each), the avatar bundle's load time seen on the replica."""
    out = tmp_path / "cluster.json"
    assert main(["bench", "server", "--cluster", "--replicas", "1", "--capacity", "1", "--ramp-seconds", "2",
                 "--rounds", "1", "--path-seconds", "3", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    [rep] = r["replicas"]
    assert rep["replicas"] == 1 and rep["deploy_to_all_reporting_s"] > 0 and len(rep["replica_start_s"]) == 1
    assert rep["steps"][0]["sessions"] == 1 and rep["steps"][0]["fps_min"] > 0
    assert set(r["paths"]) == {"plain_serve", "cluster_front_door", "serve_http_proxy"}
    for path in r["paths"].values():
        assert path["frames"] > 10 and 0 < path["p50_ms"] <= path["p95_ms"] < 2000
    assert r["bundle"]["bundles"] and r["bundle"]["bundles"][0]["load_s"] > 0 and not r["bundle"]["errors"]
    assert r["command"].startswith("framegraph bench server --cluster")
    assert (tmp_path / "cluster.png").stat().st_size > 1000
