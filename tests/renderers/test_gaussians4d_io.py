"""4DGS checkpoints (fudan-zvg layout), the shipped demo scene, and the render stage in a graph."""
import json
import math

import pytest
import torch
from helpers import CollectFrames

from framegraph.assets import path as asset
from framegraph.renderers.cameras import CameraPath, intrinsics, look_at
from framegraph.renderers.gaussians import reference as ref3d
from framegraph.renderers.gaussians4d import (
    CheckpointError,
    Gaussian4DRenderStage,
    load_checkpoint,
    random_scene_4d,
    rasterize_4d,
    save_checkpoint,
    scene_time,
)
from framegraph.renderers.gaussians4d import reference as ref
from framegraph.renderers.gaussians4d.demo import main as demo_main
from framegraph.renderers.gaussians4d.io import CAPTURE_FIELDS
from framegraph.renderers.stages import CameraSource
from framegraph.stream import Clock, Graph

ASSET = asset("scenes4d", "bouncing_ball.pth")
W, H = 64, 48


def _their_capture(n=30, *, rot_4d=True, features=48, active_deg=3, active_deg_t=1, seed=0):
    """A checkpoint laid out as fudan-zvg's ``GaussianModel.capture()`` (gaussian_dim=4) builds it."""
    g = torch.Generator().manual_seed(seed)
    P = torch.nn.Parameter
    feats = torch.randn(n, features, 3, generator=g) * 0.3
    params = {
        "xyz": P(torch.randn(n, 3, generator=g)), "f_dc": P(feats[:, :1].clone()), "f_rest": P(feats[:, 1:].clone()),
        "opacity": P(torch.randn(n, 1, generator=g)), "scaling": P(torch.rand(n, 3, generator=g) * 2 - 4),
        "rotation": P(torch.randn(n, 4, generator=g)), "t": P(torch.rand(n, 1, generator=g) * 10),
        "scaling_t": P(torch.rand(n, 1, generator=g) - 1),
    }
    if rot_4d:
        params["rotation_r"] = P(torch.randn(n, 4, generator=g))
    groups = [{"params": [p], "lr": 0.001, "name": k} for k, p in params.items()]
    optimizer = torch.optim.Adam(groups, lr=0.0, eps=1e-15)
    capture = (active_deg, params["xyz"], params["f_dc"], params["f_rest"], params["scaling"], params["rotation"],
               params["opacity"], torch.zeros(n), torch.zeros(n, 1), torch.zeros(n, 1), torch.zeros(n, 1),
               optimizer.state_dict(), 2.5, params["t"], params["scaling_t"],
               params.get("rotation_r", torch.empty(0)), rot_4d, None, active_deg_t)
    return capture, params


# ----------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------
def test_checkpoint_round_trip_in_fudan_layout(tmp_path):
    scene = random_scene_4d(200, 3, 1, seed=1, time_duration=(0.0, 10.0))
    path = save_checkpoint(scene, tmp_path / "chkpnt7000.pth", iteration=7000)

    capture, iteration = torch.load(path, weights_only=False)  # what their restore() unpacks
    assert iteration == 7000 and len(capture) == len(CAPTURE_FIELDS) == 19
    fields = dict(zip(CAPTURE_FIELDS, capture))
    assert fields["_features_dc"].shape == (200, 1, 3) and fields["_features_rest"].shape == (200, 31, 3)
    assert fields["_t"].shape == (200, 1) and fields["_rotation_r"].shape == (200, 4)
    assert fields["rot_4d"] is True and fields["active_sh_degree_t"] == 1 and fields["active_sh_degree"] == 3
    assert [gr["name"] for gr in fields["optimizer_state"]["param_groups"]] == [
        "xyz", "f_dc", "f_rest", "opacity", "scaling", "rotation", "t", "scaling_t", "rotation_r"]
    assert json.loads(path.with_suffix(".json").read_text())["time_duration"] == [0.0, 10.0]

    back = load_checkpoint(path)
    assert back.time_duration == (0.0, 10.0) and back.sh_degree == 3 and back.sh_degree_t == 1
    for name in ("means", "times", "scales", "quats_l", "quats_r", "opacities", "sh"):
        assert torch.allclose(getattr(back, name), getattr(scene, name), atol=1e-6, rtol=1e-5), name
    assert load_checkpoint(path, time_duration=(2, 4)).time_duration == (2.0, 4.0)  # explicit wins


