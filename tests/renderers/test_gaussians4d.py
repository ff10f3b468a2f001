"""4D Gaussian splatting: rotation, temporal slice, colour, rendering; Triton (interpreter) vs reference.

The slice is checked against a dense computation from the full 4x4 covariance with torch.linalg
(precision-matrix route, independent of the Schur formula the code uses); colours against a
transcription of fudan-zvg's ``eval_shfs_4d`` polynomial forms.
"""
import math
from functools import partial

import pytest
import torch
from helpers import DEVICE

from framegraph.kernels.backend import triton_available
from framegraph.renderers.cameras import intrinsics, look_at
from framegraph.renderers.gaussians import TileCapacity, rasterize
from framegraph.renderers.gaussians import reference as ref3d
from framegraph.renderers.gaussians4d import CULL_THRESHOLD, random_scene_4d, rasterize_4d, slice_gaussians
from framegraph.renderers.gaussians4d import reference as ref

HAS_TRITON = triton_available(DEVICE)  # on DEVICE: CUDA where there is one, Triton's interpreter on CPU
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton (or its interpreter) not available")
W, H = 64, 48
F64 = torch.float64


def _random_gaussians(n, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same Gaussians on every device
    return dict(
        means=torch.randn(n, 3, generator=g).to(device, dtype),
        times=torch.rand(n, generator=g).to(device, dtype),
        scales=(torch.rand(n, 4, generator=g) * 0.3 + 0.05).to(device, dtype),
        quats_l=torch.randn(n, 4, generator=g).to(device, dtype) * 3,  # unnormalised on purpose
        quats_r=torch.randn(n, 4, generator=g).to(device, dtype) * 0.5,
        opacities=torch.rand(n, generator=g).to(device, dtype),
    )


def _quat_mul(p, q):
    """Hamilton product of quaternions (w, x, y, z), written out."""
    pw, px, py, pz = p.unbind(-1)
    qw, qx, qy, qz = q.unbind(-1)
    return torch.stack([pw * qw - px * qx - py * qy - pz * qz, pw * qx + px * qw + py * qz - pz * qy,
                        pw * qy - px * qz + py * qw + pz * qx, pw * qz + px * qy - py * qx + pz * qw], -1)


def _dense_rotation(ql, qr):
    """R v = q_l * v * conj(q_r) (the isoclinic decomposition), built column by column from basis vectors."""
    ql = ql / ql.norm(dim=-1, keepdim=True)
    qr = qr / qr.norm(dim=-1, keepdim=True)
    conj = qr * torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=qr.dtype)
    cols = [_quat_mul(_quat_mul(ql, e.expand_as(ql)), conj) for e in torch.eye(4, dtype=ql.dtype)]
    return torch.stack(cols, dim=-1)


def make_cameras(n=2, width=W, height=H, radius=3.5):
    eyes = [(radius * math.cos(a), radius * math.sin(a), 0.7 + 0.3 * i) for i, a in enumerate([0.3, 2.2, 4.0][:n])]
    viewmats = torch.stack([look_at(e, (0.0, 0.0, 0.0)) for e in eyes])
    Ks = torch.stack([intrinsics(width, height, fov_deg=55 + 5 * i) for i in range(n)])
    return viewmats, Ks


# ----------------------------------------------------------------------------
# Rotation and covariance
# ----------------------------------------------------------------------------
def test_rotation_from_left_right_quats_is_orthonormal_with_det_one():
    g = _random_gaussians(500, seed=1, dtype=F64)
    R = ref.rotation_4d(g["quats_l"], g["quats_r"])
    assert torch.allclose(R @ R.transpose(-1, -2), torch.eye(4, dtype=F64).expand(500, 4, 4), atol=1e-12)
    assert torch.allclose(torch.linalg.det(R), torch.ones(500, dtype=F64), atol=1e-12)
    # the same map as the quaternion sandwich q_l * v * conj(q_r)
    assert torch.allclose(R, _dense_rotation(g["quats_l"], g["quats_r"]), atol=1e-12)


def test_any_rotation_decomposes_into_left_and_right_quaternions():
    Q, _ = torch.linalg.qr(torch.randn(300, 4, 4, generator=torch.Generator().manual_seed(2), dtype=F64))
    Q[:, :, 0] *= torch.linalg.det(Q)[:, None]  # into SO(4)
    ql, qr = ref.rotmat4_to_quats(Q)
    assert torch.allclose(ql.norm(dim=-1), torch.ones(300, dtype=F64))
    assert torch.allclose(ref.rotation_4d(ql, qr), Q, atol=1e-12)


