"""NeRF fitting from posed images, and the on-disk format (save / load, clear load errors)."""
import json

import pytest
import torch

from framegraph.renderers.nerf import (
    HashGridConfig,
    NerfConfig,
    NerfLoadError,
    NerfModel,
    Sphere,
    SphereScene,
    fit,
    load_nerf,
    sphere_views,
)
from framegraph.stream.quality import psnr

TINY_GRID = HashGridConfig(n_levels=8, log2_table_size=12, base_resolution=4, finest_resolution=64)


AABB = (-0.6, -0.6, -0.6, 0.6, 0.6, 0.6)


def tiny_scene():
    return SphereScene([Sphere((0.0, 0.0, 0.0), 0.5, (0.9, 0.3, 0.2), (0.2, 0.4, 0.9), bands=2.0)],
                       background=(1.0, 1.0, 1.0), aabb=AABB)


def tiny_model(seed=0):
    cfg = NerfConfig(aabb=AABB, grid=TINY_GRID, step_size=1.2 * 3 ** 0.5 / 48, background=(1.0, 1.0, 1.0),
                     occupancy_resolution=16, occupancy_decay=0.7)
    return NerfModel(cfg, seed=seed)


@pytest.fixture(scope="module")
def fitted():
    """A tiny NeRF fitted for a few seconds (about 5 s of one CPU core) to 8 views of one textured sphere."""
    scene, W = tiny_scene(), 24
    views = sphere_views(8, width=W, height=W, radius=2.0)
    images = torch.stack([scene.render(v, k, W, W) for v, k in zip(views.viewmats, views.Ks)])
    test = sphere_views(2, width=W, height=W, start_deg=30.0, elevations_deg=(25.0,), radius=2.0)
    truth = torch.stack([scene.render(v, k, W, W) for v, k in zip(test.viewmats, test.Ks)])
    model = tiny_model()

    def score():
        with torch.no_grad():
            return sum(psnr(model.render(v, k, W, W), t) for v, k, t in zip(test.viewmats, test.Ks, truth)) / 2

    before = score()
    report = fit(model, images, views.viewmats, views.Ks, steps=80, batch_rays=256, lr=2e-2, occupancy_every=8,
                 occupancy_warmup=16, seed=0, loss="huber")
    return model, before, score(), report


def test_a_short_fit_raises_held_out_psnr(fitted):
    model, before, after, report = fitted
    assert len(report.losses) == 80 and report.losses[-1] < 0.5 * report.losses[0]
    assert after > before + 6, (before, after)  # measured: 11.2 dB -> 19.0 dB
    assert after > 17
    assert report.occupied_fraction < 0.5  # the occupancy grid pruned empty space while training


def test_resume_from_a_checkpoint_ends_exactly_where_an_uninterrupted_fit_does(tmp_path):
    """Weights, Adam moments, occupancy grid and the random stream all continue: bit-identical results."""
    from framegraph.renderers.nerf import NerfFitConfig, NerfFitter, PosedImages

    scene, W = tiny_scene(), 12
    views = sphere_views(4, width=W, height=W, radius=2.0)
    data = PosedImages(torch.stack([scene.render(v, k, W, W) for v, k in zip(views.viewmats, views.Ks)]),
                       views.viewmats, views.Ks)
    cfg = NerfFitConfig(steps=24, batch_rays=64, occupancy_every=4, occupancy_warmup=8, occupancy_cells=64)
    straight = NerfFitter(tiny_model(), data, cfg)
    straight.run(progress=False)

    first = NerfFitter(tiny_model(), data, cfg)
    first.run(10, progress=False, checkpoint=str(tmp_path / "nerf" / "fit"))
    assert load_nerf(tmp_path / "nerf").config.to_dict() == first.model.config.to_dict()
    resumed = NerfFitter.load(str(tmp_path / "nerf" / "fit"), data)
    assert resumed.step == 10
    resumed.run(progress=False)
    for (k, a), (_, b) in zip(straight.model.field.state_dict().items(), resumed.model.field.state_dict().items()):
        assert torch.equal(a, b), k
    assert torch.equal(straight.model.occupancy.opacity, resumed.model.occupancy.opacity)
    assert torch.equal(straight.model.occupancy.bits, resumed.model.occupancy.bits)
    a, b = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in a)
    assert [h["psnr"] for h in straight.history] == [h["psnr"] for h in resumed.history]

    with pytest.raises(Exception, match="n_views=4, this data has 3"):
        NerfFitter.load(str(tmp_path / "nerf" / "fit"), data.subset([0, 1, 2]))


