"""The shipped demo NeRF, and NeRFs as stream stages (CameraSource -> NerfRenderStage -> sink)."""

import pytest
import torch

from framegraph.assets import path as asset
from framegraph.renderers.nerf import NerfLoadError, demo_scene, load_nerf
from framegraph.renderers.nerf.stage import NerfRenderStage, orbit_for_nerf
from framegraph.renderers.stages import CameraSource
from framegraph.stream import Graph, PortSpec, RecordingSink
from framegraph.stream.quality import psnr

DEMO = asset("nerf", "spheres")


@pytest.fixture(scope="module")
def demo():
    return load_nerf(DEMO)


def test_demo_loads_and_renders_the_scene_it_was_trained_on(demo):
    assert (DEMO / "PROVENANCE.md").is_file()
    assert (DEMO / "model.safetensors").stat().st_size <= 10 * 2 ** 20
    path = orbit_for_nerf(demo, 2, 48, 48, fps=10)
    scene = demo_scene()
    with torch.no_grad():
        for view, K in zip(path.viewmats, path.Ks):
            img = demo.render(view, K, 48, 48)
            truth = scene.render(view, K, 48, 48)
            assert img.shape == (48, 48, 3) and bool(torch.isfinite(img).all())
            assert float(img.std()) > 0.05  # not an empty (flat) frame
            assert float((img - 1).abs().amax(-1).gt(0.2).float().mean()) > 0.1  # a good part is not background
            assert psnr(img, truth) > 20


def test_occupancy_skipping_on_the_trained_demo_changes_little(demo):
    path = orbit_for_nerf(demo, 1, 32, 32, fps=10, elevation_deg=10.0)
    view, K = path[0]
    with torch.no_grad():
        skipped = demo.render(view, K, 32, 32)
        full = demo.render(view, K, 32, 32, use_occupancy=False)
    assert psnr(skipped, full) > 30  # measured 35-37.5 dB: the density left in pruned cells is below threshold


def test_render_stage_in_a_graph_matches_the_model(demo):
    W, H = 32, 24
    path = orbit_for_nerf(demo, 3, W, H, fps=10)
    g = Graph()
    cams = g.add(CameraSource(path, fps=10))
    r = g.add(NerfRenderStage(demo, width=W, height=H))
    k = g.add(RecordingSink({"video": PortSpec((H, W, 3), torch.uint8)}))
    g.connect(cams, r)
    g.connect(r, k)
    g.run(timeout=120)
    assert len(k.data()) == 3
    with torch.no_grad():
        for i, img in enumerate(k.data()):
            view, K = path[i]
            expect = (demo.render(view, K, W, H).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
            assert torch.equal(img, expect)
    assert not torch.equal(k.data()[0], k.data()[1])  # the camera moved


def test_render_stage_takes_a_directory_and_reports_a_bad_one(tmp_path):
    stage = NerfRenderStage(DEMO, width=16, height=16)
    assert stage.outputs["video"].shape == (16, 16, 3) and stage.outputs["video"].dtype == torch.uint8
    assert stage.inputs["camera"].shape == (2, 4, 4)
    with pytest.raises(NerfLoadError, match="config.json: missing"):
        NerfRenderStage(tmp_path, width=16, height=16)


def test_sync_free_render_stage_matches_the_readable_march(demo):
    W, H = 32, 24
    path = orbit_for_nerf(demo, 4, W, H, fps=10)
    stage = NerfRenderStage(demo, width=W, height=H, sync_free=True)
    assert stage.sync_free and not NerfRenderStage(demo, width=W, height=H).sync_free  # a CPU stage reads
    stage.prepare()
    with torch.no_grad():
        for view, K in path:
            torch.testing.assert_close(stage.render(view, K, 0.0), demo.render(view, K, W, H), atol=1e-6, rtol=0)
    assert stage.march.overflows == 0


@pytest.mark.gpu
def test_on_cuda_the_render_stage_marches_sync_free_by_default_and_matches_the_model():
    W, H = 64, 48
    model = load_nerf(DEMO).to("cuda")
    stage = NerfRenderStage(model, width=W, height=H, device="cuda")
    assert stage.sync_free  # a GPU stage does not read back
    stage.prepare()
    with torch.no_grad():
        for view, K in orbit_for_nerf(model, 4, W, H, fps=10):
            torch.testing.assert_close(stage.render(view, K, 0.0), model.render(view, K, W, H), atol=1e-4, rtol=0)
    assert stage.march.overflows == 0