def test_covariance_is_r_s_s_r_transposed():
    g = _random_gaussians(50, seed=3, dtype=F64)
    R = _dense_rotation(g["quats_l"], g["quats_r"])
    dense = R @ torch.diag_embed(g["scales"] ** 2) @ R.transpose(-1, -2)
    assert torch.allclose(ref.covariance_4d(g["scales"], g["quats_l"], g["quats_r"]), dense, atol=1e-12)


# ----------------------------------------------------------------------------
# Temporal slice
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("t", [0.0, 0.37, 1.4])
def test_slice_matches_dense_conditional_gaussian(t):
    g = _random_gaussians(400, seed=4, dtype=F64)
    means3d, covars, opac_t, keep = ref.slice_gaussians(**g, t=t)

    R = _dense_rotation(g["quats_l"], g["quats_r"])
    cov = R @ torch.diag_embed(g["scales"] ** 2) @ R.transpose(-1, -2)
    mu4 = torch.cat([g["means"], g["times"][:, None]], dim=1)
    # conditional mean: mu_x + Sigma_xt Sigma_tt^-1 (t - mu_t), solved by linalg
    rhs = (t - mu4[:, 3:])[:, :, None]
    mean_dense = mu4[:, :3] + (cov[:, :3, 3:] @ torch.linalg.solve(cov[:, 3:, 3:], rhs))[..., 0]
    # conditional covariance = inverse of the spatial block of the precision matrix
    cov_dense = torch.linalg.inv(torch.linalg.inv(cov)[:, :3, :3])
    # temporal marginal relative to its peak, from the 1D normal log-density
    normal = torch.distributions.Normal(g["times"], cov[:, 3, 3].sqrt())
    marginal = torch.exp(normal.log_prob(torch.full_like(g["times"], t)) - normal.log_prob(g["times"]))

    assert torch.allclose(means3d, mean_dense, atol=1e-10)
    assert torch.allclose(ref.covar6_to_mat(covars), cov_dense, atol=1e-10)
    assert torch.allclose(opac_t, g["opacities"] * marginal, atol=1e-12)
    assert torch.equal(keep, marginal > CULL_THRESHOLD)
    assert 0 < int(keep.sum()) < 400  # both sides of the cull are exercised


def test_gaussian_at_its_own_time_keeps_full_opacity_and_schur_covariance():
    g = _random_gaussians(64, seed=5, dtype=F64)
    t = 0.25
    g["times"] = torch.full((64,), t, dtype=F64)
    means3d, covars, opac_t, keep = ref.slice_gaussians(**g, t=t)
    cov = ref.covariance_4d(g["scales"], g["quats_l"], g["quats_r"])
    schur = cov[:, :3, :3] - cov[:, :3, 3:] @ torch.linalg.inv(cov[:, 3:, 3:]) @ cov[:, 3:, :3]
    assert torch.equal(opac_t, g["opacities"]) and keep.all()
    assert torch.equal(means3d, g["means"])
    assert torch.allclose(ref.covar6_to_mat(covars), schur, atol=1e-12)
    assert (torch.linalg.eigvalsh(ref.covar6_to_mat(covars)) > 0).all()  # a valid 3D Gaussian


def test_culling_threshold_is_a_marginal_of_0_05():
    s_t = 0.2
    edge = s_t * math.sqrt(2 * math.log(1 / CULL_THRESHOLD))  # |t - mu_t| where the marginal is exactly 0.05
    n = 4
    one = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(n, 4)
    g = dict(means=torch.zeros(n, 3), times=torch.tensor([0.0, 0.0, 0.0, 0.0]),
             scales=torch.tensor([[0.1, 0.1, 0.1, s_t]]).expand(n, 4), quats_l=one, quats_r=one,
             opacities=torch.ones(n))
    t_values = torch.tensor([0.999, 1.001, -0.999, -1.001]) * edge
    keeps = [bool(ref.slice_gaussians(**{k: v[i:i + 1] for k, v in g.items()}, t=float(t_values[i]))[3])
             for i in range(n)]
    assert keeps == [True, False, True, False]
    # a culled Gaussian draws nothing; a custom threshold keeps it
    viewmats, Ks = make_cameras(1)
    args = {k: v[:1] for k, v in g.items()}
    img, alpha, meta = rasterize_4d(**args, colors=torch.ones(1, 3), t=1.001 * edge, viewmats=viewmats, Ks=Ks,
                                    width=W, height=H)
    assert meta["ids"].numel() == 0 and alpha.max() == 0
    img, alpha, meta = rasterize_4d(**args, colors=torch.ones(1, 3), t=1.001 * edge, viewmats=viewmats, Ks=Ks,
                                    width=W, height=H, cull_threshold=0.01)
    assert meta["ids"].tolist() == [0] and alpha.max() > 0.01


