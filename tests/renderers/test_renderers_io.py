"""Scene files: INRIA PLY round trip and bad input, .splat import, memory refusal."""
import numpy as np
import pytest
import torch

from framegraph.renderers.gaussians import (
    GaussianScene,
    SceneError,
    SceneTooLargeError,
    check_fits,
    load_ply,
    load_scene,
    load_splat,
    random_scene,
    save_ply,
)
from framegraph.renderers.gaussians.reference import SH_C0

INRIA_DEG3_PROPS = (
    ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    + [f"f_rest_{i}" for i in range(45)]
    + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
)


def write_ply(path, props, rows, *, fmt="binary_little_endian", count=None, extra=b"", dtype="<f4"):
    """A hand-made PLY: float properties ``props``, data ``rows [N, len(props)]``."""
    count = rows.shape[0] if count is None else count
    header = f"ply\nformat {fmt} 1.0\nelement vertex {count}\n"
    header += "".join(f"property float {p}\n" for p in props) + "end_header\n"
    path.write_bytes(header.encode() + np.asarray(rows, dtype=dtype).tobytes() + extra)
    return path


def inria_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(n, 62)).astype(np.float32)
    rows[:, 3:6] = 0  # normals
    return rows


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_is_bitwise_exact(tmp_path, degree):
    scene = random_scene(37, degree, seed=degree)
    save_ply(scene, tmp_path / "a.ply")
    loaded = load_ply(tmp_path / "a.ply")
    assert loaded.n == 37 and loaded.sh_degree == degree and loaded.sh.shape == (37, (degree + 1) ** 2, 3)
    for name in ("means", "quats", "scales", "opacities", "sh"):
        torch.testing.assert_close(getattr(loaded, name), getattr(scene, name), rtol=1e-6, atol=1e-6)
    save_ply(loaded, tmp_path / "b.ply")
    assert (tmp_path / "a.ply").read_bytes() == (tmp_path / "b.ply").read_bytes()


def test_inria_layout_activations_and_channel_major_sh(tmp_path):
    rows = inria_rows(5)
    rows[:, 58:62] *= 3.0  # INRIA quaternions are not unit
    path = write_ply(tmp_path / "s.ply", INRIA_DEG3_PROPS, rows)
    assert path.stat().st_size - len(path.read_bytes().split(b"end_header\n")[0]) - 11 == 5 * 62 * 4
    scene = load_ply(path)
    assert scene.sh_degree == 3
    torch.testing.assert_close(scene.means, torch.from_numpy(rows[:, 0:3]))
    torch.testing.assert_close(scene.opacities, torch.sigmoid(torch.from_numpy(rows[:, 54])))
    torch.testing.assert_close(scene.scales, torch.exp(torch.from_numpy(rows[:, 55:58])))
    q = torch.from_numpy(rows[:, 58:62])
    torch.testing.assert_close(scene.quats, q / q.norm(dim=1, keepdim=True))
    # f_dc -> sh[:, 0]; f_rest is [3 channels, 15 coefficients] per Gaussian
    torch.testing.assert_close(scene.sh[:, 0], torch.from_numpy(rows[:, 6:9]))
    rest = torch.from_numpy(rows[:, 9:54]).reshape(5, 3, 15)
    torch.testing.assert_close(scene.sh[:, 1:], rest.transpose(1, 2))
    # an unedited file we did not write also comes back bit for bit
    save_ply(scene, tmp_path / "t.ply")
    assert (tmp_path / "t.ply").read_bytes() == path.read_bytes()


def test_edited_gaussians_are_re_encoded(tmp_path):
    save_ply(random_scene(10, 1, seed=3), tmp_path / "a.ply")
    scene = load_ply(tmp_path / "a.ply")
    scene.opacities[2] = 0.5
    scene.scales[4] = torch.tensor([0.1, 0.2, 0.3])
    save_ply(scene, tmp_path / "b.ply")
    again = load_ply(tmp_path / "b.ply")
    assert again.opacities[2] == pytest.approx(0.5, abs=1e-7)
    torch.testing.assert_close(again.scales[4], torch.tensor([0.1, 0.2, 0.3]))
    torch.testing.assert_close(again.opacities, scene.opacities)


