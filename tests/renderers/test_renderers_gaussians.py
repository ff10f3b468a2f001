"""3DGS rasterizer: reference and Triton backends against an independent brute-force renderer.

The brute-force renderer below is written from gsplat's semantics
(``gsplat/cuda/_torch_impl.py`` + its CUDA kernels' constants) without tiles,
sorting keys or cumulative products: for every pixel it walks all Gaussians
in depth order. gsplat itself needs CUDA to build, so this stands in for the
"matches gsplat" check (PSNR >= 45 dB).
"""
import math
from functools import partial

import pytest
import torch
from helpers import DEVICE

from framegraph.kernels.backend import triton_available
from framegraph.renderers.cameras import intrinsics, look_at
from framegraph.renderers.capacity import Capacity
from framegraph.renderers.gaussians import TileCapacity, random_scene, rasterize, rasterize_to_pixels, reference
from framegraph.stream.audit import OpCounter

CPU = torch.device("cpu")
HAS_TRITON = triton_available(DEVICE)
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton (or its interpreter) not available")
W, H = 64, 48


def on(device, args):
    """``args`` (a dict) with its tensors on ``device``: the Triton cases run on DEVICE (CUDA where there is
    one, Triton's interpreter on CPU); the brute force and the float64 checks stay on the CPU."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def device_of(backend):
    return DEVICE if backend == "triton" else CPU


# ----------------------------------------------------------------------------
# Independent brute-force renderer (float64, per pixel, no tiles)
# ----------------------------------------------------------------------------
def _bf_rotation(q):
    q = q / q.norm(dim=-1, keepdim=True)
    w, v = q[:, :1], q[:, 1:]
    eye = torch.eye(3, dtype=q.dtype).expand(q.shape[0], 3, 3)
    cross = torch.zeros(q.shape[0], 3, 3, dtype=q.dtype)
    cross[:, 0, 1], cross[:, 0, 2], cross[:, 1, 2] = -v[:, 2], v[:, 1], -v[:, 0]
    cross = cross - cross.transpose(1, 2)
    # Rodrigues form of a unit quaternion: (w^2 - |v|^2) I + 2 v v^T + 2 w [v]x
    return ((w * w - (v * v).sum(1, keepdim=True))[:, :, None] * eye + 2 * v[:, :, None] * v[:, None, :]
            + 2 * w[:, :, None] * cross)


def _bf_sh(degree, d, coeffs):
    """SH colour in gsplat's "fast" (Sloan) formulation: a different route to the same basis."""
    x, y, z = d.unbind(-1)
    b = [torch.full_like(x, 0.2820947917738781)]
    if degree > 0:
        b += [-0.48860251190292 * y, 0.48860251190292 * z, -0.48860251190292 * x]
    if degree > 1:
        fC1, fS1 = x * x - y * y, 2 * x * y
        b += [0.5462742152960395 * fS1, -1.092548430592079 * z * y, 0.9461746957575601 * z * z - 0.3153915652525201,
              -1.092548430592079 * z * x, 0.5462742152960395 * fC1]
    if degree > 2:
        fC2, fS2 = x * fC1 - y * fS1, x * fS1 + y * fC1
        tC = -2.285228997322329 * z * z + 0.4570457994644658
        b += [-0.5900435899266435 * fS2, 1.445305721320277 * z * fS1, tC * y,
              z * (1.865881662950577 * z * z - 1.119528997770346), tC * x, 1.445305721320277 * z * fC1,
              -0.5900435899266435 * fC2]
    basis = torch.stack(b, -1)
    return (basis[:, :, None] * coeffs[:, : basis.shape[-1]]).sum(1)


