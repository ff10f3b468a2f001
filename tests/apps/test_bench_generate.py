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
