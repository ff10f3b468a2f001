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