def test_missing_property(tmp_path):
    props = [p for p in INRIA_DEG3_PROPS if p != "scale_1"]
    path = write_ply(tmp_path / "m.ply", props, inria_rows(3)[:, :61])
    with pytest.raises(SceneError, match=r"m\.ply.*missing vertex properties scale_1"):
        load_ply(path)


def test_wrong_number_of_f_rest(tmp_path):
    props = INRIA_DEG3_PROPS[:9] + [f"f_rest_{i}" for i in range(10)] + INRIA_DEG3_PROPS[54:]
    path = write_ply(tmp_path / "r.ply", props, np.zeros((2, len(props))))
    with pytest.raises(SceneError, match="10 f_rest properties"):
        load_ply(path)


def test_truncated_data(tmp_path):
    path = write_ply(tmp_path / "t.ply", INRIA_DEG3_PROPS, inria_rows(4))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SceneError, match=r"t\.ply: truncated: header declares 4 vertices"):
        load_ply(path)


def test_vertex_count_smaller_than_data(tmp_path):
    path = write_ply(tmp_path / "c.ply", INRIA_DEG3_PROPS, inria_rows(4), count=3)
    with pytest.raises(SceneError, match=r"c\.ply: wrong vertex count: header declares 3"):
        load_ply(path)


def test_truncated_header_and_not_ply(tmp_path):
    (tmp_path / "h.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 3\n")
    with pytest.raises(SceneError, match=r"h\.ply: truncated PLY header"):
        load_ply(tmp_path / "h.ply")
    (tmp_path / "n.ply").write_bytes(b"\x00\x01 not a ply")
    with pytest.raises(SceneError, match=r"n\.ply: not a PLY file"):
        load_ply(tmp_path / "n.ply")
    (tmp_path / "g.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nbogus line\n"
                                     b"end_header\n")
    with pytest.raises(SceneError, match="unknown PLY header line"):
        load_ply(tmp_path / "g.ply")


def test_unsupported_formats(tmp_path):
    path = write_ply(tmp_path / "a.ply", INRIA_DEG3_PROPS, inria_rows(1), fmt="ascii")
    with pytest.raises(SceneError, match="unsupported PLY format 'ascii'"):
        load_ply(path)
    (tmp_path / "x.obj").write_text("v 0 0 0\n")
    with pytest.raises(SceneError, match=r"x\.obj: unknown scene format"):
        load_scene(tmp_path / "x.obj")
    with pytest.raises(SceneError, match="no such file"):
        load_ply(tmp_path / "missing.ply")


def test_big_endian_is_read(tmp_path):
    rows = inria_rows(3)
    big = write_ply(tmp_path / "be.ply", INRIA_DEG3_PROPS, rows, fmt="binary_big_endian", dtype=">f4")
    little = write_ply(tmp_path / "le.ply", INRIA_DEG3_PROPS, rows)
    torch.testing.assert_close(load_ply(big).sh, load_ply(little).sh)


@pytest.mark.parametrize("column,value,name", [(1, np.nan, "position"), (20, np.inf, "f_rest"),
                                               (54, -np.inf, "opacity"), (60, np.nan, "rot")])
def test_nan_inf_rejected(tmp_path, column, value, name):
    rows = inria_rows(6)
    rows[4, column] = value
    path = write_ply(tmp_path / "bad.ply", INRIA_DEG3_PROPS, rows)
    with pytest.raises(SceneError, match=rf"bad\.ply: {name} has 1 NaN/Inf values \(first at Gaussian 4 of 6\)"):
        load_ply(path)


def test_zero_quaternion_and_overflowing_scale(tmp_path):
    rows = inria_rows(3)
    rows[1, 58:62] = 0
    with pytest.raises(SceneError, match="Gaussian 1 has a zero quaternion"):
        load_ply(write_ply(tmp_path / "q.ply", INRIA_DEG3_PROPS, rows))
    rows = inria_rows(3)
    rows[2, 55] = 100.0
    with pytest.raises(SceneError, match="scale of Gaussian 2 overflows"):
        load_ply(write_ply(tmp_path / "s.ply", INRIA_DEG3_PROPS, rows))