# ----------------------------------------------------------------------------
# Colour: SH x temporal basis
# ----------------------------------------------------------------------------
def _eval_shfs_4d(sh, dirs, dirs_t, duration):
    """fudan-zvg ``eval_shfs_4d`` at deg 3, deg_t 2 (``sh [..., 3, 48]``), transcribed with their constants."""
    C0, C1 = 0.28209479177387814, 0.4886025119029199
    C2 = [1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396]
    C3 = [-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154, -0.4570457994644658,
          1.445305721320277, -0.5900435899266435]
    x, y, z = dirs[..., 0:1], dirs[..., 1:2], dirs[..., 2:3]
    xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
    basis = [C0 + 0 * x, -C1 * y, C1 * z, -C1 * x, C2[0] * xy, C2[1] * yz, C2[2] * (2.0 * zz - xx - yy),
             C2[3] * xz, C2[4] * (xx - yy), C3[0] * y * (3 * xx - yy), C3[1] * xy * z,
             C3[2] * y * (4 * zz - xx - yy), C3[3] * z * (2 * zz - 3 * xx - 3 * yy), C3[4] * x * (4 * zz - xx - yy),
             C3[5] * z * (xx - yy), C3[6] * x * (xx - 3 * yy)]
    t1 = torch.cos(2 * torch.pi * dirs_t / duration)
    t2 = torch.cos(2 * torch.pi * 2 * dirs_t / duration)
    result = 0
    for i, b in enumerate(basis):
        result = result + b * sh[..., i] + t1 * b * sh[..., 16 + i] + t2 * b * sh[..., 32 + i]
    return result


def test_temporal_basis_is_a_cosine_series_over_the_duration():
    T = 2.5
    dt = torch.tensor([0.0, T / 2, T, -T / 4, 0.3], dtype=F64)
    b = ref.temporal_basis(dt, T, 2)
    assert b.shape == (5, 3)
    assert torch.allclose(b[0], torch.ones(3, dtype=F64))
    assert torch.allclose(b[1], torch.tensor([1.0, -1.0, 1.0], dtype=F64))
    assert torch.allclose(b[2], b[0])  # periodic in the duration
    assert torch.allclose(b[3], torch.tensor([1.0, 0.0, -1.0], dtype=F64), atol=1e-12)
    assert torch.allclose(ref.temporal_basis(-dt, T, 2), b)  # even: the sign of mu_t - t does not matter


def test_sh_colors_4d_match_fudan_eval_shfs_4d():
    g = torch.Generator().manual_seed(6)
    n, T = 200, 10.0
    coeffs = torch.randn(n, 48, 3, generator=g, dtype=F64)
    dirs = torch.randn(n, 3, generator=g, dtype=F64) * 4  # not unit length: normalised by the renderer
    dt = (torch.rand(n, generator=g, dtype=F64) - 0.5) * 2 * T
    ours = ref.sh_colors_4d(3, 2, dirs, dt, T, coeffs)
    unit = dirs / dirs.norm(dim=-1, keepdim=True)
    theirs = _eval_shfs_4d(coeffs.transpose(1, 2), unit, dt[:, None], T)
    assert torch.allclose(ours, theirs, atol=1e-10)
    # no temporal blocks: plain 3DGS spherical harmonics
    assert torch.allclose(ref.sh_colors_4d(2, 0, dirs, dt, T, coeffs[:, :9]),
                          ref3d.spherical_harmonics(2, dirs, coeffs[:, :9]), atol=1e-12)
    with pytest.raises(ValueError, match="need 32 coefficients"):
        ref.sh_colors_4d(3, 1, dirs, dt, T, coeffs[:, :20])


