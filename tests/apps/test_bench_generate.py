"""``framegraph bench generate`` on the tiny configurations: the JSON records the end-to-end FPS, the first
frame, every stage's p50/p99 and the peak memory of a real run, with its PNG beside it."""
import json

import pytest

from framegraph.apps.cli import main


@pytest.mark.parametrize("family", ["wan", "sana"])
def test_bench_generate_writes_fps_first_frame_and_stage_times(tmp_path, family):
    out = tmp_path / "generate.json"
    assert main(["bench", "generate", "--family", family, "--config", "tiny", "--size", "32x48", "--steps", "2",
                 "--chunk-frames", "1", "--chunks", "3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "generate" and data["command"].startswith("framegraph bench generate")
    assert data["video_frames"] == 1 + 4 * 2  # 3 one-frame chunks: 1 + 4 + 4 frames
    assert data["fps_end_to_end"] > 0 and 0 < data["time_to_first_frame_s"] < 60
    assert set(data["stages"]) == {"noise", "denoiser", "vae_decode", "encode", "sink"}
    assert data["stages"]["denoiser"]["calls"] == 3 and data["stages"]["denoiser"]["p50_ms"] > 0
    assert data["stages"]["noise"]["input_wait_p50_ms"] is None and data["stages"]["sink"]["output_wait_p50_ms"] is None
    assert data["stages"]["denoiser"]["output_wait_p50_ms"] >= 0 and data["stages"]["encode"]["input_wait_total_s"] > 0
    assert data["peak_memory_mib"] > 0 and data["cache_bytes"] > 0
    assert (tmp_path / "generate.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="not a sana configuration"):
        from framegraph.apps.bench.generate import build_model
        build_model("sana", "1.3b", "cpu", None)


def test_bench_generate_compares_the_vae_decoder_on_torch_and_onnx_in_one_run(tmp_path):
    pytest.importorskip("onnx")
    out = tmp_path / "vae.json"
    assert main(["bench", "generate", "--family", "wan", "--config", "tiny", "--size", "32x48", "--steps", "1",
                 "--chunk-frames", "1", "--chunks", "3", "--threads", "1", "--runtime", "torch,onnx",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert list(data["backends"]) == ["torch", "onnx"] and "--runtime torch,onnx" in data["command"]
    for name, run in data["backends"].items():
        assert run["vae_backend"] == name and run["video_frames"] == 1 + 4 * 2
        assert run["stages"]["vae_decode"]["calls"] == 3 and data["vae_decode_p50_ms"][name] > 0
        assert data["fps_end_to_end"][name] == run["fps_end_to_end"] > 0
    assert data["backends"]["onnx"]["export_s"] > 0 and "export_s" not in data["backends"]["torch"]
    assert (tmp_path / "vae.png").stat().st_size > 1000


def test_bench_generate_runs_sessions_at_once_batched_and_alone(tmp_path):
    out = tmp_path / "sessions.json"
    assert main(["bench", "generate", "--family", "wan", "--config", "tiny", "--size", "32x48", "--steps", "2",
                 "--chunk-frames", "1", "--chunks", "4", "--sessions", "1,2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {(r["sessions"], r["batching"]): r for r in data["sessions"]}
    assert set(rows) == {(1, "on"), (2, "on"), (1, "off"), (2, "off")}
    for r in rows.values():
        assert len(r["fps_per_session"]) == r["sessions"] and all(f > 0 for f in r["fps_per_session"])
        assert r["slowest_fps"] == min(r["fps_per_session"]) and r["aggregate_fps"] >= r["slowest_fps"]
    batched = rows[2, "on"]["lane_batches"]
    assert sum(int(b) * n for b, n in batched.items()) == 2 * (4 + 1)  # every chunk (and each warm-up's) ran there
    assert rows[2, "off"]["lane_batches"] is None
    assert (tmp_path / "sessions.png").stat().st_size > 1000
