"""Fixtures of the model tests."""
import pytest


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


@pytest.fixture(scope="session")
def musetalk_bundle(tmp_path_factory, astronaut_talking_clip):
    """A MuseTalk bundle of tiny random models in MuseTalk's layout, prepared from the astronaut's talking clip (4 s
    loop, 1 s idle): its folder. Tests that change it work on a copy. Skipped without MediaPipe's face mesh (a GPU
    machine's image may lack it)."""
    pytest.importorskip("mediapipe", reason="preparing a person needs MediaPipe's face mesh")
    from helpers import tiny_musetalk_folder

    from framegraph.apps.cli import main

    root = tmp_path_factory.mktemp("musetalk")
    folder = tiny_musetalk_folder(root / "files")
    assert main(["avatar", "prepare", "--musetalk", str(folder), "--video", str(astronaut_talking_clip),
                 "--out", str(root / "person"), "--loop-seconds", "4", "--idle-seconds", "1"]) == 0
    return root / "person"