def test_mse_loss_and_bad_arguments():
    model = tiny_model()
    imgs = torch.rand(1, 8, 8, 3)
    views = sphere_views(1, width=8, height=8)
    report = fit(model, imgs, views.viewmats, views.Ks, steps=2, batch_rays=32, loss="mse", occupancy_every=0)
    assert len(report.losses) == 2
    with pytest.raises(ValueError, match="loss='l1'"):
        fit(model, imgs, views.viewmats, views.Ks, steps=1, loss="l1")
    with pytest.raises(ValueError, match=r"viewmats \[1, 4, 4\]"):
        fit(model, imgs, views.viewmats[:, :3], views.Ks, steps=1)


def test_save_load_round_trip_is_exact(fitted, tmp_path):
    model = fitted[0]
    model.save(tmp_path / "nerf")
    doc = json.loads((tmp_path / "nerf" / "config.json").read_text())
    assert doc["grid"]["n_levels"] == 8 and doc["resolutions"] == TINY_GRID.resolutions and doc["aabb"] == list(AABB)
    back = load_nerf(tmp_path / "nerf")
    assert back.config.to_dict() == model.config.to_dict()
    for (k, a), (k2, b) in zip(model.field.state_dict().items(), back.field.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert torch.equal(back.occupancy.bits, model.occupancy.bits)
    views = sphere_views(1, width=16, height=12)
    with torch.no_grad():
        assert torch.equal(back.render(views.viewmats[0], views.Ks[0], 16, 12),
                           model.render(views.viewmats[0], views.Ks[0], 16, 12))


def _saved(tmp_path):
    d = tmp_path / "nerf"
    tiny_model().save(d)
    return d


def test_load_errors_name_the_file_and_the_problem(tmp_path):
    from safetensors.torch import load_file, save_file

    with pytest.raises(NerfLoadError, match="not a directory"):
        load_nerf(tmp_path / "nope")
    d = _saved(tmp_path)
    cfg, weights = d / "config.json", d / "model.safetensors"
    good_cfg = cfg.read_text()

    cfg.unlink()
    with pytest.raises(NerfLoadError, match=r"config\.json: missing"):
        load_nerf(d)
    cfg.write_text("{ not json")
    with pytest.raises(NerfLoadError, match=r"config\.json: not valid JSON \(line 1"):
        load_nerf(d)
    doc = json.loads(good_cfg)
    del doc["grid"]
    cfg.write_text(json.dumps(doc))
    with pytest.raises(NerfLoadError, match=r"config\.json: missing key 'grid'"):
        load_nerf(d)
    doc = json.loads(good_cfg)
    doc["resolutions"][0] = 5
    cfg.write_text(json.dumps(doc))
    with pytest.raises(NerfLoadError, match=r"'resolutions' is \[5, .* but the grid settings give \[4,"):
        load_nerf(d)
    doc = json.loads(good_cfg)
    doc["grid"]["log2_table_size"] = 99
    cfg.write_text(json.dumps(doc))
    with pytest.raises(NerfLoadError, match=r"config\.json: bad value .*log2_table_size"):
        load_nerf(d)
    cfg.write_text(good_cfg)

    tensors = load_file(str(weights))
    tensors["density.0"] = tensors["density.0"][:, :32].contiguous()
    save_file(tensors, str(weights))
    with pytest.raises(NerfLoadError, match=r"model\.safetensors: tensor 'density\.0' is torch\.float32 \[16, 32\]; "
                                            r"the config expects float32 \[16, 64\]"):
        load_nerf(d)
    del tensors["density.0"]
    save_file(tensors, str(weights))
    with pytest.raises(NerfLoadError, match=r"missing tensors \['density\.0'\]"):
        load_nerf(d)
    weights.write_bytes(b"garbage")
    with pytest.raises(NerfLoadError, match=r"model\.safetensors: not a readable safetensors file"):
        load_nerf(d)
    weights.unlink()
    with pytest.raises(NerfLoadError, match=r"model\.safetensors: missing"):
        load_nerf(d)


def write_transforms(folder, n_views: int, W: int):
    """``n_views`` renders of the tiny scene as an instant-ngp ``transforms.json`` (RGBA PNGs, OpenGL
    camera-to-world) in ``folder``; returns the views."""
    import math

    import numpy as np
    from PIL import Image

    from framegraph.renderers.cameras import OPENGL_TO_OPENCV

    scene = tiny_scene()
    views = sphere_views(n_views, width=W, height=W, radius=2.0)
    frames = []
    for i, (v, K) in enumerate(zip(views.viewmats, views.Ks)):
        img = (scene.render(v, K, W, W) * 255 + 0.5).to(torch.uint8).numpy()
        alpha = np.full((W, W, 1), 255, np.uint8)
        Image.fromarray(np.concatenate([img, alpha], -1)).save(folder / f"r_{i}.png")
        c2w = torch.linalg.inv(v.double()) @ OPENGL_TO_OPENCV
        frames.append({"file_path": f"./r_{i}", "transform_matrix": c2w.tolist()})
    fov_x = 2 * math.atan(0.5 * W / float(views.Ks[0, 0, 0]))
    (folder / "transforms.json").write_text(json.dumps({"camera_angle_x": fov_x, "frames": frames}))
    return views


def test_transforms_json_round_trip_and_fit_command(tmp_path):
    """Posed images written as an instant-ngp transforms.json come back as the same OpenCV cameras; the
    ``framegraph fit`` entry point trains from them and writes a loadable NeRF directory."""
    import argparse

    from framegraph.apps.commands.fit_nerf import add_arguments
    from framegraph.apps.fit_nerf import run
    from framegraph.renderers.nerf import is_nerf_dir, load_transforms

    W = 16
    views = write_transforms(tmp_path, 3, W)
    data = load_transforms(tmp_path / "transforms.json")
    torch.testing.assert_close(data.viewmats, views.viewmats, atol=1e-5, rtol=0)
    torch.testing.assert_close(data.Ks, views.Ks, atol=1e-4, rtol=0)
    assert data.images.shape == (3, W, W, 3)

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([str(tmp_path / "transforms.json"), "--out", str(tmp_path / "nerf"), "--steps", "3",
                         "--batch-rays", "64", "--levels", "4", "--log2-table", "10", "--finest", "32",
                         "--occupancy", "8", "--steps-per-diagonal", "32", "--hold-out", "3", "--device", "cpu"])
    assert run(args) == 0
    assert is_nerf_dir(tmp_path / "nerf") and not is_nerf_dir(tmp_path)
    assert load_nerf(tmp_path / "nerf").config.grid.n_levels == 4


def test_fit_nerf_sizes_default_per_device():
    """Unset size options take the device's defaults (CUDA: instant-ngp's; CPU: smaller, measured); set ones stay."""
    import argparse

    from framegraph.apps.commands.fit_nerf import add_arguments
    from framegraph.renderers.nerf.cli import DEVICE_DEFAULTS, resolve_defaults

    p = argparse.ArgumentParser()
    add_arguments(p)
    cpu = resolve_defaults(p.parse_args(["t.json", "--out", "o"]), "cpu")
    cuda = resolve_defaults(p.parse_args(["t.json", "--out", "o"]), "cuda:0")
    assert (cuda.levels, cuda.log2_table, cuda.finest, cuda.occupancy) == (16, 19, 2048, 128)
    assert (cuda.steps, cuda.batch_rays, cuda.steps_per_diagonal) == (2000, 4096, 512)
    for key, value in DEVICE_DEFAULTS["cpu"].items():
        assert getattr(cpu, key) == value
    assert cpu.levels < cuda.levels and cpu.log2_table < cuda.log2_table and cpu.batch_rays < cuda.batch_rays
    assert cpu.occupancy_decay < cuda.occupancy_decay
    mine = resolve_defaults(p.parse_args(["t.json", "--out", "o", "--steps", "7", "--levels", "3"]), "cpu")
    assert (mine.steps, mine.levels, mine.finest) == (7, 3, DEVICE_DEFAULTS["cpu"]["finest"])
    assert "default 400 on CPU, 2000 on CUDA" in p.format_help().replace("\n", " ").replace("  ", " ")


def test_bench_nerf_fit_records_held_out_psnr_against_time(tmp_path):
    """``framegraph bench nerf_fit`` on a procedural capture: held-out PSNR rises over the curve, the JSON
    carries the machine's description, the exact command and the load, and names no images."""
    import argparse

    from framegraph.apps.bench import nerf_fit
    from framegraph.apps.commands.bench import nerf_fit as nerf_fit_front

    write_transforms(tmp_path, 9, 24)
    p = argparse.ArgumentParser()
    nerf_fit_front.add_arguments(p)
    out = tmp_path / "nerf_fit.json"
    args = p.parse_args(["--transforms", str(tmp_path / "transforms.json"), "--downscale", "1", "--hold-out", "4",
                         "--aabb", *map(str, AABB), "--steps", "60", "--batch-rays", "256", "--eval-every", "30",
                         "--levels", "8", "--log2-table", "12", "--finest", "64", "--occupancy", "16",
                         "--steps-per-diagonal", "48", "--target-db", "15", "--out", str(out)])
    assert nerf_fit.run(args) == 0
    r = json.loads(out.read_text())
    for key in ("device", "command", "versions", "load_average_1_5_15min", "git_commit", "threads"):
        assert key in r
    assert r["dataset"]["held_out_frames"] == 3 and r["dataset"]["train_frames"] == 6
    assert [c["step"] for c in r["curve"]] == [30, 60]
    assert r["steps_per_s"] > 0 and 0 < r["train_s"] == r["curve"][-1]["train_s"]
    assert r["curve"][-1]["held_out_psnr_db"] > 15  # measured ~20 dB: the fit learned the sphere
    assert r["target"]["met"] == (r["target"]["reached_at_s"] is not None and r["target"]["reached_at_s"] <= 600)
    assert out.with_suffix(".png").stat().st_size > 0
