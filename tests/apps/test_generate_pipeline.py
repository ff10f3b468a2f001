"""The server's ``generate`` pipeline (apps/server/pipelines/generate.py) over a real WebSocket on loopback:
a tiny Wan folder from the server's model folder streams generated frames; a ``config`` prompt change shows
within the next chunks, without a restart (the frames before it are those of an unchanged session); a model is only ever
named, never a path; the Python client records the stream to MP4."""
import asyncio
import json

import numpy as np
import pytest
from server_util import jpeg_pictures, running
from websockets.asyncio.client import connect

from framegraph.apps.client import stream_session
from framegraph.apps.server import ServerConfig, serve_in_thread
from framegraph.stream.media import read_video

OPTIONS = {"size": "48x32", "chunk_frames": 2, "timesteps": [1000, 500], "quality": 100,
           "prompt_embeds": "a.safetensors"}
FIRST, LATER = 5, 8  # video frames of the first chunk (1 + 4 * (2 - 1)) and of every later one (4 * 2)


@pytest.fixture
def server(generate_models, monkeypatch):
    monkeypatch.setenv("FRAMEGRAPH_MODELS", str(generate_models))
    with running(settle_s=15) as handle:
        yield handle


async def pictures(ws, n: int, replies: list) -> list[np.ndarray]:
    return [p.astype(np.float32) for p in await jpeg_pictures(ws, n, timeout_s=30, replies=replies)]


async def session(url, n: int, switch: dict | None = None):
    replies = []
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "start", "pipeline": "generate", "options": OPTIONS}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert ready["type"] == "ready", ready
        got = await pictures(ws, FIRST, replies)
        if switch is not None:
            await ws.send(json.dumps({"type": "config", "options": switch}))
        got += await pictures(ws, n - FIRST, replies)
        await ws.send(json.dumps({"type": "stop"}))
        async with asyncio.timeout(20):
            async for m in ws:
                if isinstance(m, str):
                    replies.append(json.loads(m))
    return ready, got, replies


