"""Gaussian scenes as stream stages, and `framegraph render --scene`."""
import json

import numpy as np
import pytest
import torch

from framegraph.apps.cli import main
from framegraph.assets import path as asset
from framegraph.renderers.cameras import look_at
from framegraph.renderers.gaussians import random_scene, rasterize, save_ply
from framegraph.renderers.stages import CameraSource, GaussianRenderStage, orbit_for_scene
from framegraph.stream import Graph, PortSpec, RecordingSink
from framegraph.stream.media import read_video


def test_render_stage_matches_rasterize_for_each_camera_of_a_path():
    scene = random_scene(200, 3, seed=3)
    path = orbit_for_scene(scene, 4, 64, 48, fps=10)
    g = Graph()
    cams = g.add(CameraSource(path, fps=10))
    r = g.add(GaussianRenderStage(scene, width=64, height=48))
    k = g.add(RecordingSink({"video": PortSpec((48, 64, 3), torch.uint8)}))
    g.connect(cams, r)
    g.connect(r, k)
    g.run(timeout=60)
    assert len(k.data()) == 4
    for i, img in enumerate(k.data()):
        view, K = path[i]
        ref, _, _ = rasterize(scene.means, scene.quats, scene.scales, scene.opacities, scene.sh, view[None].float(),
                              K[None], 64, 48, sh_degree=3)
        expect = (ref[0].clamp(0, 1) * 255 + 0.5).to(torch.uint8)
        assert torch.equal(img, expect)
    assert not torch.equal(k.data()[0], k.data()[2])  # the camera moved


def test_pushed_poses_use_the_newest():
    scene = random_scene(50, 0, seed=1)
    eye = torch.tensor([0.0, -3.0, 0.0])
    cams = CameraSource(initial_pose=look_at(eye, torch.zeros(3)).float(), fps=100, n_frames=3, width=32,
                        height=24)
    cams.push_pose(look_at(torch.tensor([3.0, 0.0, 0.0]), torch.zeros(3)))
    cams.push_pose(look_at(torch.tensor([0.0, 3.0, 0.0]), torch.zeros(3)))
    g = Graph()
    g.add(cams)
    r = g.add(GaussianRenderStage(scene, width=32, height=24))
    k = g.add(RecordingSink({"video": PortSpec((24, 32, 3), torch.uint8)}))
    g.connect(cams, r)
    g.connect(r, k)
    g.run(timeout=30)
    assert cams.poses_pushed == 2 and len(k.data()) == 3
    with pytest.raises(ValueError, match="finite 4x4"):
        cams.push_pose(torch.full((4, 4), float("nan")))


def test_render_scene_cli_orbit_writes_an_mp4(tmp_path):
    ply = tmp_path / "scene.ply"
    save_ply(random_scene(150, 1, seed=2), ply)
    out = tmp_path / "orbit.mp4"
    report = tmp_path / "r.json"
    assert main(["render", "--scene", str(ply), "--orbit", "--seconds", "0.5", "--fps", "8", "--size", "64x48",
                 "--out", str(out), "--report", str(report), "--device", "cpu"]) == 0
    v = read_video(out)
    assert v["frames"].shape == (4, 48, 64, 3) and v["audio"] is None
    assert v["frames"].max() > 50  # something was rendered
    assert json.loads(report.read_text())["sink_frames"] == 4


def test_render_scene_cli_bad_inputs(tmp_path, capsys):
    bad = tmp_path / "broken.ply"
    bad.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 10\nend_header\n\x00\x01")
    assert main(["render", "--scene", str(bad), "--out", str(tmp_path / "x.mp4"), "--size", "64x48"]) == 2
    assert "broken.ply" in capsys.readouterr().err
    path = tmp_path / "cams.json"
    path.write_text("{not json")
    ply = tmp_path / "ok.ply"
    save_ply(random_scene(20, 0), ply)
    assert main(["render", "--scene", str(ply), "--camera-path", str(path), "--out", str(tmp_path / "y.mp4"),
                 "--size", "64x48"]) == 2
    assert "cams.json" in capsys.readouterr().err
    assert main(["render", "--testcard", "--orbit", "--out", str(tmp_path / "z.mp4")]) == 2
    assert "go with --scene" in capsys.readouterr().err


def test_render_4dgs_checkpoint_cli(tmp_path, capsys):

    demo = asset("scenes4d", "bouncing_ball.pth")
    out = tmp_path / "ball.mp4"
    assert main(["render", "--scene", str(demo), "--seconds", "0.5", "--fps", "8", "--size", "48x32",
                 "--out", str(out), "--device", "cpu"]) == 0
    v = read_video(out)
    assert v["frames"].shape == (4, 32, 48, 3)
    assert not np.array_equal(v["frames"][0], v["frames"][3])  # the scene moves in time
    ply = tmp_path / "s.ply"
    save_ply(random_scene(10, 0), ply)
    assert main(["render", "--scene", str(ply), "--time-duration", "0", "1", "--out", str(tmp_path / "x.mp4"),
                 "--size", "48x32"]) == 2
    assert "goes with a 4DGS checkpoint" in capsys.readouterr().err


def test_render_nerf_directory_cli(tmp_path):

    demo = asset("nerf", "spheres")
    out = tmp_path / "nerf.mp4"
    assert main(["render", "--scene", str(demo), "--seconds", "0.25", "--fps", "8", "--size", "32x24",
                 "--out", str(out), "--device", "cpu"]) == 0
    v = read_video(out)
    assert v["frames"].shape == (2, 24, 32, 3) and v["frames"].max() > 50
    empty = tmp_path / "not_a_nerf"
    empty.mkdir()
    assert main(["render", "--scene", str(empty), "--out", str(tmp_path / "x.mp4"), "--size", "32x24"]) == 2
