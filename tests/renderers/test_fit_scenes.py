"""Procedural ground-truth scenes and the image metrics the fit is scored with."""
import math

import pytest
import torch

from framegraph.renderers.cameras import camera_centers
from framegraph.renderers.fit import ssim
from framegraph.renderers.gaussians import rasterize
from framegraph.renderers.scenes import procedural_scene
from framegraph.stream.quality import psnr

W, H = 64, 48


@pytest.fixture(scope="module")
def toy():
    return procedural_scene("toy")


def _project(viewmat, K, point):
    p = viewmat[:3, :3] @ point + viewmat[:3, 3]
    return (K[0, 0] * p[0] / p[2] + K[0, 2]).item(), (K[1, 1] * p[1] / p[2] + K[1, 2]).item(), p[2].item()


def test_a_point_projects_where_the_camera_says(toy):
    """Each sphere's centre projects to a pixel whose ray-cast depth is the sphere's front surface, and a
    tiny Gaussian at that centre, rendered by the 3DGS rasterizer, peaks at that same pixel."""
    views = toy.views(6, W, H, seed=3)
    _, depth = toy.render(views.viewmats, views.Ks, W, H, supersample=1)
    checked = 0
    for c in range(len(views)):
        vm, K = views.viewmats[c], views.Ks[c]
        for s in toy.spheres:
            centre = torch.tensor(s.center, dtype=torch.float32)
            u, v, z = _project(vm, K, centre)
            i, j = int(v), int(u)
            if not (2 <= j < W - 2 and 2 <= i < H - 2):
                continue
            d = depth[c, i, j].item()
            if d < z - s.radius - 0.05:  # something in front of this sphere in this view
                continue
            # The pixel-centre ray passes within half a pixel of the centre: it meets the sphere at z - r
            # (up to the curvature over that half pixel).
            assert abs(d - (z - s.radius)) < 0.03, (c, s, d, z - s.radius)
            colors, _, _ = rasterize(centre[None], torch.tensor([[1.0, 0, 0, 0]]), torch.full((1, 3), 0.004),
                                     torch.ones(1), torch.ones(1, 1), vm[None], K[None], W, H)
            peak = int(colors[0, ..., 0].argmax())
            assert (peak // W, peak % W) == (i, j)
            checked += 1
    assert checked >= 6


def test_views_are_deterministic_and_held_out_views_differ(toy):
    a, b = toy.views(8, W, H, seed=1), toy.views(8, W, H, seed=1)
    assert torch.equal(a.viewmats, b.viewmats)
    held = toy.views(8, W, H, seed=1, offset=0.5)
    dist = torch.cdist(camera_centers(a.viewmats), camera_centers(held.viewmats))
    assert float(dist.min()) > 0.5
    # every camera looks at the target: it projects to the image centre
    for vm, K in zip(a.viewmats, a.Ks):
        u, v, z = _project(vm, K, torch.tensor(toy.target))
        assert abs(u - W / 2) < 1e-3 and abs(v - H / 2) < 1e-3 and z > 0


def test_render_is_an_image_of_the_scene(toy):
    views = toy.views(2, W, H, seed=0)
    img, depth = toy.render(views.viewmats, views.Ks, W, H)
    img2, _ = toy.render(views.viewmats, views.Ks, W, H)
    assert img.shape == (2, H, W, 3) and depth.shape == (2, H, W)
    assert torch.equal(img, img2)
    assert float(img.min()) >= 0 and float(img.max()) <= 1
    hit = torch.isfinite(depth)
    assert 0.3 < float(hit.float().mean()) < 0.98  # scene and background both in view
    assert float((img[~hit] == 0).all(-1).float().mean()) > 0.8  # black background (edges anti-aliased)
    assert float(img[hit].std()) > 0.15  # textured, not flat


def test_sampled_points_lie_on_surfaces(toy):
    pts, cols = toy.sample_points(400, seed=2)
    assert pts.shape == (400, 3) and cols.shape == (400, 3)
    on_ground = pts[:, 2].abs() < 1e-4
    on_sphere = torch.zeros(400, dtype=torch.bool)
    for s in toy.spheres:
        on_sphere |= ((pts - torch.tensor(s.center)).norm(dim=1) - s.radius).abs() < 1e-4
    on_box = torch.zeros(400, dtype=torch.bool)
    for b in toy.boxes:
        q = ((pts - torch.tensor(b.center)).abs() / torch.tensor(b.half_size))
        on_box |= ((q.max(dim=1).values - 1).abs() < 1e-4)
    assert bool((on_ground | on_sphere | on_box).all())
    assert int(on_sphere.sum()) > 20 and int(on_box.sum()) > 10


def test_unknown_scene_names_the_choices():
    with pytest.raises(ValueError, match="available: toy"):
        procedural_scene("nope")


def test_ssim_and_psnr_sanity():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 24, 32, 3, generator=g)
    assert float(ssim(a, a)) == pytest.approx(1.0, abs=1e-6)
    assert psnr(a, a) == math.inf
    noisy = (a + 0.1 * torch.randn(a.shape, generator=g)).clamp(0, 1)
    assert float(ssim(a, noisy)) < 0.99
    assert float(ssim(a, noisy)) > float(ssim(a, torch.rand(a.shape, generator=g)))
    assert 18 < psnr(noisy, a) < 22  # sigma 0.1 noise, slightly clipped: about 20 dB
    # differentiable
    x = noisy.clone().requires_grad_(True)
    (1 - ssim(x, a)).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with pytest.raises(ValueError, match="same shape"):
        ssim(a, a[:, :10])
