"""`framegraph fit` from the command line: camera files users have, clear errors, resume, the shipped demo."""
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from framegraph.apps.cli import main
from framegraph.assets import path as asset
from framegraph.renderers.cameras import OPENGL_TO_OPENCV
from framegraph.renderers.fit import load_transforms, synthetic_dataset
from framegraph.renderers.gaussians import load_ply, rasterize
from framegraph.renderers.stages import orbit_for_scene
from framegraph.stream.quality import psnr

W, H = 32, 24
DEMO = asset("scenes", "toy.ply")


@pytest.fixture(scope="module")
def views():
    return synthetic_dataset("toy", 6, W, H, seed=0)


def _write_dataset(root: Path, views, **top) -> Path:
    """A nerfstudio-style dataset: images/frame_i.png + transforms.json (OpenGL camera-to-world)."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    frames = []
    for i in range(len(views)):
        name = f"images/frame_{i:03d}.png"
        Image.fromarray((views.images[i] * 255 + 0.5).byte().numpy()).save(root / name)
        c2w_gl = torch.linalg.inv(views.viewmats[i].double()) @ OPENGL_TO_OPENCV
        frames.append({"file_path": name, "transform_matrix": c2w_gl.tolist()})
    K = views.Ks[0]
    doc = {"w": W, "h": H, "fl_x": float(K[0, 0]), "fl_y": float(K[1, 1]), "cx": float(K[0, 2]),
           "cy": float(K[1, 2]), "frames": frames, **top}
    (root / "transforms.json").write_text(json.dumps(doc))
    return root / "transforms.json"


def _run(capsys, *argv):
    rc = main(["fit"] + [str(a) for a in argv] + ["--no-progress"])
    return rc, capsys.readouterr().err


def test_transforms_json_round_trips_cameras_and_images(tmp_path, views):
    path = _write_dataset(tmp_path, views)
    data = load_transforms(path, tmp_path)
    assert len(data) == 6 and (data.width, data.height) == (W, H)
    assert torch.allclose(data.viewmats, views.viewmats, atol=1e-5)
    assert torch.allclose(data.Ks, views.Ks)
    assert float((data.images - views.images).abs().max()) <= 0.5 / 255 + 1e-6
    small = load_transforms(path, tmp_path, downscale=2)
    assert small.images.shape == (6, H // 2, W // 2, 3) and torch.allclose(small.Ks[:, :2], views.Ks[:, :2] / 2)
    train, held = data.split(4)
    assert held.names == ["images/frame_000.png", "images/frame_004.png"] and len(train) == 4


def test_fit_from_images_writes_scene_and_report(tmp_path, capsys, views):
    _write_dataset(tmp_path / "data", views)
    out = tmp_path / "out" / "scene.ply"
    rc, err = _run(capsys, "--images", tmp_path / "data", "--out", out, "--steps", 12,
                   "--init-points", 100, "--held-out-every", 3, "--sh-degree", 1, "--device", "cpu")
    assert rc == 0, err
    assert "held-out PSNR" in err
    assert load_ply(out).n > 0
    report = json.loads((tmp_path / "out" / "scene.report.json").read_text())
    assert report["steps"] == 12 and report["held_out"]["n_views"] == 2 and report["train_views"] == 4
    assert report["held_out"]["psnr"] > 5


def test_synthetic_fit_resumes_where_it_stopped(tmp_path, capsys):
    out = tmp_path / "toy.ply"
    common = ["--synthetic", "toy", "--out", out, "--size", "32x24", "--views", 8, "--init-points", 100,
              "--sh-degree", 1]
    rc, err = _run(capsys, *common, "--steps", 10)
    assert rc == 0, err
    rc, err = _run(capsys, *common, "--steps", 16, "--resume")
    assert rc == 0, err
    assert "resuming" in err and "at step 10" in err
    assert json.loads((tmp_path / "toy.report.json").read_text())["steps"] == 16
    assert json.loads((tmp_path / "toy.fit.json").read_text())["step"] == 16


@pytest.mark.parametrize("problem", ["missing_image", "wrong_size", "bad_json", "no_matrix", "no_focal"])
def test_bad_inputs_name_the_file_and_the_problem(tmp_path, capsys, views, problem):
    cams = _write_dataset(tmp_path, views)
    doc = json.loads(cams.read_text())
    expect = []
    if problem == "missing_image":  # one missing is skipped with a warning; all but one is too few
        for i in range(1, 6):
            (tmp_path / "images" / f"frame_{i:03d}.png").unlink()
        expect = ["only 1 of 6 frames have their image", "frame_001.png", "need at least 2", str(cams)]
    elif problem == "wrong_size":
        Image.new("RGB", (W + 2, H)).save(tmp_path / "images" / "frame_003.png")
        expect = ["frame_003.png", f"{W + 2}x{H}", f"w={W}, h={H}"]
    elif problem == "bad_json":
        cams.write_text(cams.read_text()[:-20])
        expect = [str(cams), "not valid JSON"]
    elif problem == "no_matrix":
        del doc["frames"][1]["transform_matrix"]
        cams.write_text(json.dumps(doc))
        expect = [str(cams), "frames[1].transform_matrix"]
    elif problem == "no_focal":
        del doc["fl_x"], doc["fl_y"]
        cams.write_text(json.dumps(doc))
        expect = [str(cams), "fl_x"]
    rc, err = _run(capsys, "--images", tmp_path, "--cameras", cams, "--out", tmp_path / "o.ply",
                   "--steps", 1)
    assert rc == 2
    assert err.startswith("framegraph fit: error:")
    for e in expect:
        assert e in err, (e, err)


def test_argument_errors(tmp_path, capsys):
    rc, err = _run(capsys, "--images", tmp_path, "--out", tmp_path / "o.ply")
    assert rc == 2 and "no transforms.json" in err
    rc, err = _run(capsys, "--synthetic", "toy", "--out", tmp_path / "o.splat")
    assert rc == 2 and "expected a .ply" in err
    rc, err = _run(capsys, "--synthetic", "nope", "--out", tmp_path / "o.ply")
    assert rc == 2 and "unknown procedural scene 'nope'" in err
    rc, err = _run(capsys, "--synthetic", "toy", "--size", "32x24", "--views", 4, "--out",
                   tmp_path / "o.ply", "--resume")
    assert rc == 2 and "no fit checkpoint" in err


@pytest.mark.skipif(not DEMO.is_file(), reason="the demo scene is not shipped in this checkout")
def test_shipped_demo_scene_loads_and_renders_the_toy_scene():
    from framegraph.renderers.scenes import procedural_scene

    scene = load_ply(DEMO)
    assert 1000 <= scene.n <= 20000 and scene.sh_degree >= 1
    assert DEMO.stat().st_size <= 5 * 2**20
    path = orbit_for_scene(scene, 3, 64, 48, fps=10)
    colors, alphas, _ = rasterize(scene.means, scene.quats, scene.scales, scene.opacities, scene.sh,
                                  path.viewmats, path.Ks, 64, 48, sh_degree=scene.sh_degree)
    for c in range(3):
        assert float(alphas[c].mean()) > 0.3 and float(colors[c].std()) > 0.1  # content, not blank
    # Against the ground truth it was fitted to, from a view it was never trained on.
    toy = procedural_scene("toy")
    view = toy.views(4, 128, 96, seed=1, offset=0.5)
    truth, _ = toy.render(view.viewmats[:1], view.Ks[:1], 128, 96)
    render, _, _ = rasterize(scene.means, scene.quats, scene.scales, scene.opacities, scene.sh,
                             view.viewmats[:1], view.Ks[:1], 128, 96, sh_degree=scene.sh_degree)
    assert psnr(render, truth) > 22.0