def test_generated_frames_stream_and_a_prompt_change_shows_without_a_restart(server):
    n = FIRST + 4 * LATER
    ready, plain, _ = asyncio.run(session(server.url, n))
    _, switched, replies = asyncio.run(session(server.url, n, {"prompt_embeds": "b.safetensors"}))
    assert ready["family"] == "wan" and ready["model"] == "tiny-wan" and ready["video"]["width"] == 48
    assert plain[0].shape == (32, 48, 3) and np.std(plain) > 5  # a picture
    assert np.abs(np.diff(np.stack(plain), axis=0)).mean() > 1  # that moves
    assert {"type": "config", "applied": {"prompt_embeds": "b.safetensors"}} in replies
    differs = [float(np.abs(a - b).mean()) > 0 for a, b in zip(plain, switched)]
    k = differs.index(True)
    # Chunk 0 was out before the change; the denoiser is at most two chunks ahead of the client (the source
    # keeps one chunk in flight), so the new prompt shows within chunk 1 or 2 (at the stage level the switch
    # is exact to the chunk: tests/models/test_generate_stages.py) and stays.
    assert FIRST <= k < FIRST + 2 * LATER, k
    chunks = [differs[start:start + LATER] for start in range(FIRST, n, LATER)]
    assert all(any(c) for c in chunks[(k - FIRST) // LATER:]), chunks  # every chunk from then on is another


def test_the_next_session_finds_the_model_loaded_and_streams_what_a_fresh_one_did(server, generate_models):
    """A session borrows a loaded model and gives it back when its graph stops: the next session neither loads
    nor compiles it again, and nothing of the earlier stream's state shows in its pictures. A model folder
    changed on disk is loaded anew."""
    import os

    from server_util import wait_for

    from framegraph.apps.server.pipelines.generate import MODELS

    n = FIRST + LATER
    _, first, _ = asyncio.run(session(server.url, n))
    loads = MODELS.loads
    place = (os.path.abspath(generate_models / "tiny-wan"), "cpu")
    # the session gives its model back once its graph has stopped, which may be just after its socket closed
    wait_for(lambda: MODELS.idle(place) == 1, 10, "the first session's model given back")
    _, again, _ = asyncio.run(session(server.url, n))
    assert MODELS.loads == loads  # the model the first session gave back
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    weights = next((generate_models / "tiny-wan" / "transformer").glob("*.safetensors"))
    os.utime(weights)  # the files changed: the model is loaded from them again
    wait_for(lambda: MODELS.idle(place) == 1, 10, "the second session's model given back")
    _, changed, _ = asyncio.run(session(server.url, n))
    assert MODELS.loads == loads + 1
    assert all(np.array_equal(a, b) for a, b in zip(first, changed))


def test_a_model_pool_lends_one_model_per_session_keeps_one_idle_and_lets_older_versions_go():
    from framegraph.apps.server.pipelines.base import ModelPool

    pool, made = ModelPool(), []

    def load():
        made.append(object())
        return made[-1]

    a, b = pool.take("k", 1, load), pool.take("k", 1, load)  # two sessions at once: two models
    assert a is not b and pool.loads == 2 and pool.idle("k") == 0
    pool.give_back("k", 1, a)
    pool.give_back("k", 1, b)  # beyond max_idle (1): let go
    assert pool.idle("k") == 1 and pool.take("k", 1, load) is a and pool.loads == 2
    assert pool.take("other", 1, load) is made[-1] and pool.loads == 3
    pool.give_back("k", 1, a)
    c = pool.take("k", 2, load)  # the files changed: a new load, and the idle model of version 1 is let go
    assert c is made[-1] and pool.loads == 4 and pool.idle("k") == 0
    pool.give_back("k", 1, b)  # a session of the old version ends: not kept
    assert pool.idle("k") == 0
    pool.give_back("k", 2, c)
    assert pool.take("k", 2, load) is c
    two = ModelPool(max_idle=2)
    d, e = two.take("k", 1, load), two.take("k", 1, load)
    two.give_back("k", 1, d)
    two.give_back("k", 1, e)
    assert two.idle("k") == 2


def test_text_prompts_change_live_and_bad_options_are_refused(server):
    async def run():
        async with connect(server.url) as ws:
            await ws.send(json.dumps({"type": "start", "pipeline": "generate",
                                      "options": OPTIONS | {"prompt_embeds": None, "prompt": "a red fox"}}))
            ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
            replies = []
            await pictures(ws, FIRST, replies)
            await ws.send(json.dumps({"type": "config", "options": {"prompt": "the blue sky"}}))
            await pictures(ws, LATER, replies)
            await ws.send(json.dumps({"type": "config", "options": {"prompt_embeds": "../a.safetensors"}}))
            await pictures(ws, 1, replies)
            await ws.send(json.dumps({"type": "stop"}))
            async with asyncio.timeout(20):
                async for m in ws:
                    if isinstance(m, str):
                        replies.append(json.loads(m))
            return ready, replies

    ready, replies = asyncio.run(run())
    assert ready["type"] == "ready"
    assert {"type": "config", "applied": {"prompt": "the blue sky"}} in replies
    errors = [m for m in replies if m["type"] == "error"]
    assert errors and "the name of a .safetensors file in the model folder" in errors[0]["message"]

    async def refused(options):
        async with connect(server.url) as ws:
            await ws.send(json.dumps({"type": "start", "pipeline": "generate", "options": options}))
            return json.loads(await asyncio.wait_for(ws.recv(), 30))

    for options, words in (({"model": "/etc"}, "one of the server's models ['tiny-wan']"),
                           # sizes are WxH in messages too: the width, 40, is the side that does not tile
                           (OPTIONS | {"size": "40x32"}, "multiples of 16 (the model's 8x VAE downscale times its 2x2 "
                                                         "patches): the width, 40, is not; e.g. 32x32"),
                           (OPTIONS | {"timesteps": [250, 500]}, "strictly decreasing")):
        reply = asyncio.run(refused(options))
        assert reply["type"] == "error" and words in reply["message"], reply


def test_the_python_client_records_the_generated_stream(server, tmp_path):
    out = tmp_path / "live.mp4"
    summary = asyncio.run(stream_session(server.url, "generate", OPTIONS, seconds=2.0, out=str(out)))
    frames = read_video(out)["frames"]
    assert summary["format"]["family"] == "wan" and not summary["errors"]
    assert len(frames) == summary["recorded_frames"] >= FIRST + LATER and frames.std() > 5


def test_a_server_without_a_model_folder_says_how_to_give_it_one(monkeypatch):
    monkeypatch.delenv("FRAMEGRAPH_MODELS", raising=False)
    with serve_in_thread(ServerConfig(port=0)) as handle:
        async def start():
            async with connect(handle.url) as ws:
                await ws.send(json.dumps({"type": "start", "pipeline": "generate", "options": {"prompt": "a"}}))
                return json.loads(await asyncio.wait_for(ws.recv(), 30))
        reply = asyncio.run(start())
    assert reply["type"] == "error" and "FRAMEGRAPH_MODELS=DIR" in reply["message"]
