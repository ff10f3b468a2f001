"""The server's ``avatar`` pipeline with ``backend: onnx-int8``: refused with the fix when the export has no int8
files, streams once ``framegraph export --int8`` made them."""

import asyncio
import io

import pytest
from PIL import Image
from test_avatar_pipeline import avatar_dir, speak  # noqa: F401  (avatar_dir: the fixture)
from test_server_session import running, tone

from framegraph.apps.server import pipelines


def test_onnx_int8_backend_session_streams_and_an_export_without_int8_is_refused(avatar_dir, caplog):  # noqa: F811
    pytest.importorskip("onnx")
    from framegraph.apps.server.protocol import ProtocolError
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.int8 import quantize_export
    from framegraph.models.avatar.portrait.onnx import export_avatar

    avatar = load_avatar(avatar_dir / "astronaut")
    export = str(avatar_dir / "astronaut" / "onnx")
    export_avatar(avatar, export)
    with pytest.raises(ProtocolError, match="'runtime' = 'onnx-int8'; expected 'torch' .*no up-to-date onnx-int8"):
        pipelines.build("avatar", {"runtime": "onnx-int8"})
    assert "no int8 files; run `framegraph export" in caplog.text  # the operator's fix, in the server's log
    quantize_export(avatar, export, "dynamic", models=["dit", "vae"])
    with running() as srv:
        ready, got = asyncio.run(speak(srv.url, {"backend": "onnx-int8", "steps": 1}, tone(0.8, amp=0.3)))
    assert ready["backend"] == "onnx-int8" and ready["device"] == "cpu"
    assert len(got["video"]) >= 12 and Image.open(io.BytesIO(got["video"][-1][1])).size == (256, 256)
    assert got["control"][-1]["type"] == "ended"
