"""``framegraph bench kernels`` runs on CPU with tiny shapes and writes the documented JSON + PNG."""
import argparse
import json

from framegraph.apps.bench import kernels as bench_kernels
from framegraph.apps.commands.bench import kernels as kernels_front


def test_bench_kernels_writes_json_and_plot_on_cpu(tmp_path):
    parser = argparse.ArgumentParser()
    kernels_front.add_arguments(parser)
    out = tmp_path / "kernels.json"
    args = parser.parse_args(["--out", str(out), "--tiny", "--iters", "2", "--warmup", "1", "--backward"])
    assert bench_kernels.run(args) == 0

    report = json.loads(out.read_text())
    for key in ("device", "torch", "triton", "command", "git_commit", "dtype", "timer", "peak", "results"):
        assert key in report
    assert out.with_suffix(".png").stat().st_size > 0
    assert {r["op"] for r in report["results"]} == set(kernels_front.OPS)
    for r in report["results"]:
        for key in ("shapes", "median_ms", "peers_ms", "speedup_vs_peer", "achieved_tb_s", "achieved_tflop_s",
                    "fraction_of_peak_bandwidth", "fraction_of_peak_flops"):
            assert key in r
        assert r["median_ms"] > 0 and r["peers_ms"]
