"""NeRF ray marching: rays, compositing, empty-space skipping and early termination on analytic fields."""
import math

import pytest
import torch

from framegraph.renderers.cameras import intrinsics, look_at
from framegraph.renderers.nerf import MarchCapacity, OccupancyGrid, camera_rays, ray_aabb, render_rays

AABB = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
BALLS = torch.tensor([[0.3, 0.2, 0.0, 0.35], [-0.4, -0.3, 0.2, 0.25]])  # centre xyz, radius


def balls_field(sigma_inside=30.0):
    """Density ``sigma_inside`` inside the balls, exactly 0 outside; colour varies with position."""
    def fn(p, d):
        inside = ((p[:, None, :] - BALLS[None, :, :3]).norm(dim=-1) < BALLS[None, :, 3]).any(dim=1)
        sigma = torch.where(inside, torch.full_like(p[:, 0], sigma_inside), torch.zeros_like(p[:, 0]))
        rgb = torch.stack([0.5 + 0.5 * torch.sin(5 * p[:, 0]), 0.5 + 0.4 * p[:, 1], 0.5 + 0.3 * d[:, 2]], -1)
        return sigma, rgb
    return fn


def exact_ball_occupancy(resolution):
    """Occupied iff the cell's box touches a ball (distance from the centre to the box <= radius)."""
    grid = OccupancyGrid(AABB.tolist(), resolution)
    R = resolution
    ijk = torch.stack(torch.meshgrid(*[torch.arange(R)] * 3, indexing="ij"), -1).reshape(-1, 3).float()
    lo = AABB[:3] + ijk * grid.cell_size
    hi = lo + grid.cell_size
    occ = torch.zeros(R ** 3, dtype=torch.bool)
    for b in BALLS:
        nearest = torch.maximum(torch.minimum(b[:3], hi), lo)
        occ |= (nearest - b[:3]).norm(dim=-1) <= b[3]
    grid.bits = occ.reshape(R, R, R)
    return grid


def test_camera_rays_follow_the_opencv_convention():
    eye, W, H = torch.tensor([0.0, -3.0, 0.5]), 8, 6
    viewmat = look_at(eye, torch.zeros(3))
    K = intrinsics(W, H, fov_deg=60)
    o, d = camera_rays(viewmat, K, W, H)
    assert o.shape == d.shape == (W * H, 3)
    torch.testing.assert_close(o[0], eye)
    torch.testing.assert_close(d.norm(dim=-1), torch.ones(W * H))
    # each ray projects back onto its own pixel centre
    p = (viewmat[:3, :3] @ (o + 2 * d).T + viewmat[:3, 3:]).T
    uv = (K @ p.T).T
    uv = uv[:, :2] / uv[:, 2:]
    ys, xs = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    torch.testing.assert_close(uv, torch.stack([xs, ys], -1).reshape(-1, 2).float(), atol=1e-4, rtol=0)


def test_ray_aabb_entry_and_exit():
    o = torch.tensor([[-3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-3.0, 5.0, 0.0]])
    d = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    t0, t1 = ray_aabb(o, d, AABB)
    torch.testing.assert_close(t0[:2], torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(t1[:2], torch.tensor([4.0, 1.0]))
    assert t1[2] <= t0[2]  # a miss


def test_a_uniform_medium_composites_to_the_closed_form():
    sigma, c, bg, step = 0.8, torch.tensor([0.2, 0.6, 0.9]), torch.tensor([1.0, 0.5, 0.0]), 0.05
    fn = lambda p, d: (torch.full_like(p[:, 0], sigma), c.expand(p.shape[0], 3))  # noqa: E731
    o = torch.tensor([[-3.0, 0.0, 0.0], [-3.0, 0.3, 0.2]])
    d = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.1, 0.0]]), dim=-1)
    out = render_rays(fn, o, d, AABB, step, background=bg, early_stop=0.0)
    t0, t1 = ray_aabb(o, d, AABB)
    n = torch.floor((t1 - t0) / step - 0.5) + 1  # samples at t0 + (k + 0.5) step < t1
    T = torch.exp(-sigma * step * n)
    torch.testing.assert_close(out.rgb, (1 - T)[:, None] * c + T[:, None] * bg)
    torch.testing.assert_close(out.opacity, 1 - T)


def _image_rays(W=24, H=20, eye=(0.4, -2.6, 0.9)):
    return camera_rays(look_at(torch.tensor(eye), torch.zeros(3)), intrinsics(W, H, fov_deg=50), W, H)


def test_occupancy_skipping_leaves_the_image_unchanged():
    o, d = _image_rays()
    fn = balls_field()
    bg = torch.tensor([1.0, 1.0, 1.0])
    full = render_rays(fn, o, d, AABB, 0.02, background=bg, early_stop=0.0)
    grid = exact_ball_occupancy(32)
    skipped = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, background=bg, early_stop=0.0)
    torch.testing.assert_close(skipped.rgb, full.rgb, atol=1e-6, rtol=0)
    assert float(full.opacity.max()) > 0.99 and float(full.opacity.min()) == 0.0  # hits and misses
    assert skipped.n_evaluated < 0.25 * full.n_evaluated
    assert full.n_evaluated == full.n_candidates