# ----------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------
def test_static_4d_gaussians_render_exactly_like_3dgs():
    """4D Gaussians with no space-time tilt, seen at their own time, are the 3DGS scene they contain."""
    g = torch.Generator().manual_seed(7)
    n = 120
    means = (torch.rand(n, 3, generator=g) * 2 - 1)
    quats = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    scales = torch.rand(n, 3, generator=g) * 0.15 + 0.03
    opac = torch.rand(n, generator=g) * 0.9 + 0.05
    sh = torch.randn(n, 16, 3, generator=g) * 0.3
    R4 = torch.zeros(n, 4, 4, dtype=F64)
    R4[:, :3, :3] = ref3d.quat_to_rotmat(quats.double())
    R4[:, 3, 3] = 1.0
    ql, qr = (q.float() for q in ref.rotmat4_to_quats(R4))
    times = torch.rand(n, generator=g)
    t = 0.5
    times[: n // 2] = t  # half exactly at t, the rest faded by their marginal only
    scales4 = torch.cat([scales, torch.full((n, 1), 0.3)], dim=1)
    viewmats, Ks = make_cameras(2)

    img4, alpha4, meta = rasterize_4d(means, times, scales4, ql, qr, opac, sh, t, viewmats, Ks, W, H,
                                      sh_degree=3, duration=2.0, backend="torch")
    marginal = torch.exp(-0.5 * (times - t) ** 2 / 0.09)
    keep = marginal > CULL_THRESHOLD
    img3, alpha3, meta3 = rasterize(means[keep], quats[keep], scales[keep], (opac * marginal)[keep], sh[keep],
                                    viewmats, Ks, W, H, sh_degree=3, backend="torch")
    assert torch.equal(meta["keep"], keep)
    assert torch.equal(meta["radii"], meta3["radii"])
    assert torch.allclose(img4, img3, atol=2e-5) and torch.allclose(alpha4, alpha3, atol=2e-5)
    assert alpha4.max() > 0.5


def test_moving_gaussian_follows_its_velocity_on_screen():
    """A tilted 4D Gaussian's sliced centre moves by v dt; the rendered blob's centroid follows it."""
    from framegraph.renderers.gaussians4d.reference import gaussians_from_motion

    v = torch.tensor([[0.8, 0.0, 0.0]], dtype=F64)
    scales, ql, qr = gaussians_from_motion(torch.eye(3, dtype=F64)[None] * 0.05**2, torch.tensor([0.5], dtype=F64), v)
    args = dict(means=torch.zeros(1, 3), times=torch.zeros(1), scales=scales.float(), quats_l=ql.float(),
                quats_r=qr.float(), opacities=torch.ones(1) * 0.9, colors=torch.ones(1, 1))
    viewmat = look_at((0.0, -3.0, 0.0), (0.0, 0.0, 0.0))[None]
    K = intrinsics(W, H, fov_deg=50)[None]
    xs = []
    for t in (-0.4, 0.0, 0.4):
        _, alpha, meta = rasterize_4d(**args, t=t, viewmats=viewmat, Ks=K, width=W, height=H)
        assert torch.allclose(meta["means3d"][0], torch.tensor([0.8 * t, 0.0, 0.0]), atol=1e-5)
        a = alpha[0, ..., 0]
        xs.append(float((a.sum(0) * (torch.arange(W) + 0.5)).sum() / a.sum()))
    assert xs[0] < xs[1] - 5 and xs[1] < xs[2] - 5  # moves right on screen (camera looks along +y)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(quats_r=torch.zeros_like(a["quats_r"])), "quats_r has 10 zero-norm"),
    (lambda a: a["times"].__setitem__(3, float("nan")), "times contains 1 NaN"),
    (lambda a: a.update(scales=a["scales"][:, :3]), r"scales must have shape \[10, 4\]"),
    (lambda a: a.update(t=float("inf")), "t must be a finite"),
    (lambda a: a["scales"].__setitem__((0, 3), 0.0), "scales has 1 values <= 0"),
])
def test_bad_inputs_raise_clear_errors(change, message):
    s = random_scene_4d(10, 1, 1, seed=8)
    args = dict(s.rasterize_args(), t=0.5)
    args = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    change(args)
    viewmats, Ks = make_cameras(1)
    with pytest.raises((ValueError, TypeError), match=message):
        rasterize_4d(**args, viewmats=viewmats, Ks=Ks, width=W, height=H)


# ----------------------------------------------------------------------------
# Triton against the reference, both on DEVICE (CUDA, or Triton's interpreter on CPU)
# ----------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("n, t", [(300, 0.4), (17, -0.2), (128, 0.9)])
def test_triton_slice_matches_reference(n, t):
    g = _random_gaussians(n, seed=n, device=DEVICE)
    expect = ref.slice_gaussians(**g, t=t)
    got = slice_gaussians(*g.values(), t, backend="triton")
    for name, e, o in zip(("means3d", "covars", "opacities_t"), expect[:3], got[:3]):
        assert torch.allclose(o, e, atol=2e-6, rtol=1e-5), name
    assert torch.equal(got[3], expect[3]) and got[3].dtype == torch.bool


