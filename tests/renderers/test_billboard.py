"""A matted picture placed in a rendered 3DGS scene (renderers/billboard.py): what a viewer sees — a Gaussian in front
hides exactly the part it covers, one behind is hidden by the person, and an orbiting camera sees the picture stay
where it stands in the world."""
import math

import numpy as np
import pytest
import torch

from framegraph.renderers.billboard import Placement, composite_quad
from framegraph.renderers.cameras import camera_centers, intrinsics, look_at, orbit_path, project_points
from framegraph.renderers.gaussians import GaussianScene
from framegraph.renderers.stages import GaussianRenderStage

W, H = 160, 120
SH_C0 = 0.28209479177387814


def one_splat(center, scale=0.22, color=(0.2, 0.8, 0.3)) -> GaussianScene:
    """One round, opaque splat: three coincident Gaussians (one alone is capped at opacity 0.999)."""
    sh = torch.zeros(3, 1, 3)
    sh[:, 0] = (torch.tensor(color) - 0.5) / SH_C0
    return GaussianScene(means=torch.tensor([center] * 3, dtype=torch.float32),
                         quats=torch.tensor([[1.0, 0, 0, 0]] * 3), scales=torch.full((3, 3), scale),
                         opacities=torch.ones(3), sh=sh)


def splat_patch(center, side=0.3, n=12, color=(0.9, 0.3, 0.2)) -> GaussianScene:
    """Two layers of ``n × n`` flat, opaque Gaussians facing −y, 1 cm apart: opaque inside (opacity above 0.9999),
    a soft edge a few pixels wide."""
    step = side / n
    offs = (torch.arange(n) + 0.5) * step - side / 2
    gx, gz = torch.meshgrid(offs, offs, indexing="ij")
    one = torch.stack([gx.flatten(), torch.zeros(n * n), gz.flatten()], -1)
    means = torch.cat([one, one + torch.tensor([0.0, 0.01, 0.0])]) + torch.tensor(center)
    m = len(means)
    sh = torch.zeros(m, 1, 3)
    sh[:, 0] = (torch.tensor(color) - 0.5) / SH_C0
    return GaussianScene(means=means.float(), quats=torch.tensor([[1.0, 0, 0, 0]]).repeat(m, 1),
                         scales=torch.tensor([[0.7 * step, 0.005, 0.7 * step]]).repeat(m, 1),
                         opacities=torch.ones(m), sh=sh)


def layers(scene: GaussianScene, view, K):
    """The scene's picture (uint8, over black), depth and opacity, as the render stage sends them."""
    stage = GaussianRenderStage(scene, width=W, height=H, layers=True)
    stage.prepare()
    rgb, depth, opacity = stage.render_layers(view, K, 0.0)
    return (rgb.clamp(0, 1) * 255 + 0.5).to(torch.uint8), depth, opacity


def person(h=96, w=64) -> tuple[torch.Tensor, torch.Tensor]:
    """A textured picture and an upright elliptical matte with a soft edge (a person's silhouette)."""
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack([(xx * 4) % 256, (yy * 3) % 256, torch.full_like(xx, 200)], -1).to(torch.uint8)
    r = torch.sqrt(((xx + 0.5 - w / 2) / (0.45 * w)) ** 2 + ((yy + 0.5 - h / 2) / (0.48 * h)) ** 2)
    alpha = ((1.0 - r).clamp(0, 0.1) / 0.1 * 255).round().to(torch.uint8)
    return image, alpha


CAMERA = look_at((0.0, -2.0, 0.8), (0.0, 0.0, 0.5))
K = intrinsics(W, H, fov_deg=50.0)
PLACE = Placement((0.0, 0.0, 0.0), 1.0)
FAR = (0.0, 0.0, 50.0)  # high above: in none of the pictures (the cameras look down at the ground)


def test_a_splat_in_front_hides_exactly_the_part_it_covers():
    image, alpha = person()
    front_scene, front_depth, front_opacity = layers(splat_patch((-0.12, -1.0, 0.55)), CAMERA, K)
    with_splat = composite_quad(front_scene, front_depth, front_opacity, image, alpha, PLACE, CAMERA, K)
    without = composite_quad(*layers(one_splat(FAR), CAMERA, K), image, alpha, PLACE, CAMERA, K)
    person_px = (without != 0).any(-1)
    covered, clear = front_opacity >= 0.999, front_opacity <= 1e-3
    assert (covered & person_px).sum() > 200 and (clear & person_px).sum() > 200  # it covers part of the person
    assert torch.equal(with_splat[covered], front_scene[covered])  # where the splat is opaque, only the splat
    assert (with_splat[clear].int() - without[clear].int()).abs().max() <= 1  # elsewhere the person as before
    edge = (front_opacity > 0.2) & (front_opacity < 0.8) & person_px  # its soft edge lets the person through, in part
    assert edge.any() and not torch.equal(with_splat[edge], front_scene[edge])


def test_the_person_hides_a_splat_behind_it():
    image, alpha = person()
    back = layers(one_splat((0.0, 1.2, 0.5), scale=0.35), CAMERA, K)
    with_splat = composite_quad(*back, image, alpha, PLACE, CAMERA, K)
    without = composite_quad(*layers(one_splat(FAR), CAMERA, K), image, alpha, PLACE, CAMERA, K)
    # the person's opaque middle: the same pixels with or without the splat behind
    origin = camera_centers(CAMERA)
    uv, _ = project_points(torch.stack([PLACE.world_point(0.5, v, 64 / 96, origin) for v in (0.4, 0.5, 0.6)]),
                           CAMERA, K)
    for x, y in uv.round().int().tolist():
        assert back[2][y, x] > 0.9  # the splat is there behind the person...
        assert torch.equal(with_splat[y - 2:y + 3, x - 2:x + 3], without[y - 2:y + 3, x - 2:x + 3])  # ...and hidden


