"""`framegraph bench avatar` runs end to end (--quick), writes consistent JSON + PNG, rejects bad sizes,
and `framegraph bench report` picks its JSON up."""
import json
import math

import pytest
import torch

from framegraph.apps.cli import main


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("bench_avatar") / "results" / "avatar.json"
    assert main(["bench", "avatar", "--quick", "--out", str(out)]) == 0
    return out, json.loads(out.read_text())


def _finite_positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_bench_avatar_quick_json_is_complete_and_consistent(quick_run):
    out, r = quick_run
    for key in ("device", "command", "versions", "git_commit", "date", "load_average_1_5_15min"):
        assert key in r
    assert r["benchmark"] == "avatar" and r["command"].startswith("framegraph bench avatar --quick")
    assert r["weights"].startswith("random, shipped architecture")
    assert "region" in r["size_meaning"] and r["audio"]["source"]
    assert r["targets"]["targets_apply"] is ("H100" in r["device"])
    if r["stage_device"] == "cpu":
        assert r["note"].startswith("CPU run")
    assert [row["name"] for row in r["sizes"]] == ["64", "shipped"]
    samples = r["audio"]["samples"]
    assert samples == round(r["audio"]["seconds"] * 16_000)
    for row in r["sizes"]:
        fps = r["model_class"]["settings"]["fps"]
        assert row["latent_size"] * 16 == row["region_size"]
        assert min(row["frame_size"]) >= row["region_size"]
        st = row["steady"]
        assert st["frames"] == st["expected_frames"] == math.ceil(samples * fps / 16_000)  # every frame, once
        assert _finite_positive(st["fps"]) and _finite_positive(st["wall_s"])
        assert st["edge_drops"] == 0 and st["denoiser_steps_used"] == {"2": st["frames"]}  # no fallback in fast mode
        stages = st["stages_host_ms"]
        assert set(stages) == {"audio_features", "state", "denoiser", "vae_decode", "composite"}
        for name in ("denoiser", "vae_decode", "composite", "state"):
            assert stages[name]["calls"] == st["frames"]
        assert stages["audio_features"]["calls"] == math.ceil(samples / 320)  # one call per 20 ms chunk
        for s in stages.values():
            assert _finite_positive(s["p50_ms"]) and s["p50_ms"] <= s["p99_ms"] <= s["max_ms"]
        t = row["ttff"]
        assert t["audio_needed_for_first_frame_ms"] == 80.0 and t["audio_wait_ms"] == 60.0
        assert t["frames_per_session"] == math.ceil(r["settings"]["ttff_seconds"] * fps)
        # live audio: the first frame cannot come before the audio it needs has been pushed
        assert t["cold"]["live_ms"] >= t["audio_wait_ms"]
        assert all(v >= t["audio_wait_ms"] for v in t["warm_live_ms"]["runs"])
        assert _finite_positive(t["warm_burst_ms"]["median"]) and _finite_positive(t["cold"]["start_ms"])
    sess = r["sessions"]
    assert sess["avatar"] == "64" and [run["sessions"] for run in sess["runs"]] == [2]
    for run in sess["runs"]:
        assert len(run["per_session"]) == run["sessions"]
        for p in run["per_session"]:
            assert 0 < p["frames"] <= p["expected_frames"] == math.ceil(run["audio_seconds"] * 25)
            assert _finite_positive(p["presented_fps"]) and p["presented_fps"] < 1.5 * run["target_fps"]
            assert p["ttff_ms"] >= r["sizes"][0]["ttff"]["audio_wait_ms"]
        assert run["fps_min"] == min(p["presented_fps"] for p in run["per_session"])
        fps = [p["presented_fps"] for p in run["per_session"]]
        assert run["fps_spread"] == pytest.approx((max(fps) - min(fps)) / max(fps))
    assert set(r["summary"]["sizes"]) == {"64", "shipped"}
    assert (out.parent / "avatar.png").stat().st_size > 1000


def test_bench_avatar_rejects_a_size_the_model_class_cannot_make(tmp_path, capsys):
    out = tmp_path / "x.json"
    assert main(["bench", "avatar", "--quick", "--sizes", "100", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "100 is not a multiple of 32" in err and "framegraph bench: error" in err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "avatar", "--quick", "--sizes", "64,abc", "--out", str(out)])
    assert exc.value.code == 2 and "argument --sizes: 'abc' is not a whole number" in capsys.readouterr().err
    assert main(["bench", "avatar", "--quick", "--avatar", str(tmp_path), "--out", str(out)]) == 2
    assert "avatar.json is missing" in capsys.readouterr().err
    assert not out.exists()