def test_occupancy_update_marks_dense_cells_and_prunes_empty_ones():
    fn = balls_field(sigma_inside=50.0)
    grid = OccupancyGrid(AABB.tolist(), 16, threshold=0.01, decay=0.95)
    assert grid.occupied_fraction == 1.0  # before any update everything counts as occupied
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        grid.update(lambda p: fn(p, p)[0], 0.02, generator=g)
    exact = exact_ball_occupancy(16).bits
    # every occupied cell touches a ball; cells well inside a ball (all 8 corners inside) are occupied
    assert not bool((grid.bits & ~exact).any())
    R = 16
    ijk = torch.stack(torch.meshgrid(*[torch.arange(R)] * 3, indexing="ij"), -1).reshape(-1, 3).float()
    corners = torch.tensor([[(c >> k) & 1 for k in range(3)] for c in range(8)]).float()
    pts = AABB[:3] + (ijk[:, None, :] + corners) * grid.cell_size
    inside = ((pts[:, :, None, :] - BALLS[:, :3]).norm(dim=-1) < BALLS[:, 3]).all(dim=1).any(dim=-1)
    assert bool(grid.bits.reshape(-1)[inside].all())
    assert 0.01 < grid.occupied_fraction < 0.2
    # the bitfield survives packing
    again = OccupancyGrid(AABB.tolist(), 16)
    again.load_packed_bits(grid.packed_bits())
    assert torch.equal(again.bits, grid.bits)
    assert grid.packed_bits().shape == (16 ** 3 // 8,)


def test_early_termination_changes_the_image_by_at_most_the_threshold():
    o, d = _image_rays()
    fn = balls_field(sigma_inside=200.0)  # nearly opaque surfaces
    grid = exact_ball_occupancy(32)  # so that what is left to skip is the inside of the balls
    full = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=0.0)
    stopped = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=1e-4, chunk_steps=8)
    assert float((stopped.rgb - full.rgb).abs().max()) <= 1e-4 + 1e-6
    assert stopped.n_evaluated < 0.6 * full.n_evaluated
    # the result does not depend on how many steps are marched per round
    other = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=1e-4, chunk_steps=64)
    torch.testing.assert_close(other.rgb, stopped.rgb, atol=1e-6, rtol=0)


def test_render_is_differentiable_through_the_field():
    o, d = _image_rays(6, 4)
    s = torch.tensor(2.0, requires_grad=True)
    fn = lambda p, dd: (s * torch.ones_like(p[:, 0]), torch.full_like(p, 0.5))  # noqa: E731
    out = render_rays(fn, o, d, AABB, 0.05, background=torch.zeros(3), early_stop=0.0)
    out.rgb.sum().backward()
    assert s.grad is not None and float(s.grad) > 0  # more density: more of the grey, less black
    assert math.isfinite(float(s.grad))


@pytest.mark.parametrize("bad", [0, -1])
def test_occupancy_grid_rejects_bad_resolution(bad):
    with pytest.raises(ValueError, match="resolution"):
        OccupancyGrid(AABB.tolist(), bad)


@pytest.mark.parametrize("early_stop", [0.0, 1e-4])
def test_sync_free_march_renders_what_the_readable_march_does(early_stop):
    fn = balls_field(sigma_inside=200.0)
    grid = exact_ball_occupancy(32)
    capacity = MarchCapacity.for_box(AABB.tolist(), 0.02)
    assert capacity.max_steps >= math.ceil(AABB[3:].sub(AABB[:3]).norm() / 0.02)  # the longest chord fits
    for eye in [(0.0, 0.3, 0.2), (0.4, -2.6, 0.9), (2.2, 1.0, -0.5)]:  # one capacity across frames (the first,
        # from inside the box, needs the most samples: no overflow); no ray is cut short
        o, d = _image_rays(eye=eye)
        want = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=early_stop, chunk_steps=16,
                           background=torch.ones(3))
        got = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=early_stop, capacity=capacity,
                          background=torch.ones(3))
        torch.testing.assert_close(got.rgb, want.rgb, atol=1e-6, rtol=0)
        torch.testing.assert_close(got.depth, want.depth, atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(got.opacity, want.opacity, atol=1e-6, rtol=0)
        assert int(got.n_candidates) == want.n_candidates and int(got.n_evaluated) >= want.n_evaluated
    assert capacity.overflows == 0


def test_sync_free_march_drops_samples_past_its_capacity_for_one_frame():
    o, d = _image_rays()
    fn, grid = balls_field(), exact_ball_occupancy(32)
    capacity = MarchCapacity.for_box(AABB.tolist(), 0.02, headroom=1.0, quantum=1)
    want = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=0.0)
    render_rays(fn, o[:100], d[:100], AABB, 0.02, occupancy=grid, early_stop=0.0, capacity=capacity)  # warm-up
    short = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=0.0, capacity=capacity)
    assert not torch.allclose(short.rgb, want.rgb, atol=1e-2)
    grown = render_rays(fn, o, d, AABB, 0.02, occupancy=grid, early_stop=0.0, capacity=capacity)
    assert capacity.overflows == 1
    torch.testing.assert_close(grown.rgb, want.rgb, atol=1e-6, rtol=0)
