"""``framegraph bench render`` on a tiny CPU scene: it runs both backends and writes complete JSON."""
import argparse
import json
import os

import torch

if not torch.cuda.is_available():  # agreed convention: interpreter on CPU-only machines
    os.environ.setdefault("TRITON_INTERPRET", "1")

from framegraph.apps import bench_render  # noqa: E402


def test_bench_render_quick_writes_json(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench_render.add_arguments(parser)
    out = tmp_path / "render.json"
    args = parser.parse_args(["--out", str(out), "--quick", "--device", "cpu", "--cameras", "2", "--gaussians", "60"])
    assert bench_render.run(args) == 0
    result = json.loads(out.read_text())
    for key in ("device", "command", "git_commit", "versions", "scene", "resolution", "results"):
        assert key in result
    assert result["resolution"] == [64, 48] and result["cameras"] == 2
    torch_entry = result["results"]["torch"]
    assert torch_entry["ms_per_frame_median"] > 0 and torch_entry["fps"] > 0
    assert torch_entry["speedup_vs_torch"] == 1.0
    triton_entry = result["results"]["triton"]
    if "skipped" not in triton_entry:
        assert triton_entry["interpreted"] is True
        assert triton_entry["psnr_vs_torch_db"] >= 45
    assert (tmp_path / "render.png").is_file()
    assert "ms/frame" in capsys.readouterr().out


def test_bench_render_loads_a_scene_file(tmp_path):
    from framegraph.renderers.gaussians import random_scene, save_ply

    save_ply(random_scene(50, 1, seed=2), tmp_path / "s.ply")
    parser = argparse.ArgumentParser()
    bench_render.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "r.json"), "--scene", str(tmp_path / "s.ply"),
                              "--backends", "torch", "--size", "32x24", "--iters", "1", "--warmup", "0",
                              "--device", "cpu"])
    assert bench_render.run(args) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["scene"]["gaussians"] == 50 and result["scene"]["sh_degree"] == 1
    assert set(result["results"]) == {"torch"}
