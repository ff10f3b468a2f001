"""The ``scene_avatar`` WebSocket pipeline on a real server: the client's microphone makes the shipped avatar talk
inside the shipped toy scene while its camera poses orbit it; one video and the echoed audio come back; the
session ends when the client stops; a bad place or a bundle without a matte is refused in the protocol's terms."""
import asyncio
import json
import shutil

import numpy as np
import pytest
from server_util import running
from test_server_session import of_type, pcm_message, pictures, receive_all, start, tone
from websockets.asyncio.client import connect

from framegraph.apps.server import pipelines
from framegraph.apps.server.protocol import ProtocolError
from framegraph.assets import path as asset
from framegraph.renderers.cameras import look_at


def test_the_avatar_talks_in_the_scene_while_the_camera_orbits():
    async def session(url):
        async with connect(url) as ws:
            ready = await start(ws, "scene_avatar", size="96x64", place="-0.6,-0.8,0,0,1.2")
            audio = tone(2.0)
            cam = ready["camera"]
            for i, chunk in enumerate(audio.reshape(-1, 320)):
                await ws.send(pcm_message(i, chunk))
                if i == 50:  # after a second, the camera moves round to the avatar's front
                    eye = [cam["target"][0], cam["target"][1] - cam["distance"], cam["target"][2] + 1.0]
                    await ws.send(json.dumps({"type": "pose", "matrix": look_at(eye, cam["target"]).tolist()}))
                await asyncio.sleep(0.02)
            await ws.send(json.dumps({"type": "stop"}))
            return ready, await receive_all(ws, timeout_s=60)

    with running() as server:
        ready, got = asyncio.run(session(server.url))
    assert ready["pose_in"] is True and ready["audio_in"] is not None and ready["avatar"] == "astronaut"
    assert ready["video"]["fps"] == 25.0 and ready["place"]["anchor"] == [-0.6, -0.8, 0.0]
    frames = pictures(got["video"], "jpeg")
    assert len(frames) >= 10 and frames[0].shape == (64, 96, 3)
    assert len(got["audio"]) >= 90  # the speech echoed back
    first, last = frames[0].astype(int), frames[-1].astype(int)
    assert np.abs(last - first).mean() > 3  # the camera moved: a different view
    assert of_type(got, "ended")[-1]["reason"] == "stopped" and not of_type(got, "error")


def test_bad_scene_avatar_options_are_refused_in_the_protocols_terms(tmp_path, monkeypatch):
    with pytest.raises(ProtocolError, match="option 'place' = '9,9,9'; expected x,y,z or x,y,z,yaw,height inside"):
        pipelines.build("scene_avatar", {"place": "9,9,9"})
    with pytest.raises(ProtocolError, match="option 'place' = 'here'"):
        pipelines.build("scene_avatar", {"place": "here"})
    with pytest.raises(ProtocolError, match="option 'scene' = 'nothing.ply'"):
        pipelines.build("scene_avatar", {"scene": "nothing.ply"})
    shutil.copytree(asset("avatars", "astronaut"), tmp_path / "astronaut", ignore=shutil.ignore_patterns("matte.png"))
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))
    with pytest.raises(ProtocolError, match="expected an avatar with a person matte") as e:
        pipelines.build("scene_avatar", {})
    assert str(tmp_path) not in str(e.value)


def _talk(url, **options):
    """A short avatar session (half a second of tone, then stop): the ready message and everything received."""
    async def session():
        async with connect(url) as ws:
            ready = await start(ws, "avatar", **options)
            for i, chunk in enumerate(tone(0.6).reshape(-1, 320)):
                await ws.send(pcm_message(i, chunk))
                await asyncio.sleep(0.02)
            await ws.send(json.dumps({"type": "stop"}))
            return ready, await receive_all(ws, timeout_s=30)
    return asyncio.run(session())


def test_avatar_with_a_transparent_background_sends_pictures_whose_alpha_is_the_matte():
    import io

    from PIL import Image

    from framegraph.apps.server.protocol import Kind
    from framegraph.models.avatar import load_avatar
    from framegraph.stream.quality import psnr

    matte = load_avatar(asset("avatars", "astronaut")).matte.numpy()
    with running() as server:
        ready, got = _talk(server.url, codec="png", background="transparent")
        green_ready, green = _talk(server.url, background="green")
    assert ready["video"] == {"codec": "png", "width": 256, "height": 256, "fps": 25.0, "alpha": True}
    assert ready["background"] == "transparent" and len(got["video"]) >= 5
    assert all(h.kind == Kind.PNG for h, _, _ in got["video"])
    for _, payload, _ in got["video"]:
        rgba = np.asarray(Image.open(io.BytesIO(payload)))
        assert rgba.shape == (256, 256, 4) and psnr(rgba[..., 3], matte, data_range=255) == float("inf")
    assert green_ready["background"] == [0, 255, 0]
    frame = pictures(green["video"], "jpeg")[-1].astype(int)
    assert np.abs(frame[matte == 0] - [0, 255, 0]).mean() < 12  # JPEG's green where the matte is 0


def test_background_options_that_do_not_go_together_are_refused():
    with pytest.raises(ProtocolError, match="option 'codec' = 'webp'; expected jpeg or h264"):
        pipelines.build("avatar", {"codec": "webp"})
    with pytest.raises(ProtocolError, match="option 'background' = 'transparent'; expected a colour or portrait"):
        pipelines.build("avatar", {"background": "transparent"})
    with pytest.raises(ProtocolError, match="option 'background' = 'mauve'; expected \"portrait\", \"transparent\""):
        pipelines.build("avatar", {"background": "mauve"})
