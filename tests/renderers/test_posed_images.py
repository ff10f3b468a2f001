"""The one transforms.json loader (renderers/posed_images.py) shared by `fit` and `fit-nerf`."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from posed_captures import SUBJECT, arc_cameras, render_view, subject_scene, write_capture

from framegraph.renderers.cameras import camera_centers
from framegraph.renderers.posed_images import DatasetError, load_transforms
from framegraph.stream.quality import psnr


def write_scene(root, frames=2, size=(8, 6), rgba=False, **top):
    w, h = size
    (root / "images").mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(frames):
        mode = "RGBA" if rgba else "RGB"
        px = np.full((h, w, 4 if rgba else 3), 40 * (i + 1), np.uint8)
        if rgba:
            px[..., 3] = 0  # fully transparent: the background shows
        Image.fromarray(px, mode).save(root / "images" / f"f{i}.png")
        c2w = np.eye(4)
        c2w[:3, 3] = (i, 0.0, 2.0)
        entries.append({"file_path": f"images/f{i}", "transform_matrix": c2w.tolist()})  # Blender: no extension
    meta = {"w": w, "h": h, "camera_angle_x": math.radians(90), "frames": entries, **top}
    (root / "transforms.json").write_text(json.dumps(meta))
    return root / "transforms.json"


def test_poses_become_opencv_world_to_camera_and_intrinsics_follow_the_fov(tmp_path):
    data = load_transforms(write_scene(tmp_path))
    assert len(data) == 2 and (data.height, data.width) == (6, 8)
    assert torch.allclose(data.Ks[0, 0, 0], torch.tensor(4.0))  # fov 90° over 8 px: f = 4
    # camera 1 sits at x=1, z=2 looking down -z (OpenGL): the world origin is in front of it (+z in OpenCV)
    origin = data.viewmats[1] @ torch.tensor([0.0, 0.0, 0.0, 1.0])
    assert origin[2] > 0 and abs(float(origin[0]) + 1.0) < 1e-5
    assert abs(float(data.images[1].mean()) - 80 / 255) < 1e-3 and len(data.files) == 2


def test_transparent_pixels_take_the_background_and_limit_reads_fewer(tmp_path):
    data = load_transforms(write_scene(tmp_path, rgba=True), background=(1.0, 1.0, 1.0), limit=1)
    assert len(data) == 1 and torch.allclose(data.images, torch.ones_like(data.images))


@pytest.mark.parametrize("damage,message", [
    (lambda m: m["frames"][0].pop("transform_matrix"), "transform_matrix"),
    (lambda m: [f.update(file_path="images/missing") for f in m["frames"]], "only 0 of 2 frames"),
    (lambda m: m.update(w=9), "9"),
    (lambda m: m.pop("camera_angle_x"), "fl_x"),
])
def test_bad_files_name_the_file_and_the_problem(tmp_path, damage, message):
    path = write_scene(tmp_path)
    meta = json.loads(path.read_text())
    damage(meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(DatasetError) as err:
        load_transforms(path)
    assert "transforms.json" in str(err.value) and message in str(err.value)


def test_json_that_does_not_parse_is_refused(tmp_path):
    path = tmp_path / "transforms.json"
    path.write_text("{not json")
    with pytest.raises(DatasetError, match="transforms.json"):
        load_transforms(path)


def test_frames_without_their_image_are_skipped_with_one_warning_that_counts_them(tmp_path, capsys):
    """instant-ngp's fox lists 67 frames and ships 50 images: the fit goes on with those it finds."""
    path = write_capture(tmp_path, 6, size=(16, 12), missing=(1, 4, 5))
    data = load_transforms(path)
    assert data.names == ["images/0000.png", "images/0002.png", "images/0003.png"]
    assert torch.allclose(data.viewmats, arc_cameras(6)[[0, 2, 3]], atol=1e-5)  # each image keeps its own pose
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "skipping 3 of 6 frames" in warnings[0] and "images/0001.png" in warnings[0]
    with pytest.raises(DatasetError, match=r"only 3 of 6 frames have their image under .*need at least 4"):
        load_transforms(path, min_images=4)


