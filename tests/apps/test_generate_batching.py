"""Generate sessions batched on a real server (`framegraph serve --batching on`) over WebSockets on loopback. Two
sessions at once of one model, SANA-Video's or Wan's, each with its own prompt and seed, share one loaded model and
its lane: each sees the pictures it sees on a server without batching, and the lane ran both sessions' chunks. Wan
with Monarch attention on the same server runs alone and says so in its ready."""
import asyncio
import json

import numpy as np
import pytest
from helpers import tiny_generate_folder, tiny_prompt_embeds
from server_util import jpeg_pictures, running
from websockets.asyncio.client import connect

FIRST, LATER = 5, 8  # video frames of the first chunk (1 + 4 * (2 - 1)) and of every later one (4 * 2)


@pytest.fixture
def models(tmp_path, monkeypatch):
    sana = tiny_generate_folder(tmp_path / "tiny-sana", "sana")
    wan = tiny_generate_folder(tmp_path / "tiny-wan", "wan")
    for folder in (sana, wan):
        tiny_prompt_embeds(folder / "a.safetensors", seed=1)
        tiny_prompt_embeds(folder / "b.safetensors", seed=2)
    monkeypatch.setenv("FRAMEGRAPH_MODELS", str(tmp_path))


def options(model: str, embeds: str, seed: int, **more) -> dict:
    """A live session's options. At 8 fps a chunk lasts 1 s, far longer than it takes: the source never drops one
    (a live source drops a chunk past two in flight, and a dropped chunk changes every later one's past)."""
    return {"model": model, "size": "48x32", "chunk_frames": 2, "timesteps": [1000, 500], "quality": 100,
            "prompt_embeds": embeds, "seed": seed, "fps": 8, **more}


async def session(url, opts: dict, n: int):
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "start", "pipeline": "generate", "options": opts}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), 60))
        assert ready["type"] == "ready", ready
        got = [p.astype(np.float32) for p in await jpeg_pictures(ws, n, timeout_s=60, replies=[])]
        await ws.send(json.dumps({"type": "stop"}))
    return ready, np.stack(got)


async def together(url, sessions, n):
    return await asyncio.gather(*(session(url, o, n) for o in sessions))


@pytest.mark.parametrize("family", ["sana", "wan"])
def test_two_sessions_of_one_model_share_one_lane_and_each_sees_its_own_pictures(models, family):
    from framegraph.apps.server.pipelines import base

    n = FIRST + 2 * LATER
    model = f"tiny-{family}"
    sessions = [options(model, "a.safetensors", 1), options(model, "b.safetensors", 2)]
    with running(settle_s=15) as srv:
        alone = asyncio.run(together(srv.url, sessions, n))
    with running(settle_s=15, batching=True) as srv:
        batched = asyncio.run(together(srv.url, sessions, n))
        lanes = [ln for key, ln in base._SERVICE.lanes().items() if key[:2] == ("generate chunk", family)]
        if family == "wan":
            monarch, _ = asyncio.run(session(srv.url, options(model, "a.safetensors", 1, attention="monarch"), FIRST))
            assert monarch["batched"] is False
    for (ready_a, a), (ready_b, b) in zip(alone, batched):
        assert ready_a["batched"] is False and ready_b["batched"] is True and ready_b["family"] == family
        assert a.shape == b.shape == (n, 32, 48, 3) and a.std() > 5  # a picture
        assert np.abs(a - b).mean() < 1.0, "a batched session's pictures differ from the same session alone"
    assert np.abs(batched[0][1] - batched[1][1]).mean() > 5  # and the two sessions' pictures are their own
    # one lane ran both sessions' chunks (3 each, and each one's warm-up); whether two meet in one batch depends on
    # how far apart the sessions started (the lane waits 2 ms for a second row): tests/models/test_generate_batch.py
    # has them batched
    assert len(lanes) == 1, [ln.stats.batches for ln in lanes]
    assert sum(b * n for b, n in lanes[0].stats.batches.items()) >= 2 * 3 and lanes[0].stats.failed == 0