def brute_force(means, quats, scales, opacities, colors, viewmats, Ks, width, height, *, sh_degree=None,
                backgrounds=None, eps2d=0.3, near=0.01, far=1e10, alpha_cap=0.999, depth=False):
    """Images [C, H, W, D] and alphas [C, H, W, 1]: every pixel blends every Gaussian nearest first."""
    f64 = {k: v.double() for k, v in dict(means=means, quats=quats, scales=scales, opacities=opacities,
                                             colors=colors, viewmats=viewmats, Ks=Ks).items()}
    means, quats, scales, opacities = f64["means"], f64["quats"], f64["scales"], f64["opacities"]
    colors, viewmats, Ks = f64["colors"], f64["viewmats"], f64["Ks"]
    Rg = _bf_rotation(quats)
    cov3 = Rg @ torch.diag_embed(scales ** 2) @ Rg.transpose(1, 2)
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float64) + 0.5,
                            torch.arange(width, dtype=torch.float64) + 0.5, indexing="ij")
    images, alphas = [], []
    for c in range(viewmats.shape[0]):
        R, t = viewmats[c, :3, :3], viewmats[c, :3, 3]
        fx, fy, cx, cy = Ks[c, 0, 0], Ks[c, 1, 1], Ks[c, 0, 2], Ks[c, 1, 2]
        p = means @ R.T + t
        if sh_degree is None:
            col = colors
        else:
            campos = -R.T @ t
            d = means - campos
            col = torch.clamp(_bf_sh(sh_degree, d / d.norm(dim=-1, keepdim=True), colors) + 0.5, min=0)
        if depth:
            col = torch.cat([col, p[:, 2:3]], dim=1)
        img = torch.zeros(height, width, col.shape[1], dtype=torch.float64)
        T = torch.ones(height, width, dtype=torch.float64)
        active = torch.ones(height, width, dtype=torch.bool)
        for i in torch.argsort(p[:, 2]).tolist():
            x, y, z = p[i]
            if not near <= z <= far:
                continue
            limx = (1.3 * 0.5 * width / fx, (width - cx) / fx + 0.3 * 0.5 * width / fx,
                    cx / fx + 0.3 * 0.5 * width / fx)
            limy = (1.3 * 0.5 * height / fy, (height - cy) / fy + 0.3 * 0.5 * height / fy,
                    cy / fy + 0.3 * 0.5 * height / fy)
            u = min(max(x / z, -limx[2]), limx[1])
            v = min(max(y / z, -limy[2]), limy[1])
            J = torch.stack([torch.stack([fx / z, 0 * z, -fx * u / z]), torch.stack([0 * z, fy / z, -fy * v / z])])
            cov2 = J @ (R @ cov3[i] @ R.T) @ J.T + eps2d * torch.eye(2, dtype=torch.float64)
            if torch.det(cov2) <= 0:
                continue
            inv = torch.linalg.inv(cov2)
            mx, my = fx * x / z + cx, fy * y / z + cy
            dx, dy = mx - xs, my - ys
            sigma = 0.5 * (inv[0, 0] * dx * dx + inv[1, 1] * dy * dy) + inv[0, 1] * dx * dy
            alpha = torch.clamp(opacities[i] * torch.exp(-sigma), max=alpha_cap)
            hit = active & (sigma >= 0) & (alpha >= 1 / 255)
            next_T = T * (1 - alpha)
            finished = hit & (next_T <= 1e-4)
            active &= ~finished
            hit &= ~finished
            img += torch.where(hit, alpha * T, 0.0)[..., None] * col[i]
            T = torch.where(hit, next_T, T)
        if backgrounds is not None:
            bg = backgrounds[c].double()
            if depth:
                bg = torch.cat([bg, bg.new_zeros(1)])
            img += T[..., None] * bg
        images.append(img)
        alphas.append(1 - T)
    return torch.stack(images), torch.stack(alphas)[..., None]


def psnr(a, b):
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


# ----------------------------------------------------------------------------
# Scenes
# ----------------------------------------------------------------------------
def make_cameras(n=3, width=W, height=H, radius=3.2):
    eyes = [(radius * math.cos(a), radius * math.sin(a), 0.8 * (i - 1)) for i, a in
            enumerate(torch.linspace(0, 2 * math.pi, n + 1)[:n].tolist())]
    viewmats = torch.stack([look_at(e, (0.0, 0.0, 0.0)) for e in eyes])
    Ks = torch.stack([intrinsics(width, height, fov_deg=55 + 5 * i) for i in range(n)])
    if n > 1:
        Ks[1, 0, 2] += 3.0  # an off-centre principal point
    return viewmats, Ks


