"""``framegraph bench scene_avatar --quick``: each branch alone and the composite measured through real graphs, the
JSON complete (FPS, first frame, work p50 per branch and per stage) and its PNG beside it."""
import json

from framegraph.apps.cli import main


def test_bench_scene_avatar_quick_writes_every_figure(tmp_path):
    out = tmp_path / "scene_avatar.json"
    assert main(["bench", "scene_avatar", "--quick", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "scene_avatar" and r["scene_size"] == [64, 36] and r["avatar_size"] == [256, 256]
    for run in ("avatar_alone", "scene_alone", "composite"):
        assert r["runs"][run]["fps"] > 0 and r["runs"][run]["first_frame_ms"] > 0 and r["runs"][run]["frames"] == 15
    stages = r["runs"]["composite"]["stages"]
    assert {"denoiser", "vae_decode", "composite", "gaussians", "quad_in_scene"} <= set(stages)
    assert set(r["branch_work_p50_ms"]) == {"avatar", "scene", "composite"}
    assert r["composite_share_of_slower_branch"] > 0 and "load_average_1_5_15min" in r
    assert (tmp_path / "scene_avatar.png").stat().st_size > 1000
