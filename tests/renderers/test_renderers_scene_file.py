"""open_scene: every scene form a user has opens through one door and renders through one RenderStage."""
import pytest
import torch

from framegraph.assets import path as asset
from framegraph.renderers.scene_file import open_scene, scene_kind
from framegraph.renderers.stages import CameraSource, RenderStage
from framegraph.stream import Graph, PortSpec, RecordingSink


@pytest.mark.parametrize("parts,kind", [(("scenes", "toy.ply"), "3dgs"),
                                        (("scenes4d", "bouncing_ball.pth"), "4dgs"),
                                        (("nerf", "spheres"), "nerf")])
def test_each_shipped_scene_opens_and_renders_a_picture_of_itself(parts, kind):
    scene = open_scene(asset(*parts))
    assert scene.kind == kind == scene_kind(asset(*parts))
    stage = scene.render_stage(width=32, height=24)
    assert isinstance(stage, RenderStage)
    g = Graph()
    cams = g.add(CameraSource(scene.framing.orbit(2, 32, 24, fps=10)))
    r = g.add(stage)
    k = g.add(RecordingSink({"video": PortSpec((24, 32, 3), torch.uint8)}))
    g.connect(cams, r)
    g.connect(r, k)
    g.run(timeout=120)
    frames = torch.stack(k.data()).float()
    assert frames.shape == (2, 24, 32, 3)
    assert frames.std() > 5  # the scene is in view, not an empty background


def test_what_is_not_a_scene_is_refused_with_what_was_expected(tmp_path):
    (tmp_path / "x.obj").write_text("v 0 0 0")
    with pytest.raises(ValueError, match=r"expected a 3DGS \.ply / \.splat file, a 4DGS \.pth checkpoint or a NeRF"):
        open_scene(tmp_path / "x.obj")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_scene(tmp_path / "missing.ply")
    with pytest.raises(ValueError, match="goes with a 4DGS checkpoint"):
        open_scene(asset("scenes", "toy.ply"), time_duration=(0.0, 1.0))