def test_too_large_for_device_is_refused_before_allocation(tmp_path, monkeypatch):
    with pytest.raises(SceneTooLargeError, match=r"10,000,000 Gaussians .* need about .* MiB on cpu, "
                                                 r"but only 1\.0 MiB"):
        check_fits(10_000_000, "cpu", 3, available=2**20)
    assert check_fits(1000, "cpu", 3, available=2**30) > 0

    save_ply(random_scene(200, 3), tmp_path / "big.ply")
    import framegraph.renderers.gaussians.scene as scene_mod

    monkeypatch.setattr(scene_mod, "available_bytes", lambda device: 1000)
    read = []
    monkeypatch.setattr(np, "fromfile", lambda *a, **k: read.append(1))
    with pytest.raises(SceneTooLargeError, match=r"big\.ply: 200 Gaussians"):
        load_ply(tmp_path / "big.ply")
    assert not read, "refused before reading the data"


def splat_bytes(pos, scale, rgba, rot):
    dtype = np.dtype([("p", "<f4", 3), ("s", "<f4", 3), ("c", "u1", 4), ("r", "u1", 4)])
    rec = np.zeros(len(pos), dtype)
    rec["p"], rec["s"], rec["c"], rec["r"] = pos, scale, rgba, rot
    return rec.tobytes()


def test_splat_import(tmp_path):
    pos = np.array([[0.0, 1.0, 2.0], [-1.0, 0.5, 3.0]], np.float32)
    scale = np.array([[0.1, 0.2, 0.3], [0.01, 0.01, 0.05]], np.float32)
    rgba = np.array([[255, 128, 0, 200], [10, 20, 30, 255]], np.uint8)
    rot = np.array([[255, 128, 128, 128], [128, 255, 128, 128]], np.uint8)  # identity, then 180 deg about x
    path = tmp_path / "s.splat"
    path.write_bytes(splat_bytes(pos, scale, rgba, rot))
    assert path.stat().st_size == 64
    scene = load_scene(path)
    assert scene.n == 2 and scene.sh_degree == 0
    torch.testing.assert_close(scene.means, torch.from_numpy(pos))
    torch.testing.assert_close(scene.scales, torch.from_numpy(scale))
    torch.testing.assert_close(scene.opacities, torch.tensor([200 / 255, 1.0]))
    torch.testing.assert_close(scene.quats, torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]), atol=1e-2, rtol=0)
    colour = scene.sh[:, 0] * SH_C0 + 0.5  # the colour the renderer produces for SH degree 0
    torch.testing.assert_close(colour, torch.from_numpy(rgba[:, :3] / 255.0).float())


def test_bad_splat(tmp_path):
    (tmp_path / "b.splat").write_bytes(b"\x00" * 33)
    with pytest.raises(SceneError, match=r"b\.splat: .*33 bytes is not a multiple of 32"):
        load_splat(tmp_path / "b.splat")
    pos = np.array([[np.nan, 0, 0]], np.float32)
    (tmp_path / "n.splat").write_bytes(splat_bytes(pos, np.ones((1, 3)), np.zeros((1, 4)), np.full((1, 4), 200)))
    with pytest.raises(SceneError, match="position has 1 NaN/Inf"):
        load_splat(tmp_path / "n.splat")


def test_scene_dataclass():
    scene = random_scene(12, 2)
    assert scene.n == 12 and scene.sh_degree == 2 and scene.device.type == "cpu"
    moved = scene.to("cpu", torch.float64)
    assert moved.means.dtype == torch.float64 and moved.n == 12
    with pytest.raises(SceneError, match=r"quats must have shape \[12, 4\]"):
        GaussianScene(scene.means, scene.quats[:5], scene.scales, scene.opacities, scene.sh)
    with pytest.raises(SceneError, match="K=5"):
        GaussianScene(scene.means, scene.quats, scene.scales, scene.opacities, torch.zeros(12, 5, 3))
