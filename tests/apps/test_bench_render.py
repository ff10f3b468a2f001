"""``framegraph bench render`` on tiny CPU scenes: 3DGS, 4DGS and NeRF sections, both backends, complete
JSON, refusal of scenes that do not fit, and the PNG."""
import argparse
import json

import pytest

from framegraph.apps.bench import render as bench_render
from framegraph.apps.commands.bench import render as render_front
from framegraph.renderers.gaussians4d import load_checkpoint


def _run(*argv):
    parser = argparse.ArgumentParser()
    render_front.add_arguments(parser)
    return bench_render.run(parser.parse_args([str(a) for a in argv]))


def _strict_json(path):
    def no_constants(name):
        raise AssertionError(f"{path}: {name} is not valid JSON")
    return json.loads(path.read_text(), parse_constant=no_constants)


def test_bench_render_quick_writes_json(tmp_path, capsys):
    out = tmp_path / "render.json"
    assert _run("--out", out, "--quick", "--device", "cpu", "--cameras", "2", "--gaussians", "60",
                "--sections", "3dgs") == 0
    result = _strict_json(out)
    for key in ("device", "command", "git_commit", "versions", "scene", "resolution", "results", "cases",
                "memory_method", "gsplat"):
        assert key in result
    # the top level keeps the first version's fields: the first 3DGS case
    assert result["resolution"] == [64, 48] and result["cameras"] == 2
    assert result["scene"]["gaussians"] == 60 and result["scene"]["sh_degree"] == 3
    torch_entry = result["results"]["torch"]
    assert torch_entry["ms_per_frame_median"] > 0 and torch_entry["fps"] > 0
    assert torch_entry["ms_per_frame_p90"] >= torch_entry["ms_per_frame_median"] > 0
    assert torch_entry["speedup_vs_torch"] == 1.0 and torch_entry["interpreted"] is False
    assert torch_entry["peak_memory_mib"] > 0 and torch_entry["render_memory_mib"] >= 0
    triton_entry = result["results"]["triton"]
    if "skipped" not in triton_entry:
        assert triton_entry["interpreted"] is True
        assert triton_entry["speedup_vs_torch"] is None  # an interpreted run is not a speed
        assert triton_entry["psnr_vs_torch_db"] >= 45
    assert [c["section"] for c in result["cases"]] == ["3dgs"]
    assert result["cases"][0]["results"] == result["results"]
    assert result["gsplat"]["available"] is False  # CPU: gsplat needs CUDA (or is not installed)
    assert (tmp_path / "render.png").is_file()
    assert "ms/frame" in capsys.readouterr().out

    from framegraph.apps.bench.report import build_report, kind_of

    assert kind_of(result) == "render"
    page, figures = build_report([str(out)])
    assert "render" in page and len(figures) == 1