def test_their_checkpoint_loads_with_their_activations(tmp_path):
    capture, p = _their_capture(30, features=48, active_deg=3, active_deg_t=1)
    path = tmp_path / "chkpnt_best.pth"
    torch.save((capture, 30000), path)
    scene = load_checkpoint(path, time_duration=[0, 10])
    assert scene.time_duration == (0.0, 10.0) and scene.n == 30
    assert torch.allclose(scene.scales, torch.exp(torch.cat([p["scaling"], p["scaling_t"]], 1)).detach())
    assert torch.allclose(scene.opacities, torch.sigmoid(p["opacity"][:, 0]).detach())
    assert torch.allclose(scene.quats_l, torch.nn.functional.normalize(p["rotation"].detach(), dim=-1))
    assert torch.allclose(scene.quats_r, torch.nn.functional.normalize(p["rotation_r"].detach(), dim=-1))
    assert torch.equal(scene.times, p["t"].detach()[:, 0])
    # active temporal degree 1 of a degree-2 layout: blocks 0 and 1 of 16 coefficients
    feats = torch.cat([p["f_dc"], p["f_rest"]], 1).detach()
    assert scene.sh_degree == 3 and scene.sh_degree_t == 1 and torch.equal(scene.sh, feats[:, :32])
    # no sidecar, no time_duration: their default
    assert load_checkpoint(path).time_duration == (-0.5, 0.5)


def test_rot_4d_false_checkpoint_is_a_static_gaussian_with_their_temporal_variance(tmp_path):
    capture, p = _their_capture(20, rot_4d=False, features=16, active_deg=3, active_deg_t=0)
    path = tmp_path / "chkpnt_3drot.pth"
    torch.save((capture, 100), path)
    s = load_checkpoint(path, time_duration=(0, 10))
    t = 4.0
    means3d, covars, opac_t, _ = ref.slice_gaussians(s.means, s.times, s.scales, s.quats_l, s.quats_r, s.opacities, t)
    R3 = ref3d.quat_to_rotmat(p["rotation"].detach())
    expect_cov = R3 @ torch.diag_embed(torch.exp(p["scaling"].detach()) ** 2) @ R3.transpose(1, 2)
    var_t = torch.exp(p["scaling_t"].detach()[:, 0])  # their renderer: exp(_scaling_t) is the variance
    marginal = torch.exp(-0.5 * (p["t"].detach()[:, 0] - t) ** 2 / var_t)
    expect_opac = torch.sigmoid(p["opacity"].detach()[:, 0]) * marginal
    assert torch.allclose(means3d, p["xyz"].detach(), atol=1e-5)
    assert torch.allclose(ref.covar6_to_mat(covars), expect_cov, atol=1e-6, rtol=1e-4)
    assert torch.allclose(opac_t, expect_opac, atol=1e-6)
    assert s.sh_degree == 3 and s.sh_degree_t == 0


def _bad(tmp_path, name, obj):
    path = tmp_path / name
    torch.save(obj, path)
    return path


def _with(capture, **changes):
    fields = dict(zip(CAPTURE_FIELDS, capture))
    fields.update(changes)
    return tuple(fields.values())


