"""The ``scene`` pipeline behind the web page's orbit viewer (apps/server/pipelines/scene.py), over the
real WebSocket with the real websockets client (no browser here: test_browser_page.py drives it from
Chromium). Poses in → Gaussian-splat frames out; scene files only by name from the server's folder."""
import asyncio
import json

import numpy as np
import pytest
from server_util import jpeg_pictures, running
from websockets.asyncio.client import connect

from framegraph.apps.server import pipelines
from framegraph.renderers.cameras import look_at
from framegraph.renderers.gaussians import random_scene, save_ply


@pytest.fixture
def server():
    with running() as handle:
        yield handle


async def until_ended(ws) -> list[dict]:
    msgs = []
    async with asyncio.timeout(15):
        async for m in ws:
            if isinstance(m, str):
                msgs.append(json.loads(m))
    return msgs


def test_scene_renders_and_follows_pushed_poses(server):
    async def session(url):
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "pipeline": "scene",
                                      "options": {"size": "96x64", "gaussians": 200, "seed": 3}}))
            ready = json.loads(await asyncio.wait_for(ws.recv(), 15))
            first = await jpeg_pictures(ws, 2)
            cam = ready["camera"]
            side = look_at([cam["target"][0] + cam["distance"], cam["target"][1], cam["target"][2]],
                           cam["target"], cam["up"])
            await ws.send(json.dumps({"type": "pose", "matrix": side.tolist()}))
            await asyncio.sleep(0.3)
            later = await jpeg_pictures(ws, 3)
            session = next(iter(server.server.sessions.values()))
            camera = session.pipeline.pose_in.camera
            await ws.send(json.dumps({"type": "stop"}))
            return ready, first, later, camera, side, await until_ended(ws)

    ready, first, later, camera, side, tail = asyncio.run(session(server.url))
    assert ready["type"] == "ready" and ready["pose_in"] is True and ready["audio_in"] is None
    assert ready["gaussians"] == 200 and ready["device"] in ("cpu", "cuda")
    assert ready["video"]["width"] == 96 and ready["camera"]["fov_deg"] == 50.0
    assert first[0].shape == (64, 96, 3) and first[0].std() > 5  # Gaussians, not an empty background
    assert camera.poses_pushed == 1 and np.allclose(camera._pose.numpy(), side.numpy())
    assert np.abs(later[-1].astype(int) - first[-1].astype(int)).mean() > 3  # seen from the side now
    assert [m for m in tail if m["type"] == "ended"][-1]["reason"] == "stopped"
    assert not [m for m in tail if m["type"] == "error"]


async def attempt(url, options):
    """Start a scene session with ``options``; its first reply (and first picture, when ready)."""
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "start", "pipeline": "scene", "options": options}))
        reply = json.loads(await asyncio.wait_for(ws.recv(), 15))
        if reply["type"] == "ready":
            reply["picture"] = (await jpeg_pictures(ws, 1))[0]
        await ws.send(json.dumps({"type": "stop"}))
        await until_ended(ws)
        return reply


def test_scene_plays_the_shipped_4dgs_and_nerf_scenes_by_name(server):
    for name, kind in (("bouncing_ball.pth", "4dgs"), ("spheres", "nerf"), ("toy.ply", "3dgs")):
        reply = asyncio.run(attempt(server.url, {"size": "64x48", "scene": name}))
        assert reply["type"] == "ready" and reply["scene"] == kind, (name, reply)
        assert reply["picture"].shape == (48, 64, 3) and reply["picture"].std() > 5, name  # the scene in view


def test_scene_loads_a_ply_by_name_from_the_server_folder_only(server, tmp_path, monkeypatch):
    save_ply(random_scene(50, sh_degree=1, seed=1), tmp_path / "tiny.ply")
    (tmp_path / "notes.txt").write_text("not a scene")
    monkeypatch.setenv("FRAMEGRAPH_SCENES", str(tmp_path))

    def run(options):
        return asyncio.run(attempt(server.url, {"size": "64x48", **options}))

    ok = run({"ply": "tiny.ply"})
    assert ok["type"] == "ready" and ok["gaussians"] == 50
    for bad in ("../tiny.ply", str(tmp_path / "tiny.ply"), "notes.txt", "missing.ply", ".hidden.ply", 7):
        reply = run({"ply": bad})
        assert reply["type"] == "error" and reply["code"] == "bad_option" and "ply" in reply["message"], (bad, reply)
    reply = run({"gaussians": 0})
    assert reply["code"] == "bad_option"
    reply = run({"colour": "red"})
    assert reply["code"] == "bad_option" and "colour" in reply["message"]


def test_scene_is_listed_and_loaded_lazily():
    assert pipelines.spec("scene").build.__module__ == "framegraph.apps.server.pipelines.scene"
    assert "scene" in pipelines.available()
