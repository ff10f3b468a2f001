"""Cameras: OpenCV conventions, paths, nerfstudio camera_path.json."""
import json
import math

import pytest
import torch

from framegraph.renderers.cameras import (
    CameraPathError,
    KeyframePath,
    camera_centers,
    intrinsics,
    load_nerfstudio_camera_path,
    look_at,
    orbit_path,
    quat_to_rotmat,
    rotmat_to_quat,
)
from framegraph.renderers.gaussians import rasterize


def project(viewmat, K, point):
    p = viewmat[:3, :3] @ torch.as_tensor(point, dtype=torch.float32) + viewmat[:3, 3]
    uv = K @ (p / p[2])
    return uv[:2], p[2]


def test_look_at_is_opencv_world_to_camera():
    V = look_at((0.0, -5.0, 0.0), (0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0))
    R = V[:3, :3]
    torch.testing.assert_close(R @ R.T, torch.eye(3), atol=1e-6, rtol=0)
    assert torch.det(R) == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(camera_centers(V), torch.tensor([0.0, -5.0, 0.0]), atol=1e-6, rtol=0)
    K = intrinsics(640, 480, fov_deg=60)
    # the target lands on the principal point, 5 units in front (z > 0)
    uv, z = project(V, K, (0.0, 0.0, 0.0))
    torch.testing.assert_close(uv, torch.tensor([320.0, 240.0]))
    assert z == pytest.approx(5.0)
    # world up (+z) is image up (smaller y); world +x is image right (larger x) for a camera looking along +y
    uv_up, _ = project(V, K, (0.0, 0.0, 1.0))
    uv_right, _ = project(V, K, (1.0, 0.0, 0.0))
    assert uv_up[1] < 240 and uv_up[0] == pytest.approx(320)
    assert uv_right[0] > 320 and uv_right[1] == pytest.approx(240)
    # behind the camera: negative depth
    assert project(V, K, (0.0, -10.0, 0.0))[1] < 0


def test_point_in_front_projects_where_expected():
    K = intrinsics(200, 100, focal=100.0)
    V = torch.eye(4)
    uv, _ = project(V, K, (0.5, -0.25, 2.0))  # x right, y down
    torch.testing.assert_close(uv, torch.tensor([100 + 100 * 0.25, 50 - 100 * 0.125]))