def test_without_ngp_keys_the_box_centres_on_what_an_off_centre_arc_of_cameras_looks_at(tmp_path):
    """Cameras on a 120° arc around a subject away from the origin: their mean position is 1.5 units from
    the subject, off the old box; the box is now centred on the point the optical axes meet."""
    data = load_transforms(write_capture(tmp_path, 6, size=(16, 12)))
    assert data.scene_box is None
    box = torch.tensor(data.suggested_aabb())
    centre, half = (box[:3] + box[3:]) / 2, (box[3:] - box[:3]) / 2
    assert float((centre - torch.tensor(SUBJECT)).norm()) < 1e-3
    assert torch.allclose(half, torch.full((3,), 0.4 * 3.0), atol=1e-3)  # 0.4 x the camera distance
    mean_camera = camera_centers(data.viewmats.double()).mean(0)
    assert float((mean_camera - torch.tensor(SUBJECT, dtype=torch.float64)).norm()) > 1.2


@pytest.mark.parametrize("keys,lo,hi", [
    ({"aabb_scale": 4}, [-0.5 * 4 / 0.33] * 3, [0.5 * 4 / 0.33] * 3),  # the fox: scale 0.33, offset 0.5
    ({"aabb_scale": 2, "scale": 0.5, "offset": [0.5, 1.0, 0.0]}, [-2.0, -3.0, -1.0], [2.0, 1.0, 3.0]),
    ({"offset": 0.0}, [0.0] * 3, [1 / 0.33] * 3),
    ({"aabb": [[1.0, -1.0, 0.0], [3.0, 0.0, 1.0]]}, [1.0, -1.5, -0.5], [3.0, 0.5, 1.5]),  # longest side: a cube
    ({"aabb_scale": 256}, [-0.5 * 128 / 0.33] * 3, [0.5 * 128 / 0.33] * 3),  # instant-ngp stops at 128
])
def test_instant_ngp_keys_give_instant_ngps_box(tmp_path, keys, lo, hi):
    """instant-ngp marches the cube of side aabb_scale around (0.5, 0.5, 0.5) in p * scale + offset."""
    data = load_transforms(write_capture(tmp_path, 2, size=(8, 6), **keys))
    assert data.suggested_aabb() == pytest.approx(lo + hi)
    assert data.subset([1]).scene_box == data.scene_box


def test_bad_ngp_keys_and_lens_coefficients_are_refused(tmp_path):
    for keys, message in [({"aabb_scale": -1}, "must be positive"), ({"offset": [1, 2]}, "offset"),
                          ({"scale": "big"}, "scale must be numbers"), ({"k1": "x"}, "must be numbers"),
                          ({"k4": 0.1}, "fisheye"), ({"is_fisheye": True, "k1": 0.1, "p1": 0.01}, "tangential")]:
        with pytest.raises(DatasetError, match=message):
            load_transforms(write_capture(tmp_path, 1, size=(8, 6), **keys))


@pytest.mark.parametrize("lens", [
    {"k1": -0.25, "k2": 0.06, "p1": 0.002, "p2": -0.003},  # barrel, with tangential terms
    {"k1": 0.15, "k2": -0.05},  # pincushion
    {"is_fisheye": True, "k1": 0.5, "k2": 0.1, "k3": -0.05, "k4": 0.02},
])
def test_lens_distortion_is_undone_on_load(tmp_path, lens):
    """Images recorded through a distorting lens come back as the pinhole camera of the loaded intrinsics
    would see them; read with the distortion ignored (the old loader) they are far off."""
    scene, (w, h) = subject_scene(), (96, 72)
    views = arc_cameras(2, radius=1.3)  # the subject fills the frame: the distortion shows
    path = write_capture(tmp_path, 2, size=(w, h), lens=lens, viewmats=views, fov_deg=70)
    data = load_transforms(path, downscale=2)
    assert data.images.shape == (2, h // 2, w // 2, 3)
    meta = json.loads(path.read_text())
    ignored = load_transforms(write_capture(tmp_path / "raw", 2, size=(w, h), lens=lens, viewmats=views, fov_deg=70,
                                            k1=0, k2=0, k3=0, k4=0, p1=0, p2=0), downscale=2)
    for i in range(2):
        truth = render_view(scene, data.viewmats[i], data.Ks[i], w // 2, h // 2)
        raw_truth = render_view(scene, ignored.viewmats[i], ignored.Ks[i], w // 2, h // 2)
        good, bad = psnr(data.images[i], truth), psnr(ignored.images[i], raw_truth)
        assert good > 23.5 and good > bad + 5, (good, bad)  # measured 25.1-25.6 dB against 13.8-19.1 dB
    assert not torch.allclose(data.Ks[0], ignored.Ks[0])  # the intrinsics follow the resampling
    assert meta["fl_x"] == pytest.approx(float(ignored.Ks[0, 0, 0]) * 2)