def test_bench_render_4dgs_and_nerf_sections(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert _run("--out", out, "--quick", "--device", "cpu", "--sections", "4dgs,nerf") == 0
    result = _strict_json(out)
    assert [c["section"] for c in result["cases"]] == ["nerf", "4dgs"]  # the cheapest case first
    nerf, four = result["cases"]

    n4 = load_checkpoint(four["scene"]["source"]).n
    assert four["scene"]["source"].endswith("bouncing_ball.pth") and four["scene"]["gaussians"] == n4
    assert four["resolution"] == [32, 24]
    assert four["time"]["step_per_frame"] == pytest.approx(2.0 / 60)  # time advances per frame
    t = four["results"]["torch"]
    assert t["fps"] > 0 and t["interpreted"] is False and 0 < t["kept_gaussians_at_psnr_frame"] <= n4
    tr = four["results"]["triton"]
    if "skipped" not in tr:
        assert tr["interpreted"] is True and tr["psnr_vs_torch_db"] >= 45

    assert nerf["scene"]["source"].endswith("spheres") and nerf["resolution"] == [16, 16]
    assert nerf["results"]["torch"]["fps"] > 0 and nerf["results"]["torch"]["peak_memory_mib"] > 0
    assert "--interpreted-nerf" in nerf["results"]["triton"]["skipped"]  # minutes per frame interpreted
    # no 3DGS section: the top level shows the first case
    assert result["resolution"] == [16, 16] and "torch" in result["results"]
    assert (tmp_path / "r.png").is_file()
    printed = capsys.readouterr().out
    assert "4dgs bouncing_ball.pth 32x24" in printed and "nerf spheres 16x16" in printed


def test_bench_render_refuses_scenes_that_do_not_fit_before_allocating(tmp_path, monkeypatch):
    import framegraph.renderers.gaussians as g3
    import framegraph.renderers.gaussians4d as g4

    made = []
    real3, real4 = g3.random_scene, g4.random_scene_4d
    monkeypatch.setattr(g3, "random_scene", lambda n, *a, **k: made.append(("3d", n)) or real3(n, *a, **k))
    monkeypatch.setattr(g4, "random_scene_4d", lambda n, *a, **k: made.append(("4d", n)) or real4(n, *a, **k))
    out = tmp_path / "r.json"
    assert _run("--out", out, "--quick", "--device", "cpu", "--backends", "torch", "--gaussians", "40,1e6",
                "--scene4d", "none", "--gaussians4d", "2000000", "--available-mib", "20") == 0
    result = _strict_json(out)
    cases = {c["name"].split()[0] + (" big" if "1,000,000" in c["name"] else ""): c for c in result["cases"]}
    small, big, four, nerf = cases["3dgs"], cases["3dgs big"], cases["4dgs"], cases["nerf"]
    assert small["results"]["torch"]["fps"] > 0 and "refused" not in small
    for case, count in ((big, "1,000,000 Gaussians"), (four, "2,000,000 4D Gaussians")):
        assert case["results"] == {}
        assert count in case["refused"] and "MiB" in case["refused"] and "20.0 MiB is free" in case["refused"]
    assert "refused" in nerf and "--chunk-rays" in nerf["refused"]
    assert made == [("3d", 40)]  # the refused scenes were never built
    assert result["scene"]["gaussians"] == 40  # top level: the first 3DGS case that ran


def test_bench_render_loads_a_scene_file(tmp_path):
    from framegraph.renderers.gaussians import random_scene, save_ply

    save_ply(random_scene(50, 1, seed=2), tmp_path / "s.ply")
    assert _run("--out", tmp_path / "r.json", "--scene", tmp_path / "s.ply", "--backends", "torch",
                "--size", "32x24", "--iters", "1", "--warmup", "0", "--device", "cpu", "--sections", "3dgs") == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["scene"]["gaussians"] == 50 and result["scene"]["sh_degree"] == 1
    assert set(result["results"]) == {"torch"}
    assert len(result["cases"]) == 1 and result["cases"][0]["name"] == "3dgs s.ply 32x24"


def test_bench_render_rejects_bad_arguments():
    parser = argparse.ArgumentParser()
    render_front.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x.json", "--sections", "3dgs,voxels"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x.json", "--gaussians", "10,abc"])
    assert parser.parse_args(["--out", "x.json", "--gaussians", "1e5,3e6"]).gaussians == [100_000, 3_000_000]


def test_bench_render_profile_names_where_the_time_goes(tmp_path, capsys):
    """``--profile``: the torch reference's frame profiled; its ops' own host time adds up to at most the frame's,
    the top op is a real torch op, and the share of the listed ops sums to at most 1."""
    out = tmp_path / "render.json"
    assert _run("--out", out, "--quick", "--device", "cpu", "--gaussians", "200", "--sections", "3dgs",
                "--backends", "torch", "--profile") == 0
    p = _strict_json(out)["results"]["torch"]["profile"]
    assert p["calls"] == 3 and p["wall_ms"] > 0 and p["device_busy_share"] is None and p["device_ms"] == 0
    assert len(p["top"]) == 8 and all(r["name"].startswith("aten::") or "::" in r["name"] for r in p["top"][:3])
    assert sum(r["share"] for r in p["top"]) <= 1.0 + 1e-9
    assert 0 < sum(r["host_ms"] for r in p["top"]) <= 1.5 * p["wall_ms"]
    assert "profile:" in capsys.readouterr().out