def test_rendered_gaussian_lands_on_its_pixel():
    """End to end: a small Gaussian at camera-space (x, y, z) lights the pixel K @ (x/z, y/z, 1)."""
    W, H = 64, 48
    eye, target = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 0.0, 0.0])
    V = look_at(eye, target, up=(0.0, 0.0, 1.0))
    K = intrinsics(W, H, fov_deg=50)
    cam_point = torch.tensor([0.3, -0.2, 3.0])  # right of and above the centre
    world = V[:3, :3].T @ (cam_point - V[:3, 3])
    img, alpha, meta = rasterize(world[None], torch.tensor([[1.0, 0, 0, 0]]), torch.full((1, 3), 0.01),
                                 torch.ones(1), torch.ones(1, 3), V[None], K[None], W, H, eps2d=0.1)
    uv = meta["means2d"][0, 0]
    expected = K[:2, :2] @ (cam_point[:2] / cam_point[2]) + K[:2, 2]
    torch.testing.assert_close(uv, expected, atol=1e-4, rtol=0)
    peak = alpha[0, ..., 0].flatten().argmax()
    assert (int(peak % W), int(peak // W)) == (int(expected[0]), int(expected[1]))
    assert expected[0] > W / 2 and expected[1] < H / 2


def test_intrinsics():
    K = intrinsics(640, 480, fov_deg=90)
    assert K[1, 1] == pytest.approx(240.0) and K[0, 0] == K[1, 1]
    assert intrinsics(640, 480, fov_deg=90, fov_axis="x")[0, 0] == pytest.approx(320.0)
    with pytest.raises(ValueError, match="exactly one"):
        intrinsics(640, 480)
    with pytest.raises(ValueError, match="fov_deg must be in"):
        intrinsics(640, 480, fov_deg=180)


def test_look_at_rejects_degenerate():
    with pytest.raises(ValueError, match="parallel to up"):
        look_at((0.0, 0.0, 5.0), (0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="coincide"):
        look_at((1.0, 1.0, 1.0), (1.0, 1.0, 1.0))


def test_orbit_path_circles_the_centre():
    center = torch.tensor([1.0, 2.0, 0.5])
    path = orbit_path(center, 4.0, 12, elevation_deg=30, width=320, height=240)
    assert len(path) == 12 and path.viewmats.shape == (12, 4, 4) and path.Ks.shape == (12, 3, 3)
    eyes = camera_centers(path.viewmats)
    torch.testing.assert_close((eyes - center).norm(dim=1), torch.full((12,), 4.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(eyes[:, 2] - center[2], torch.full((12,), 4.0 * math.sin(math.radians(30))),
                               atol=1e-5, rtol=0)
    for V, K in zip(path.viewmats, path.Ks):
        uv, z = project(V, K, center)
        torch.testing.assert_close(uv, torch.tensor([160.0, 120.0]), atol=1e-3, rtol=0)


def test_quaternion_round_trip():
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(50, 4, generator=g, dtype=torch.float64), dim=1)
    q = torch.where(q[:, :1] < 0, -q, q)
    torch.testing.assert_close(rotmat_to_quat(quat_to_rotmat(q)), q)


def test_keyframe_path_interpolates_smoothly():
    keys = torch.stack([look_at((4 * math.cos(a), 4 * math.sin(a), 1.0), (0.0, 0.0, 0.0))
                        for a in (0.0, 0.8, 1.9, 2.5)])
    times = [0.0, 1.0, 2.5, 3.0]
    path = KeyframePath(keys, times)
    for V, t in zip(keys, times):  # passes through every keyframe
        torch.testing.assert_close(path.at(t), V, atol=1e-5, rtol=0)
    ts = torch.linspace(0, 3, 301)
    Vs = path.at(ts)
    eyes = camera_centers(Vs.double())
    step = (eyes[1:] - eyes[:-1]).norm(dim=1)
    assert step.max() < 0.1, "no jumps"
    # C1 at the keyframes: velocity just before and after t=1 agree
    c0, c1, c2 = (camera_centers(path.at(t).double()) for t in (0.999, 1.0, 1.001))
    torch.testing.assert_close((c1 - c0) / 0.001, (c2 - c1) / 0.001, atol=2e-2, rtol=2e-2)
    # rotations stay orthonormal between keys; clamped outside the range
    R = Vs[:, :3, :3]
    torch.testing.assert_close(R @ R.transpose(1, 2), torch.eye(3).expand(301, 3, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(path.at(-1.0), keys[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(path.at(10.0), keys[-1], atol=1e-5, rtol=0)
    sampled = path.sample(31, intrinsics(64, 48, fov_deg=50), 64, 48)
    assert len(sampled) == 31 and sampled.fps == pytest.approx(31 / 3)


def test_keyframe_loop_wraps():
    keys = torch.stack([look_at((4 * math.cos(a), 4 * math.sin(a), 0.5), (0.0, 0.0, 0.0))
                        for a in (0.0, 2.0, 4.0)])
    path = KeyframePath(keys, loop=True)
    torch.testing.assert_close(path.at(3.0), keys[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(path.at(4.0), keys[1], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="strictly increasing"):
        KeyframePath(keys, [0.0, 1.0, 1.0])


def nerfstudio_doc(c2ws, fov=50.0, **extra):
    doc = {
        "camera_type": "perspective", "render_height": 480, "render_width": 640, "fps": 24, "seconds": 2,
        "camera_path": [{"camera_to_world": c2w.flatten().tolist(), "fov": fov, "aspect": 640 / 480}
                        for c2w in c2ws],
    }
    doc.update(extra)
    return doc


def test_nerfstudio_camera_path(tmp_path):
    # An OpenGL camera at (0, -5, 0) looking along +y (its -z axis) with +z up.
    c2w = torch.eye(4, dtype=torch.float64)
    c2w[:3, 0] = torch.tensor([1.0, 0.0, 0.0])  # right
    c2w[:3, 1] = torch.tensor([0.0, 0.0, 1.0])  # up
    c2w[:3, 2] = torch.tensor([0.0, -1.0, 0.0])  # back
    c2w[:3, 3] = torch.tensor([0.0, -5.0, 0.0])
    path_file = tmp_path / "camera_path.json"
    path_file.write_text(json.dumps(nerfstudio_doc([c2w, c2w])))
    path = load_nerfstudio_camera_path(path_file)
    assert len(path) == 2 and (path.width, path.height, path.fps) == (640, 480, 24.0)
    expected = look_at((0.0, -5.0, 0.0), (0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0))
    torch.testing.assert_close(path.viewmats[0], expected, atol=1e-6, rtol=0)
    assert path.Ks[0, 1, 1] == pytest.approx(240 / math.tan(math.radians(25)), rel=1e-6)
    uv, z = project(path.viewmats[0], path.Ks[0], (0.0, 0.0, 0.0))
    torch.testing.assert_close(uv, torch.tensor([320.0, 240.0]))
    # nested 4x4 lists and fps from seconds also parse
    doc = nerfstudio_doc([c2w] * 4)
    doc.pop("fps")
    for cam in doc["camera_path"]:
        cam["camera_to_world"] = c2w.tolist()
    path_file.write_text(json.dumps(doc))
    assert load_nerfstudio_camera_path(path_file).fps == pytest.approx(2.0)


@pytest.mark.parametrize(
    "content,message",
    [
        ("{not json", r"not valid JSON \(line 1"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"render_width": 10, "render_height": 10}), "missing key 'camera_path'"),
        (json.dumps(nerfstudio_doc([])), "non-empty list"),
        (json.dumps(nerfstudio_doc([torch.eye(3)])), r"camera_path\[0\].camera_to_world must be 16 numbers"),
        (json.dumps(nerfstudio_doc([torch.eye(4)], fov=None)), r"camera_path\[0\].fov must be"),
        (json.dumps(nerfstudio_doc([torch.eye(4)], camera_type="fisheye")), "camera_type 'fisheye' is not supported"),
        (json.dumps(nerfstudio_doc([torch.eye(4)], fps=0, seconds=0)), "positive 'fps' or 'seconds'"),
    ],
)
def test_nerfstudio_errors_name_the_file(tmp_path, content, message):
    f = tmp_path / "bad_path.json"
    f.write_text(content)
    with pytest.raises(CameraPathError, match=message) as info:
        load_nerfstudio_camera_path(f)
    assert str(info.value).startswith(str(f))


def test_nerfstudio_missing_file(tmp_path):
    with pytest.raises(CameraPathError, match="no such file"):
        load_nerfstudio_camera_path(tmp_path / "nope.json")
