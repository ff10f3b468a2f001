"""The one transforms.json loader (renderers/posed_images.py) shared by `fit` and `fit-nerf`."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from framegraph.renderers.posed_images import DatasetError, load_transforms


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
    (lambda m: m["frames"][1].update(file_path="images/missing"), "missing"),
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
