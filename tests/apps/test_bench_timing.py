"""The timing harness of ``bench kernels`` / ``bench render`` on the CPU, and ``benchmarks/gpu_run.sh --dry-run``:
every step of the GPU run parses (two calls of the last GPU slot were lost to script errors)."""
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from framegraph.apps.bench.timing import CaseTimeout, do_bench, measure_peaks, time_cap

REPO = Path(__file__).resolve().parents[2]


def test_do_bench_on_a_cpu_times_repetitions_for_the_budget():
    calls = []
    t = do_bench(lambda: calls.append(time.sleep(0.002)), "cpu", warmup_ms=5, rep_ms=20, keep_times=True)
    assert t["reps"] == len(t["times_ms"]) >= 3 and t["median_ms"] >= 2.0
    assert t["min_ms"] <= t["p20_ms"] <= t["median_ms"] <= t["p80_ms"] <= t["max_ms"]
    assert len(calls) >= t["reps"] + t["warmup_calls"] + 2 and "perf_counter" in t["method"]
    assert "times_ms" not in do_bench(lambda: None, "cpu", rep_ms=1)


def test_peaks_are_measured_where_the_run_is():
    peaks = measure_peaks("cpu", copy_mib=16, matmul_n=256)
    assert peaks["copy_tb_s"] > 0 and peaks["matmul_tflop_s"] > 0 and peaks["matmul_dtype"] == "float32"


def test_a_case_over_its_cap_stops_and_the_run_goes_on():
    started = time.perf_counter()
    with pytest.raises(CaseTimeout, match="slow case: over its 0.2 s cap"):
        with time_cap(0.2, "slow case"):
            while True:
                torch.zeros(8).add_(1)
    assert time.perf_counter() - started < 2
    with time_cap(1.0, "quick"):
        pass


def test_gpu_run_dry_run_parses_every_step(tmp_path):
    env = {**os.environ, "PYTHON": str(Path(os.sys.executable))}
    proc = subprocess.run(["bash", "benchmarks/gpu_run.sh", "--dry-run"], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=300)
    lines = proc.stdout.splitlines()
    steps = [line for line in lines if line.startswith(("ok   ", "FAIL")) and "(cap" in line or "no such step" in line]
    assert len(steps) >= 12 and all(line.startswith("ok") for line in steps), proc.stdout + proc.stderr
    assert any(line.startswith("upload:") for line in lines)
    # wheels and gsplat's source live in the ignored .whl/ (`gpu_run.sh --prepare`): present or named as missing
    for line in lines:
        if line.startswith("FAIL"):
            assert "--prepare" in line or "upload over" in line, line
    bad = subprocess.run(["bash", "benchmarks/gpu_run.sh", "--dry-run", "nonsense"], cwd=REPO, capture_output=True,
                         text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "FAIL nonsense: no such step" in bad.stdout


def test_gpu_run_refuses_what_is_not_a_budget_and_explains_itself(tmp_path):
    """``--help`` (or a typo) once started a GPU run here: it installed into /tmp and stopped on the missing wheels.
    Anything but SECONDS, --dry-run or --prepare is refused before anything runs."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "RESULTS": str(tmp_path / "results")}
    for arg in ("--hlep", "0", "9x"):
        proc = subprocess.run(["bash", "benchmarks/gpu_run.sh", arg], cwd=REPO, capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 2 and f"got '{arg}'" in proc.stderr and "expected SECONDS" in proc.stderr
        assert not out.exists() and not (tmp_path / "results").exists()
    usage = subprocess.run(["bash", "benchmarks/gpu_run.sh", "--help"], cwd=REPO, capture_output=True, text=True,
                           env=env, timeout=60)
    assert usage.returncode == 0 and "--dry-run" in usage.stdout and "scene_avatar" in usage.stdout
    assert not out.exists()
