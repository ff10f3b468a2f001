"""The server's ``generate`` pipeline with ``runtime: onnx`` (old name ``backend``) over a real WebSocket on loopback:
refused before anything starts while the model has no export (the client hears what it may send instead, the server's
log names the export command), then, once
``framegraph export --generate`` has written it, streaming the pictures the torch runtime streams."""
import asyncio
import json

import numpy as np
import pytest
from helpers import psnr_per_frame, tiny_generate_folder, tiny_prompt_embeds
from server_util import jpeg_pictures, running
from websockets.asyncio.client import connect

pytest.importorskip("onnx")

from framegraph.apps.cli import main

OPTIONS = {"size": "48x32", "chunk_frames": 2, "timesteps": [1000, 500], "quality": 100,
           "prompt_embeds": "a.safetensors"}
FRAMES = 5 + 8  # the first chunk's video frames (1 + 4 * (2 - 1)) and the second's (4 * 2)


async def start(url: str, backend: str, n: int = 0) -> tuple[dict, list[np.ndarray]]:
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "start", "pipeline": "generate", "options": OPTIONS | {"backend": backend}}))
        first = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if first["type"] != "ready":
            return first, []
        got = await jpeg_pictures(ws, n, timeout_s=60)
        await ws.send(json.dumps({"type": "stop"}))
        async with asyncio.timeout(20):
            async for _ in ws:
                pass
        return first, got


def test_onnx_backend_is_refused_without_an_export_then_streams_the_torch_pictures(tmp_path, monkeypatch, caplog):
    wan = tiny_generate_folder(tmp_path / "tiny-wan", "wan")
    tiny_prompt_embeds(wan / "a.safetensors", seed=1)
    monkeypatch.setenv("FRAMEGRAPH_MODELS", str(tmp_path))
    with running(settle_s=15) as server:
        reply, _ = asyncio.run(start(server.url, "onnx"))
        assert reply["type"] == "error" and reply["code"] == "bad_option", reply
        # the client hears, in its own terms (WxH), what it may send instead; the server's log names the command
        assert "expected 'torch' (model 'tiny-wan' has no up-to-date ONNX export of its VAE decoder for size 48x32 " \
               "and chunk_frames 2 on this server)" in reply["message"], reply
        assert str(tmp_path) not in reply["message"]
        assert f"framegraph export --generate {wan} --size 32x48 --chunk-frames 2" in caplog.text
        assert main(["export", "--generate", str(wan), "--size", "32x48", "--chunk-frames", "2"]) == 0
        ready, onnx = asyncio.run(start(server.url, "onnx", FRAMES))
        assert ready["backend"] == "onnx" and ready["device"] == "cpu"
        _, torch_frames = asyncio.run(start(server.url, "torch", FRAMES))
    a, b = np.stack(torch_frames), np.stack(onnx)
    assert b.shape == (FRAMES, 32, 48, 3) and b.std() > 5  # a picture
    assert psnr_per_frame(a, b).min() >= 40.0