def test_bench_report_includes_the_avatar_bench(quick_run, tmp_path):
    from framegraph.apps.bench.report import kind_of

    out, r = quick_run
    assert kind_of(r) == "avatar"
    page_path = tmp_path / "report.html"
    assert main(["bench", "report", "--inputs", str(out.parent), "--out", str(page_path)]) == 0
    page = page_path.read_text()
    assert "avatar: avatar.json" in page
    assert page.count("data:image/png;base64,") == 1  # the avatar figure
    assert "sizes.64.steady_fps" in page  # the summary numbers
    if r["stage_device"] == "cpu":
        assert "CPU run" in page  # the note saying what the figures are
    assert (tmp_path / "report.png").stat().st_size > 1000


def test_bench_avatar_summary_compares_with_the_h100_targets_and_serializes():
    """Rows with a target (384², 512²) are too slow for a CPU test run: check the summary on made-up rows."""
    import numpy as np

    from framegraph.apps.bench.avatar import _summary
    from framegraph.stream.files import json_default

    def row(name, size, fps, live):
        return {"name": name, "region_size": size, "weights": "random, shipped architecture",
                "frame_size": [2 * size] * 2,
                "steady": {"fps": np.float64(fps)},
                "ttff": {"cold": {"live_ms": 300.0}, "warm_live_ms": {"median": np.float64(live)},
                         "warm_burst_ms": {"median": 20.0}}}

    result = {"sizes": [row("384", 384, 130.0, 90.0), row("512", 512, 50.0, 120.0)],
              "targets": {"targets_apply": True},
              "sessions": {"runs": [{"sessions": 4, "fps_min": np.float64(24.9), "all_keep_up": True}]}}
    s = json.loads(json.dumps(_summary(result), default=json_default))
    assert s["sizes"]["384"]["fps_target_h100"] == 120.0 and s["sizes"]["384"]["fps_target_met"] is True
    assert s["sizes"]["512"]["fps_target_met"] is False and s["sizes"]["512"]["ttff_target_met_warm_live"] is False
    assert s["sizes"]["384"]["ttff_target_met_warm_live"] is True
    assert s["four_sessions_target_met"] is True and s["sessions_fps_min"] == {"4": 24.9}


def test_bench_avatar_quick_both_backends_compares_them(tmp_path):
    pytest.importorskip("onnx")
    torch.set_num_threads(1)
    out = tmp_path / "avatar_backends.json"
    assert main(["bench", "avatar", "--quick", "--no-shipped", "--runtime", "torch,onnx", "--sessions", "1",
                 "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [(row["name"], row["backend"]) for row in r["sizes"]] == [("64 torch", "torch"), ("64 onnx", "onnx")]
    cmp_ = r["summary"]["backends"]["64"]
    assert _finite_positive(cmp_["fps_torch"]) and _finite_positive(cmp_["fps_onnx"])
    assert set(cmp_["stage_p50_speedup"]) >= {"denoiser", "vae_decode", "audio_features"}
    assert set(r["sessions_by_backend"]) == {"torch", "onnx"}
    assert r["sessions_by_backend"]["onnx"]["runs"][0]["per_session"][0]["frames"] > 0
    with pytest.raises(SystemExit) as refused:  # argparse's error: exit status 2
        main(["bench", "avatar", "--quick", "--runtime", "torch,tensorrt", "--out", str(out)])
    assert refused.value.code == 2


def test_a_run_cut_after_its_first_rows_leaves_them_on_disk(tmp_path, monkeypatch):
    """A GPU step's deadline cut the avatar bench during its compiled rows and left no JSON (H200, 2026-12-04).
    Each measured row is written at once: cut at the sessions (here by an interrupt), the rows are on disk."""
    from framegraph.apps.bench import avatar as bench

    def cut(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "_measure_sessions", cut)
    torch.set_num_threads(1)
    out = tmp_path / "avatar.json"
    assert main(["bench", "avatar", "--quick", "--no-shipped", "--out", str(out)]) == 130  # as at Ctrl-C
    r = json.loads(out.read_text())
    assert r["partial"] and [row["name"] for row in r["sizes"]] == ["64"]
    assert _finite_positive(r["sizes"][0]["steady"]["fps"]) and r["command"].startswith("framegraph bench avatar")
