"""`framegraph bench server`: sessions against a real loopback server, RSS and soak latency in the JSON."""
import json
import subprocess
import sys

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


def test_bench_server_runs_without_the_cluster_and_webrtc_extras(tmp_path):
    """The GPU machine has neither Ray nor aiortc: the plain bench needs neither (it once failed importing Ray)."""
    out = tmp_path / "server.json"
    code = ("import sys\n"
            "for m in ('ray', 'aiortc'):\n"
            "    sys.modules[m] = None  # import ray -> ImportError, as where it is not installed\n"
            "from framegraph.apps.cli import main\n"
            f"sys.exit(main(['bench', 'server', '--out', {str(out)!r}, '--sessions', '2', '--session-seconds', '0.5',"
            " '--soak-seconds', '1']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text())["soak"]["fps"] > 0


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


def test_bench_server_transports_side_by_side_on_a_clean_and_an_impaired_link(tmp_path):
    """Both transports, each over a clean veth pair and behind loss and jitter: every figure the issue asks for
    is there and measured (frames came back, bytes crossed the link, the server used CPU)."""
    import pytest

    from framegraph.apps.bench.network import NamespaceUnavailable, namespace_link

    try:
        with namespace_link():
            pass
    except NamespaceUnavailable as exc:
        pytest.skip(f"no network namespace here: {exc}")
    out = tmp_path / "transport.json"
    assert main(["bench", "server", "--transport", "websocket,webrtc", "--pipelines", "testcard",
                 "--transport-seconds", "3", "--repeat", "2", "--impairment", "2,30,30", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["transport_comparison"] and set(r["conditions"]) == {"clean", "impaired"}
    for name, condition in r["conditions"].items():
        for transport in ("websocket", "webrtc"):
            m = condition["runs"]["testcard"][transport]
            assert m["frames"] > 30 and m["ended"] == "finished" and not m["errors"], m
            assert m["latency_kind"] == "source_to_glass_same_host" and 0 < m["latency_p50_ms"] <= m["latency_p95_ms"]
            assert m["first_frame_ms"] > 0 and m["server_cpu_percent"] > 0
            assert m["bytes_per_s"]["server_to_client"] > 10_000 > m["bytes_per_s"]["client_to_server"] > 0
            # behind 2 % loss a WebRTC handshake whose packets are lost retries for seconds (once 3.0 s to the first
            # of 5 frames in a 3-s session, CI 2026-12-04): there each session must get frames, the median 30
            least = 30 if name == "clean" else 0
            assert m["repeat"] == 2 and [s["frames"] > least for s in m["sessions"]] == [True, True], m["sessions"]
    assert set(r["targets"]["testcard"]) >= {"clean_p50_gap_ms", "impaired_webrtc_p95_better"}
    assert r["command"].startswith("framegraph bench server --transport")
    assert (tmp_path / "transport.png").stat().st_size > 1000


def test_a_cell_of_several_sessions_reports_their_medians_and_keeps_each():
    from framegraph.apps.bench.transport import combine

    def session(p50, p95, ended="finished"):
        return {"latency_kind": "glass_to_glass", "latency_p50_ms": p50, "latency_p95_ms": p95, "latency_count": 90,
                "first_frame_ms": p50 * 2, "frames": 240, "fps": 24.0, "target_fps": 25, "longest_stall_ms": p95,
                "server_cpu_percent": 12.0, "wall_s": 10.5, "bytes_per_s": {"server_to_client": p95 * 100,
                                                                              "client_to_server": 3000},
                "ended": ended, "errors": []}

    one = session(40, 90)
    assert combine([one]) is one
    cell = combine([session(40, 90), session(50, 300, "stalled"), session(45, 100)])
    assert (cell["latency_p50_ms"], cell["latency_p95_ms"], cell["first_frame_ms"]) == (45, 100, 90)
    assert cell["bytes_per_s"]["server_to_client"] == 10_000 and cell["repeat"] == 3 and len(cell["sessions"]) == 3
    assert cell["ended"] == "stalled"  # a session that did not finish is not hidden by the median
    assert cell["failed_sessions"] == 0
    assert combine([session(40, 90), session(45, 100) | {"frames": 0}])["failed_sessions"] == 1
