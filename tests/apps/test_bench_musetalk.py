"""`framegraph bench musetalk`: MuseTalk's audio context live against its offline 30-s pass, on a tiny random
Whisper of MuseTalk's layout and the astronaut's speech — the JSON a reader needs, the windows at their positions."""
import json

from helpers import tiny_musetalk_folder

from framegraph.apps.cli import main


def test_bench_musetalk_records_agreement_per_layer_cost_and_reach(astronaut_talking_clip, tmp_path):
    folder = tiny_musetalk_folder(tmp_path / "musetalk")
    out = tmp_path / "musetalk.json"
    assert main(["bench", "musetalk", "--audio", str(astronaut_talking_clip), "--whisper",
                 str(folder / "models/whisper"), "--contexts-ms", "400,800", "--repeats", "2", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "musetalk" and r["command"].startswith("framegraph bench musetalk")
    assert "--audio clip_00000.mp4 --whisper whisper " in r["command"]  # the inputs named, their folders not
    assert r["layers"] == 3 and [c["context_ms"] for c in r["context"]] == [400, 800]
    for c in r["context"]:
        assert len(c["cosine_per_layer"]) == 3 and c["window_ms_p50"] > 0
        assert c["cosine_per_layer"][0] > 0.99  # the embedding layer: each window's rows at their own positions
        assert 0 <= c["context_rel_error"] < 1 and c["reach_past_frame_ms"] == 80 + 80 + 80
    assert (tmp_path / "musetalk.png").stat().st_size > 0


def test_bench_musetalk_speed_records_each_part_of_a_frame_and_the_share_of_the_machine(tmp_path):
    folder = tiny_musetalk_folder(tmp_path / "musetalk")
    out = tmp_path / "speed.json"
    assert main(["bench", "musetalk", "--parts", "speed", "--musetalk", str(folder), "--batches", "1,2",
                 "--speed-repeats", "1", "--out", str(out)]) == 0
    s = json.loads(out.read_text())["speed"]
    assert s["models"] == "the user's files" and s["dtype"] == "float32" and s["device"] == "cpu"
    assert [b["batch"] for b in s["batches"]] == [1, 2]
    for b in s["batches"]:
        assert b["unet_ms_per_frame"] > 0 and b["decode_ms_per_frame"] > 0 and b["frames_per_s_models"] > 0
    one = s["batches"][0]
    assert s["end_to_end_ms_per_frame"] >= one["unet_ms_per_frame"] + one["decode_ms_per_frame"]
    assert s["gflop_per_frame"] > 0 and 0 < s["fraction_of_matmul_peak"] and s["first_frame_ms"] > 0
    assert (tmp_path / "speed.png").stat().st_size > 0


def test_bench_musetalk_onnx_times_the_step_on_torch_and_on_onnx_runtime_in_one_process(tmp_path):
    folder = tiny_musetalk_folder(tmp_path / "musetalk")
    out = tmp_path / "onnx.json"
    assert main(["bench", "musetalk", "--parts", "onnx", "--musetalk", str(folder), "--speed-repeats", "2",
                 "--out", str(out)]) == 0
    o = json.loads(out.read_text())["onnx"]
    assert o["models"] == "the user's files" and o["threads"] == 1 and o["batch"] == 1
    assert o["torch_ms_per_frame"] > 0 and o["onnx_ms_per_frame"] > 0 and o["export_s"] > 0
    assert abs(o["torch_over_onnx"] - o["torch_ms_per_frame"] / o["onnx_ms_per_frame"]) < 0.01
    assert o["max_pixel_difference"] <= 1  # the same faces, to a level of rounding
    assert (tmp_path / "onnx.png").stat().st_size > 0