def _mark(h=96, w=64, u=0.5, v=0.85, radius=3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A picture transparent but for a small white disc centred at texture (u, v)."""
    yy, xx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    disc = (((xx - u * w) ** 2 + (yy - v * h) ** 2) <= radius ** 2).to(torch.uint8) * 255
    return torch.full((h, w, 3), 255, dtype=torch.uint8), disc


@pytest.mark.parametrize("yaw", [None, 30.0])
def test_orbiting_keeps_the_picture_where_it_stands_in_the_world(yaw):
    image, alpha = _mark()
    place = Placement((0.3, -0.2, 0.0), 1.0, yaw)
    path = orbit_path(torch.tensor([0.0, 0.0, 0.4], dtype=torch.float64), 3.0, 8, 25.0, width=W, height=H,
                      fov_deg=50.0)
    errors = []
    for i in range(len(path)):
        view, Ki = path[i]
        if yaw is not None:  # a fixed quad is seen from its front half of the orbit only
            _, _, n = place.axes(camera_centers(view))
            if float(n @ (camera_centers(view) - torch.tensor(place.anchor))) <= 0.3:
                continue
        frame = composite_quad(*layers(one_splat(FAR), view, Ki), image, alpha, place, view, Ki, shadow=0.0)
        lum = frame.float().mean(-1)
        ys, xs = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
        seen = torch.stack([(xs * lum).sum() / lum.sum(), (ys * lum).sum() / lum.sum()])
        world = place.world_point(0.5, 0.85, 64 / 96, camera_centers(view))
        expected, _ = project_points(world[None], view, Ki)
        errors.append(float((seen - expected[0]).norm()))
    assert len(errors) >= 3 and max(errors) <= 1.0, errors


def test_only_the_pixels_the_quad_can_touch_are_computed_and_the_result_is_the_same():
    image, alpha = person()
    path = orbit_path(torch.tensor([0.0, 0.0, 0.4], dtype=torch.float64), 2.2, 6, 15.0, width=W, height=H)
    scene = one_splat((0.1, -0.6, 0.4), scale=0.3)
    for i in range(len(path)):
        view, Ki = path[i]
        lay = layers(scene, view, Ki)
        fast = composite_quad(*lay, image, alpha, PLACE, view, Ki)
        full = composite_quad(*lay, image, alpha, PLACE, view, Ki, window=False)
        assert torch.equal(fast, full), i


def test_the_contact_shadow_darkens_the_ground_under_the_anchor_only():
    image, alpha = person()
    grey = torch.full((H, W, 3), 128, dtype=torch.uint8)
    depth, opacity = torch.full((H, W), 50.0), torch.ones(H, W)  # a wall far behind: the scene is everywhere
    place = Placement((0.0, 0.0, 0.0), 1.0)
    out = composite_quad(grey, depth, opacity, image, torch.zeros_like(alpha), place, CAMERA, K, shadow=0.5)
    at, _ = project_points(torch.tensor([[0.0, 0.0, 0.0]]), CAMERA, K)
    x, y = int(at[0, 0]), int(at[0, 1])
    assert out[y, x].float().mean() < 0.6 * 128  # dark at the anchor (the picture itself is fully transparent)
    far, _ = project_points(torch.tensor([[0.0, 0.0, 0.8]]), CAMERA, K)  # well above the ground
    assert torch.equal(out[int(far[0, 1]), int(far[0, 0])], grey[0, 0])
    assert math.isclose(out.float().mean().item(), 128, abs_tol=10)  # a small soft blob, not the whole picture


def test_placement_is_checked():
    with pytest.raises(ValueError, match="height"):
        Placement((0, 0, 0), 0.0)
    with pytest.raises(ValueError, match="three finite numbers"):
        Placement((0, 0, float("nan")), 1.0)
    np.testing.assert_allclose(Placement((0, 0, 0), 1.0, 90.0).axes(torch.zeros(3))[2].numpy(), [1, 0, 0], atol=1e-6)


@pytest.mark.parametrize("scene_name", [("scenes", "toy.ply"), ("scenes4d", "bouncing_ball.pth"), ("nerf", "spheres")])
def test_every_scene_kind_sends_depth_and_opacity_with_the_same_picture(scene_name):
    from framegraph.assets import path as asset
    from framegraph.renderers.scene_file import open_scene

    scene = open_scene(asset(*scene_name))
    w, h = 64, 48
    view, Ki = scene.framing.orbit(4, w, h, 10)[1]
    plain, layered = scene.render_stage(width=w, height=h), scene.render_stage(width=w, height=h, layers=True)
    for s in (plain, layered):
        s.prepare()
    with torch.no_grad():
        rgb, depth, opacity = layered.render_layers(view, Ki, 0.25)
        torch.testing.assert_close(rgb, plain.render(view, Ki, 0.25))
    assert depth.shape == opacity.shape == (h, w) and 0 <= float(opacity.min()) and float(opacity.max()) <= 1.0001
    hit = opacity > 0.5
    assert hit.sum() > 50
    # what is hit lies in front of the camera, within the orbit's reach of it
    assert float(depth[hit].min()) > 0 and float(depth[hit].max()) < 2.5 * scene.framing.distance
