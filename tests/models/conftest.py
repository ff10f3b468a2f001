"""Fixtures of the model tests."""
import pytest


@pytest.fixture(scope="session")
def astronaut_talking_clip(tmp_path_factory):
    """A 12 s clip of the astronaut speaking (`framegraph avatar synth --seed 1`): its MP4 (the JSON of its
    ground truth beside it). Made once per run; skipped without espeak-ng."""
    from framegraph.apps.cli import main
    from framegraph.models.synth import espeak_available

    if not espeak_available():
        pytest.skip("needs the system package espeak-ng (apt-get install espeak-ng) to make a talking clip")
    root = tmp_path_factory.mktemp("synth")
    assert main(["avatar", "synth", "--out", str(root), "--clips", "1", "--seconds", "12", "--seed", "1"]) == 0
    return root / "clip_00000.mp4"


@pytest.fixture(scope="session")
def exported_video_avatar(tmp_path_factory):
    """A random video avatar and the folder of its ONNX export: ``(avatar, folder)``."""
    pytest.importorskip("onnx")
    from framegraph.models.avatar import random_video_avatar
    from framegraph.models.avatar.video.onnx import export_video_avatar

    avatar = random_video_avatar()
    out = str(tmp_path_factory.mktemp("video_onnx"))
    export_video_avatar(avatar, out)
    return avatar, out