@pytest.mark.parametrize("make, message", [
    (lambda d, c: d / "missing.pth", "no such file"),
    (lambda d, c: (d / "garbage.pth").write_bytes(b"\x00not a zip") and d / "garbage.pth",
     "not a readable torch checkpoint"),
    (lambda d, c: _bad(d, "dict.pth", {"xyz": torch.zeros(3)}), r"expected \(model_params, iteration\).*got a dict"),
    (lambda d, c: _bad(d, "params_dict.pth", ({"xyz": 1}, 5)), "model_params is a dict"),
    (lambda d, c: _bad(d, "3d.pth", (c[:10] + (c[11], c[12]), 5)), "3D Gaussian checkpoint"),
    (lambda d, c: _bad(d, "short.pth", (c[:15], 5)), "model_params has 15 fields"),
    (lambda d, c: _bad(d, "nan.pth", (_with(c, _xyz=c[1].detach().index_fill(0, torch.tensor([2]), float("nan"))), 5)),
     r"field 1 \(_xyz\) contains 3 NaN"),
    (lambda d, c: _bad(d, "inf.pth", (_with(c, _scaling_t=torch.full((30, 1), float("inf"))), 5)),
     r"field 14 \(_scaling_t\) contains 30 NaN or Inf"),
    (lambda d, c: _bad(d, "shape.pth", (_with(c, _features_dc=torch.zeros(30, 3)), 5)),
     r"field 2 \(_features_dc\) should have shape \[30, 1, 3\], got \[30, 3\]"),
    (lambda d, c: _bad(d, "type.pth", (_with(c, _scaling=[[0.0] * 3] * 30), 5)),
     r"field 4 \(_scaling\) should be a tensor \[30, 3\], got list"),
    (lambda d, c: _bad(d, "deg.pth", (_with(c, active_sh_degree=7), 5)),
     r"field 0 \(active_sh_degree\) should be an int"),
    (lambda d, c: _bad(d, "rot.pth", (_with(c, _rotation_r=torch.zeros(30, 4)), 5)), "zero-norm quaternions"),
])
def test_bad_checkpoints_name_the_file_and_the_problem(tmp_path, make, message):
    capture, _ = _their_capture(30)
    path = make(tmp_path, capture)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_bad_sidecar_names_the_sidecar(tmp_path):
    path = save_checkpoint(random_scene_4d(5, 0, 0), tmp_path / "s.pth")
    path.with_suffix(".json").write_text('{"time_duration": "soon"}')
    with pytest.raises(CheckpointError, match=r"s\.json.*time_duration"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------
# The shipped demo scene
# ----------------------------------------------------------------------------
def _fixed_camera(width=W, height=H):
    return look_at((3.0, -3.0, 2.0), (0.0, 0.0, 0.4)), intrinsics(width, height, fov_deg=50)


def test_demo_scene_is_small_and_its_command_regenerates_it_deterministically(tmp_path):
    assert ASSET.is_file() and ASSET.stat().st_size <= 3 * 2**20
    provenance = (ASSET.parent / "PROVENANCE.md").read_text()
    assert "python -m framegraph.renderers.gaussians4d.demo --out assets/scenes4d/bouncing_ball.pth" in provenance
    shipped = load_checkpoint(ASSET)
    report = json.loads(ASSET.with_suffix(".report.json").read_text())
    assert shipped.time_duration == (0.0, 2.0) and shipped.n == report["n_gaussians"]
    assert f"{report['held_out']['psnr']:.2f} dB" in provenance  # the PSNR recorded is the run's
    # the same command at a tiny size, twice: identical tensors (the fit is deterministic for a seed)
    tiny = ["--steps", "12", "--frames", "2", "--cameras", "2", "--size", "24x18", "--points-per-frame", "40",
            "--no-progress"]
    scenes = []
    for name in ("a.pth", "b.pth"):
        assert demo_main(["--out", str(tmp_path / name)] + tiny) == 0
        scenes.append(load_checkpoint(tmp_path / name))
        assert json.loads((tmp_path / name).with_suffix(".report.json").read_text())["steps"] == 12
    assert scenes[0].time_duration == (0.0, 2.0) and scenes[0].n > 0
    for name in ("means", "times", "scales", "quats_l", "quats_r", "opacities", "sh"):
        assert torch.equal(getattr(scenes[0], name), getattr(scenes[1], name)), name


def test_demo_scene_renders_different_frames_at_different_times():
    scene = load_checkpoint(ASSET)
    view, K = _fixed_camera()
    frames = []
    for t in (0.25, 0.75, 1.3):
        img, alpha, meta = rasterize_4d(**scene.rasterize_args(), t=t, viewmats=view[None], Ks=K[None], width=W,
                                        height=H)
        assert 0 < meta["ids"].numel() < scene.n  # the slice culls the Gaussians of other times
        frames.append(img[0])
    for a, b in ((0, 1), (1, 2), (0, 2)):
        changed = ((frames[a] - frames[b]).abs().amax(-1) > 0.1).float().mean()
        assert changed > 0.01, (a, b)


# ----------------------------------------------------------------------------
# The render stage in a graph
# ----------------------------------------------------------------------------
def test_scene_time_loops_over_the_duration():
    s = random_scene_4d(3, 0, 0, time_duration=(1.0, 3.0))
    assert scene_time(0.0, s) == 1.0 and scene_time(0.5, s) == 1.5
    assert scene_time(2.25, s) == pytest.approx(1.25) and scene_time(4.0, s) == 1.0
    assert scene_time(1.0, s, time_scale=0.5) == 1.5
    assert scene_time(9.0, s, loop=False) == 3.0


def test_stage_renders_the_scene_at_each_frames_time_in_a_graph():
    scene = load_checkpoint(ASSET)
    view, K = _fixed_camera()
    fps, n = 4, 10  # frames at 0, 0.25, ..., 2.25 s; the scene loops every 2 s
    path = CameraPath(view[None].expand(n, 4, 4).clone(), K[None].expand(n, 3, 3).clone(), W, H, fps)
    g = Graph(Clock("fast"))
    cams = g.add(CameraSource(path, fps=fps))
    render = g.add(Gaussian4DRenderStage(scene, width=W, height=H))
    sink = g.add(CollectFrames("video", (H, W, 3), torch.uint8, name="frames"))
    g.connect(cams, render)
    g.connect(render, sink)
    g.run(timeout=120)

    assert len(sink.got) == n
    clock = Clock()
    for i, (pts, img) in enumerate(sink.got):
        t = scene_time(clock.seconds(pts), scene)
        assert t == pytest.approx((i * 0.25) % 2.0)
        if i not in (0, 3, 6):
            continue
        ref_img, _, _ = rasterize_4d(**scene.rasterize_args(), t=t, viewmats=view[None], Ks=K[None], width=W,
                                     height=H, backgrounds=torch.zeros(1, 3))
        assert torch.equal(img, (ref_img[0].clamp(0, 1) * 255 + 0.5).to(torch.uint8)), i  # what the stage drew
    assert not torch.equal(sink.got[1][1], sink.got[3][1])  # same camera, the scene moved
    assert torch.equal(sink.got[1][1], sink.got[9][1])  # 2.25 s shows the scene at 0.25 s: it loops
    assert math.isclose(render.last_time, 0.25)