def make_scene(n=100, sh_degree=3, seed=0):
    scene = random_scene(n, sh_degree, seed=seed, scale_range=(0.05, 0.25))
    args = scene.rasterize_args()
    # a few Gaussians the projection must cull: behind a camera, far off screen, tiny opacity
    args["means"][:3] = torch.tensor([[8.0, 0.0, 0.0], [0.0, 40.0, 0.0], [3.3, 0.0, 0.0]])
    args["opacities"][3] = 1e-3
    return args


def grad_inputs(args):
    return {k: (v.detach().clone().requires_grad_(True) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


# ----------------------------------------------------------------------------
# Correctness against the brute force
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_rgb_matches_brute_force_sh3_several_cameras(backend):
    args = make_scene(100, 3, seed=1)
    viewmats, Ks = make_cameras(3)
    bg = torch.tensor([[0.1, 0.2, 0.3], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    img, alpha, meta = rasterize(**on(device_of(backend), dict(args, viewmats=viewmats, Ks=Ks, backgrounds=bg)),
                                 width=W, height=H, backend=backend)
    img, alpha = img.cpu(), alpha.cpu()
    ref_img, ref_alpha = brute_force(**args, viewmats=viewmats, Ks=Ks, width=W, height=H, backgrounds=bg)
    assert meta["backend"] == backend
    assert img.shape == (3, H, W, 3) and alpha.shape == (3, H, W, 1)
    assert alpha.mean() > 0.1, "scene should cover a good part of the images"
    for c in range(3):
        assert psnr(img[c], ref_img[c]) >= 45, f"camera {c}"
        assert psnr(alpha[c], ref_alpha[c]) >= 45
    assert (meta["radii"][0, :3] == 0).all(), "behind camera 0, off its screen, or inside its near plane"
    assert (meta["radii"][:, 3] == 0).all(), "opacity < 1/255 is culled everywhere"


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_depth_modes_match_brute_force(backend):
    args = make_scene(60, 1, seed=2)
    viewmats, Ks = make_cameras(2)
    ref_img, ref_alpha = brute_force(**args, viewmats=viewmats, Ks=Ks, width=W, height=H, depth=True)
    inputs = on(device_of(backend), dict(args, viewmats=viewmats, Ks=Ks))
    rgbd, alpha, _ = rasterize(**inputs, width=W, height=H, render_mode="RGB+D", backend=backend)
    rgbd = rgbd.cpu()
    assert rgbd.shape[-1] == 4
    assert psnr(rgbd[..., :3], ref_img[..., :3]) >= 45
    # depth is in scene units (~3); compare relative to its range
    assert psnr(rgbd[..., 3:] / 5, ref_img[..., 3:] / 5) >= 45
    d, _, _ = rasterize(**inputs, width=W, height=H, render_mode="D", backend=backend)
    torch.testing.assert_close(d.cpu(), rgbd[..., 3:], atol=1e-4, rtol=1e-5)
    ed, alpha_ed, _ = rasterize(**inputs, width=W, height=H, render_mode="ED", backend=backend)
    ed = ed.cpu()
    covered = ref_alpha[..., 0] > 0.5
    expected = (ref_img[..., 3:] / ref_alpha.clamp(min=1e-10))[covered]
    torch.testing.assert_close(ed[covered].double(), expected, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("alpha_cap", [0.999, 0.99])
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_opaque_stack_terminates_like_gsplat(backend, alpha_cap):
    """Many opaque Gaussians on one spot: the transmittance cut-off (1e-4) and the alpha cap decide the pixel."""
    n = 40
    g = torch.Generator().manual_seed(3)
    means = torch.zeros(n, 3)
    means[:, 2] = torch.linspace(-1, 1, n)
    means[:, :2] = torch.randn(n, 2, generator=g) * 0.05
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1)
    scales = torch.full((n, 3), 0.3)
    opacities = torch.full((n,), 0.995)
    colors = torch.rand(n, 3, generator=g)
    viewmats = look_at((0.0, 0.0, -4.0), (0.0, 0.0, 0.0), up=(0.0, -1.0, 0.0))[None]
    Ks = intrinsics(W, H, fov_deg=40)[None]
    kw = dict(viewmats=viewmats, Ks=Ks, width=W, height=H, alpha_cap=alpha_cap)
    scene = dict(means=means, quats=quats, scales=scales, opacities=opacities, colors=colors)
    img, alpha, _ = rasterize(**on(device_of(backend), scene | kw), backend=backend)
    img, alpha = img.cpu(), alpha.cpu()
    ref_img, ref_alpha = brute_force(**scene, **kw)
    assert psnr(img, ref_img) >= 45 and psnr(alpha, ref_alpha) >= 45
    assert alpha.max() > 0.999


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_image_size_not_a_multiple_of_the_tile(backend):
    args = make_scene(60, 2, seed=17)
    viewmats, Ks = make_cameras(2, 50, 37)
    img, alpha, meta = rasterize(**on(device_of(backend), dict(args, viewmats=viewmats, Ks=Ks)), width=50, height=37,
                                 backend=backend)
    ref_img, ref_alpha = brute_force(**args, viewmats=viewmats, Ks=Ks, width=50, height=37)
    assert (meta["tile_width"], meta["tile_height"]) == (4, 3)
    assert psnr(img.cpu(), ref_img) >= 45 and psnr(alpha.cpu(), ref_alpha) >= 45


def test_antialiased_mode_and_radius_clip():
    args = make_scene(60, 0, seed=18)
    viewmats, Ks = make_cameras(1)
    kw = dict(viewmats=viewmats, Ks=Ks, width=W, height=H, backend="torch")
    _, alpha, _ = rasterize(**args, **kw)
    _, alpha_aa, meta = rasterize(**args, rasterize_mode="antialiased", **kw)
    assert alpha_aa.sum() < alpha.sum(), "the Mip-Splatting factor only lowers opacity"
    assert (meta["opacities"] <= args["opacities"][None] + 1e-7).all()
    img, alpha_clip, meta = rasterize(**args, radius_clip=1000.0, **kw)
    assert alpha_clip.abs().max() == 0 and (meta["radii"] == 0).all()
    if HAS_TRITON:  # the Triton kernels against the reference, both run on DEVICE
        inputs = on(DEVICE, args | kw)
        _, alpha_aa_ref, _ = rasterize(**inputs, rasterize_mode="antialiased")
        img_aa_t, alpha_aa_t, _ = rasterize(**dict(inputs, backend="triton"), rasterize_mode="antialiased")
        torch.testing.assert_close(alpha_aa_t, alpha_aa_ref, atol=2e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# Triton vs reference, forward and backward
# ----------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("tile_size,render_mode,alpha_cap", [(16, "RGB+ED", 0.999), (8, "RGB", 0.99)])
def test_triton_forward_matches_reference(tile_size, render_mode, alpha_cap):
    args = on(DEVICE, make_scene(120, 3, seed=4))
    viewmats, Ks = make_cameras(2)
    kw = dict(viewmats=viewmats.to(DEVICE), Ks=Ks.to(DEVICE), width=W, height=H, tile_size=tile_size,
              render_mode=render_mode, alpha_cap=alpha_cap, backgrounds=torch.tensor([0.3, 0.5, 0.7], device=DEVICE))
    ref, ref_alpha, ref_meta = rasterize(**args, backend="torch", **kw)
    out, alpha, meta = rasterize(**args, backend="triton", **kw)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(alpha, ref_alpha, atol=2e-5, rtol=1e-5)
    assert torch.equal(meta["flatten_ids"], ref_meta["flatten_ids"])


def _loss(img, alpha, seed=0):
    g = torch.Generator().manual_seed(seed)  # the same weights on every device
    w_img, w_alpha = (torch.randn(t.shape, generator=g).to(t.device) for t in (img, alpha))
    return (img * w_img).sum() + (alpha * w_alpha).sum()


def _assert_grads_close(got, want, name):
    scale = want.abs().max().clamp(min=1e-6)
    err = (got - want).abs().max() / scale
    assert err < 2e-4, f"{name}: max error {err:.2e} relative to max |grad| {scale:.3g}"


@needs_triton
def test_triton_backward_matches_autograd_through_reference():
    """The kernel's gradients w.r.t. means2d, conics, colors, opacities (rasterize_to_pixels level)."""
    args = on(DEVICE, make_scene(100, 0, seed=5))
    viewmats, Ks = (t.to(DEVICE) for t in make_cameras(2))
    C = 2
    radii, means2d, depths, conics, _ = reference.project_gaussians(
        args["means"], args["quats"], args["scales"], viewmats, Ks, W, H, opacities=args["opacities"])
    colors = torch.rand(C, args["means"].shape[0], 4, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    opac = args["opacities"][None].expand(C, -1).contiguous()
    tw, th = reference.tile_grid(W, H, 16)
    _, isect_ids, flatten_ids = reference.isect_tiles(means2d, radii, depths, 16, tw, th)
    offsets = reference.isect_offsets(isect_ids, C, tw, th)
    bg = torch.rand(C, 4, generator=torch.Generator().manual_seed(7)).to(DEVICE)

    grads = {}
    for name, fn in (("torch", reference.rasterize_to_pixels),
                     ("triton", partial(rasterize_to_pixels, backend="triton"))):
        inputs = [t.detach().clone().requires_grad_(True) for t in (means2d, conics, colors, opac, bg)]
        img, alpha = fn(*inputs[:4], W, H, 16, offsets, flatten_ids, backgrounds=inputs[4])
        _loss(img, alpha).backward()
        grads[name] = [t.grad for t in inputs]
    for label, got, want in zip(("means2d", "conics", "colors", "opacities", "backgrounds"),
                                grads["triton"], grads["torch"]):
        _assert_grads_close(got, want, label)


@needs_triton
def test_end_to_end_gradients_match_between_backends():
    args = on(DEVICE, make_scene(80, 3, seed=8))
    viewmats, Ks = (t.to(DEVICE) for t in make_cameras(2))
    grads = {}
    for backend in ("torch", "triton"):
        p = grad_inputs(args)
        bg = torch.full((2, 3), 0.25, device=DEVICE, requires_grad=True)
        img, alpha, _ = rasterize(**p, viewmats=viewmats, Ks=Ks, width=W, height=H, backgrounds=bg,
                                  render_mode="RGB+D", backend=backend)
        _loss(img, alpha, seed=1).backward()
        grads[backend] = {k: p[k].grad for k in ("means", "quats", "scales", "opacities", "colors")} | {"bg": bg.grad}
    for k in grads["torch"]:
        _assert_grads_close(grads["triton"][k], grads["torch"][k], k)


@needs_triton
def test_triton_ops_have_valid_schemas_and_fake_kernels():
    """Registered as torch ops with fake implementations, so graphs can capture them."""
    args = on(DEVICE, make_scene(20, 0, seed=19))
    viewmats, Ks = (t.to(DEVICE) for t in make_cameras(1, 32, 32))
    radii, means2d, depths, conics, _ = reference.project_gaussians(
        args["means"], args["quats"], args["scales"], viewmats, Ks, 32, 32, opacities=args["opacities"])
    _, isect_ids, flatten_ids = reference.isect_tiles(means2d, radii, depths, 16, 2, 2)
    offsets = reference.isect_offsets(isect_ids, 1, 2, 2)
    offsets = torch.cat([offsets.flatten(), offsets.new_tensor([flatten_ids.numel()])]).int()
    fwd_args = (means2d.detach().contiguous(), conics.detach().contiguous(), torch.rand(1, 20, 3, device=DEVICE),
                args["opacities"][None].contiguous(), offsets, flatten_ids, 32, 32, 16, 0.999)
    checks = ("test_schema", "test_faketensor")
    fwd, bwd = torch.ops.framegraph.gaussians_rasterize_fwd, torch.ops.framegraph.gaussians_rasterize_bwd
    assert set(torch.library.opcheck(fwd.default, fwd_args, test_utils=checks).values()) == {"SUCCESS"}
    out, trans = fwd(*fwd_args)
    bwd_args = ([*fwd_args[:6], out, trans], torch.rand_like(out), torch.rand_like(trans), *fwd_args[6:])
    assert set(torch.library.opcheck(bwd.default, bwd_args, test_utils=checks).values()) == {"SUCCESS"}


def test_reference_gradcheck_float64():
    """Autograd through the reference agrees with finite differences (smooth region of a tiny scene)."""
    g = torch.Generator().manual_seed(9)
    n = 5
    means = (torch.rand(n, 3, generator=g, dtype=torch.float64) - 0.5) * 0.6
    quats = torch.randn(n, 4, generator=g, dtype=torch.float64)
    log_scales = torch.log(torch.rand(n, 3, generator=g, dtype=torch.float64) * 0.1 + 0.15)
    opac = torch.rand(n, generator=g, dtype=torch.float64) * 0.5 + 0.3
    sh = torch.randn(n, 4, 3, generator=g, dtype=torch.float64) * 0.3
    viewmats = look_at((0.0, -2.5, 0.5), (0.0, 0.0, 0.0)).double()[None]
    Ks = intrinsics(16, 16, fov_deg=50).double()[None]

    def render(means, quats, log_scales, opac, sh):
        img, alpha, _ = rasterize(means, quats, torch.exp(log_scales), opac, sh, viewmats, Ks, 16, 16,
                                  sh_degree=1, tile_size=8, backend="torch")
        return img, alpha

    inputs = [t.requires_grad_(True) for t in (means, quats, log_scales, opac, sh)]
    assert torch.autograd.gradcheck(render, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)


# ----------------------------------------------------------------------------
# API behaviour
# ----------------------------------------------------------------------------
def test_quaternions_are_normalised_and_colors_may_be_per_camera():
    args = make_scene(50, 0, seed=10)
    viewmats, Ks = make_cameras(2)
    kw = dict(viewmats=viewmats, Ks=Ks, width=W, height=H, backend="torch")
    img, _, _ = rasterize(**args, **kw)
    scaled = dict(args, quats=args["quats"] * 3.7)
    img2, _, _ = rasterize(**scaled, **kw)
    torch.testing.assert_close(img, img2, atol=1e-5, rtol=1e-5)
    rgb = torch.rand(50, 3)
    plain = dict(args, colors=rgb, sh_degree=None)
    per_cam = dict(plain, colors=rgb[None].expand(2, -1, -1))
    torch.testing.assert_close(rasterize(**plain, **kw)[0], rasterize(**per_cam, **kw)[0])


def test_empty_scene_renders_background():
    viewmats, Ks = make_cameras(1)
    empty = torch.zeros(0, 3)
    img, alpha, meta = rasterize(empty, torch.zeros(0, 4) + 1, empty, torch.zeros(0), torch.zeros(0, 3), viewmats, Ks,
                                 W, H, backgrounds=torch.tensor([[0.2, 0.4, 0.6]]))
    assert torch.allclose(img, torch.tensor([0.2, 0.4, 0.6]).expand_as(img)) and alpha.abs().max() == 0
    assert meta["flatten_ids"].numel() == 0


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(means=torch.zeros(10, 2)), "means must have shape [*, 3]"),
        (dict(quats=torch.zeros(9, 4)), "quats must have shape [10, 4]"),
        (dict(opacities=torch.zeros(10, 1)), "opacities must have shape [10]"),
        (dict(colors=torch.zeros(10, 3, 3)), "needs 16 SH coefficients"),
        (dict(viewmats=torch.eye(4)), "viewmats must have shape [*, 4, 4]"),
        (dict(Ks=torch.eye(3)[None].repeat(2, 1, 1)), "Ks must have shape [1, 3, 3]"),
        (dict(sh_degree=4), "sh_degree must be"),
        (dict(render_mode="RGBD"), "render_mode must be one of"),
        (dict(backend="cuda"), "rasterize: backend='cuda'; expected one of"),
        (dict(width=0), "width must be a positive int"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, message):
    args = dict(make_scene(10, 3, seed=11))
    viewmats, Ks = make_cameras(1)
    kw = dict(args, viewmats=viewmats, Ks=Ks, width=W, height=H) | change
    with pytest.raises((ValueError, TypeError)) as info:
        rasterize(**kw)
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["means", "scales", "opacities", "colors", "viewmats"])
def test_nan_and_inf_are_rejected_naming_the_tensor(name):
    args = dict(make_scene(10, 3, seed=12))
    viewmats, Ks = make_cameras(1)
    kw = dict(args, viewmats=viewmats, Ks=Ks, width=W, height=H)
    bad = kw[name].clone()
    bad.view(-1)[3] = float("nan") if name != "scales" else float("inf")
    kw[name] = bad
    with pytest.raises(ValueError, match=rf"^{name} contains 1 NaN or Inf"):
        rasterize(**kw)


def test_zero_quaternion_is_rejected():
    args = dict(make_scene(10, 3, seed=13))
    args["quats"][4] = 0
    viewmats, Ks = make_cameras(1)
    with pytest.raises(ValueError, match="zero-norm"):
        rasterize(**args, viewmats=viewmats, Ks=Ks, width=W, height=H)


@needs_triton
@pytest.mark.parametrize("change, error, message", [
    (dict(tile_size=12), ValueError, r"tile_size in \(4, 8, 16, 32\), got 12; use backend='torch'"),
    (dict(dtype=torch.float64), TypeError, r"compute in float32, got torch.float64"),
])
def test_triton_backend_refuses_what_its_kernels_cannot_do(change, error, message):
    dtype = change.pop("dtype", torch.float32)
    args = {k: v.to(DEVICE, dtype) if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in make_scene(10, 0, seed=14).items()}
    viewmats, Ks = make_cameras(1)
    with pytest.raises(error, match=message):
        rasterize(**args, viewmats=viewmats.to(DEVICE, dtype), Ks=Ks.to(DEVICE, dtype), width=W, height=H,
                  backend="triton", **change)


def test_auto_backend_uses_reference_on_cpu():
    args = make_scene(10, 3, seed=14)
    viewmats, Ks = make_cameras(1)
    _, _, meta = rasterize(**args, viewmats=viewmats, Ks=Ks, width=W, height=H)
    assert meta["backend"] == "torch"


# ----------------------------------------------------------------------------
# GPU (skipped without CUDA)
# ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.gpu
def test_cuda_triton_matches_reference_forward_and_backward():
    scene = random_scene(3000, 3, seed=15, device="cuda")
    viewmats, Ks = make_cameras(2, 256, 192, radius=3.0)
    viewmats, Ks = viewmats.cuda(), Ks.cuda()
    outs = {}
    for backend in ("torch", "triton"):
        p = grad_inputs(scene.rasterize_args())
        img, alpha, meta = rasterize(**p, viewmats=viewmats, Ks=Ks, width=256, height=192, backend=backend)
        assert meta["backend"] == backend
        _loss(img.cpu(), alpha.cpu()).backward()
        outs[backend] = (img.detach(), {k: p[k].grad for k in ("means", "scales", "opacities", "colors")})
    assert psnr(outs["triton"][0], outs["torch"][0]) >= 60
    for k in outs["torch"][1]:
        _assert_grads_close(outs["triton"][1][k], outs["torch"][1][k], k)


@pytest.mark.gpu
@pytest.mark.gpu
def test_cuda_triton_matches_brute_force():
    args = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in make_scene(100, 3, seed=16).items()}
    viewmats, Ks = make_cameras(3)
    img, alpha, _ = rasterize(**args, viewmats=viewmats.cuda(), Ks=Ks.cuda(), width=W, height=H, backend="triton")
    ref_img, ref_alpha = brute_force(**{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in args.items()},
                                     viewmats=viewmats, Ks=Ks, width=W, height=H)
    assert psnr(img.cpu(), ref_img) >= 45 and psnr(alpha.cpu(), ref_alpha) >= 45


# ----------------------------------------------------------------------------
# Fixed-capacity tile lists (the render stages' sync-free path) vs the data-sized ones
# ----------------------------------------------------------------------------
def _orbit_cameras(n, width=W, height=H):
    eyes = [(3.2 * math.cos(a), 3.2 * math.sin(a), 0.5) for a in torch.linspace(0, 2 * math.pi, n + 1)[:n].tolist()]
    return [(look_at(e, (0.0, 0.0, 0.0))[None], intrinsics(width, height, fov_deg=55)[None]) for e in eyes]


@pytest.mark.parametrize("tile_size,render_mode", [(16, "RGB"), (8, "RGB+ED")])
def test_fixed_capacity_tile_lists_render_what_the_data_sized_ones_do(tile_size, render_mode):
    args = make_scene(150, 3, seed=6)
    tiles = TileCapacity()
    kw = dict(width=W, height=H, tile_size=tile_size, render_mode=render_mode,
              backgrounds=torch.tensor([0.3, 0.5, 0.7]), backend="torch")
    for viewmats, Ks in _orbit_cameras(6):  # one capacity across frames, as a render stage keeps it
        ref, ref_alpha, ref_meta = rasterize(**args, viewmats=viewmats, Ks=Ks, **kw)
        out, alpha, meta = rasterize(**args, viewmats=viewmats, Ks=Ks, tiles=tiles, **kw)
        M = ref_meta["flatten_ids"].numel()
        assert int(meta["n_isects"]) == M and meta["flatten_ids"].numel() >= M
        assert torch.equal(meta["isect_ids"][:M], ref_meta["isect_ids"])
        assert torch.equal(meta["flatten_ids"][:M], ref_meta["flatten_ids"])
        assert torch.equal(meta["isect_offsets"], ref_meta["isect_offsets"])
        # the torch twin of the Triton kernel sums in batches: equal up to float32 rounding
        torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(alpha, ref_alpha, atol=2e-6, rtol=1e-5)
    assert tiles.overflows == 0


def test_an_overflowing_frame_drops_overlaps_then_the_capacity_grows():
    args = make_scene(150, 3, seed=7)
    tiles = TileCapacity(Capacity(headroom=1.0, quantum=1), Capacity(headroom=1.0, quantum=1))
    (viewmats, Ks), = _orbit_cameras(1)
    kw = dict(viewmats=viewmats, Ks=Ks, width=W, height=H, backend="torch")
    few = dict(args, opacities=torch.where(torch.arange(150) < 50, args["opacities"], 0.0))
    rasterize(**few, tiles=tiles, **kw)  # warm-up: sized for a third of the Gaussians
    small = tiles.isects.value
    ref = rasterize(**args, **kw)[0]
    dropped = rasterize(**args, tiles=tiles, **kw)[0]  # needs more: draws what fits, counts without a read
    assert tiles.overflows == 0 and tiles.isects.value == small
    assert not torch.allclose(dropped, ref, atol=1e-3)
    grown = rasterize(**args, tiles=tiles, **kw)[0]  # sees the last frame's count, grows first
    assert tiles.isects.overflows == 1 and tiles.isects.value > small
    torch.testing.assert_close(grown, ref, atol=2e-6, rtol=1e-5)


@needs_triton
def test_triton_blends_fixed_capacity_tile_lists():
    args = on(DEVICE, make_scene(120, 3, seed=8))
    viewmats, Ks = make_cameras(2)
    kw = dict(viewmats=viewmats.to(DEVICE), Ks=Ks.to(DEVICE), width=W, height=H,
              backgrounds=torch.tensor([0.3, 0.5, 0.7], device=DEVICE))
    ref, ref_alpha, _ = rasterize(**args, backend="torch", **kw)
    out, alpha, meta = rasterize(**args, backend="triton", tiles=TileCapacity(), **kw)
    assert meta["backend"] == "triton" and meta["flatten_ids"].numel() > int(meta["n_isects"])  # padded
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(alpha, ref_alpha, atol=2e-5, rtol=1e-5)


@pytest.mark.gpu
def test_cuda_fixed_capacity_tile_lists_render_what_the_data_sized_ones_do_without_a_sync():
    """What a GPU render stage runs by default: Triton on fixed-capacity tile lists, one capacity across an orbit —
    the same pictures as the data-sized lists, no host sync after the first frame, no overflow."""
    scene = random_scene(3000, 3, seed=17, device="cuda")
    tiles = TileCapacity()
    kw = dict(width=256, height=192, backend="triton", validate=False)
    counter = OpCounter()
    for i, (viewmats, Ks) in enumerate(_orbit_cameras(6, 256, 192)):
        viewmats, Ks = viewmats.cuda(), Ks.cuda()
        ref, ref_alpha, _ = rasterize(**scene.rasterize_args(), viewmats=viewmats, Ks=Ks, **kw)
        if i == 0:
            out, alpha, _ = rasterize(**scene.rasterize_args(), viewmats=viewmats, Ks=Ks, tiles=tiles, **kw)
        else:
            with counter:
                out, alpha, _ = rasterize(**scene.rasterize_args(), viewmats=viewmats, Ks=Ks, tiles=tiles, **kw)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(alpha, ref_alpha, atol=2e-5, rtol=1e-5)
    assert counter.syncs == 0, counter.sync_ops
    assert tiles.overflows == 0