@needs_triton
def test_triton_slice_is_differentiable_like_the_reference():
    g = _random_gaussians(40, seed=9, device=DEVICE)
    weights = [w.to(DEVICE) for w in (torch.randn(40, 3), torch.randn(40, 6), torch.randn(40))]
    grads = {}
    for name, fn in (("torch", lambda *a: ref.slice_gaussians(*a)),
                     ("triton", partial(slice_gaussians, backend="triton"))):
        inputs = [x.clone().requires_grad_(True) for x in g.values()]
        outs = fn(*inputs, 0.6)
        sum((o * w).sum() for o, w in zip(outs[:3], weights)).backward()
        grads[name] = [x.grad for x in inputs]
    for name, a, b in zip(g, grads["triton"], grads["torch"]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), name


@needs_triton
def test_triton_slice_op_has_valid_schema_and_fake_kernel():
    g = _random_gaussians(20, seed=10, device=DEVICE)
    result = torch.library.opcheck(torch.ops.framegraph.gaussians4d_slice.default, (*g.values(), 0.3, 0.05),
                                   test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}


@needs_triton
def test_triton_render_matches_reference():
    scene = random_scene_4d(150, 3, 1, seed=11).to(DEVICE)
    viewmats, Ks = (c.to(DEVICE) for c in make_cameras(2))
    out = {}
    for backend in ("torch", "triton"):
        out[backend] = rasterize_4d(**scene.rasterize_args(), t=0.45, viewmats=viewmats, Ks=Ks, width=W, height=H,
                                    backgrounds=torch.tensor([0.1, 0.2, 0.3], device=DEVICE), backend=backend)
    assert out["triton"][2]["backend"] == "triton"
    assert torch.equal(out["triton"][2]["keep"], out["torch"][2]["keep"])
    assert torch.allclose(out["triton"][0], out["torch"][0], atol=1e-4)
    assert torch.allclose(out["triton"][1], out["torch"][1], atol=1e-4)
    assert out["torch"][1].max() > 0.5


@pytest.mark.gpu
def test_cuda_render_matches_reference():
    scene = random_scene_4d(2000, 3, 1, seed=12)
    viewmats, Ks = make_cameras(2, 128, 96)
    cpu = rasterize_4d(**scene.rasterize_args(), t=0.3, viewmats=viewmats, Ks=Ks, width=128, height=96,
                       backend="torch")
    gpu_scene = scene.to("cuda")
    gpu = rasterize_4d(**gpu_scene.rasterize_args(), t=0.3, viewmats=viewmats.cuda(), Ks=Ks.cuda(), width=128,
                       height=96)
    assert gpu[2]["backend"] == "triton"
    assert torch.allclose(gpu[0].cpu(), cpu[0], atol=1e-3)


# ----------------------------------------------------------------------------
# Culling by mask + fixed-capacity tile lists (the render stage's sync-free path) vs compaction
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("render_mode", ["RGB", "RGB+ED"])
def test_masked_culling_renders_what_compaction_does(render_mode):
    scene = random_scene_4d(200, 3, 1, seed=13)
    viewmats, Ks = make_cameras(2)
    tiles = TileCapacity()
    for t in (0.1, 0.45, 0.8):  # one capacity across frames, as the render stage keeps it
        kw = dict(t=t, viewmats=viewmats, Ks=Ks, width=W, height=H, render_mode=render_mode,
                  backgrounds=torch.tensor([0.1, 0.2, 0.3]), backend="torch")
        ref, ref_alpha, ref_meta = rasterize_4d(**scene.rasterize_args(), **kw)
        out, alpha, meta = rasterize_4d(**scene.rasterize_args(), tiles=tiles, **kw)
        assert 0 < ref_meta["ids"].numel() < 200 and meta["ids"] is None  # some culled, none compacted
        assert torch.equal(meta["isect_offsets"], ref_meta["isect_offsets"])
        assert int(meta["n_isects"]) == ref_meta["flatten_ids"].numel()
        torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(alpha, ref_alpha, atol=2e-6, rtol=1e-5)
    assert tiles.overflows == 0


@needs_triton
def test_triton_render_with_masked_culling_matches_reference():
    scene = random_scene_4d(150, 3, 1, seed=14).to(DEVICE)
    viewmats, Ks = (c.to(DEVICE) for c in make_cameras(2))
    kw = dict(t=0.45, viewmats=viewmats, Ks=Ks, width=W, height=H, backgrounds=torch.tensor([0.1, 0.2, 0.3],
                                                                                            device=DEVICE))
    ref = rasterize_4d(**scene.rasterize_args(), backend="torch", **kw)
    out = rasterize_4d(**scene.rasterize_args(), backend="triton", tiles=TileCapacity(), **kw)
    assert torch.allclose(out[0], ref[0], atol=1e-4) and torch.allclose(out[1], ref[1], atol=1e-4)
