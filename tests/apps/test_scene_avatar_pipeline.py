"""The ``scene_avatar`` WebSocket pipeline on a real server: the client's microphone makes the shipped avatar talk
inside the shipped toy scene while its camera poses orbit it; one video and the echoed audio come back; the
session ends when the client stops; a bad place or a bundle without a matte is refused in the protocol's terms.
And the ``avatar`` pipeline's backgrounds: transparent (the matte as alpha), a colour, a picture of the server's
named by its file name (never a path; ``$FRAMEGRAPH_BACKGROUNDS`` honoured)."""
import asyncio
import json
import shutil

import numpy as np
import pytest
from server_util import running
from test_server_errors import speaks_the_protocol
from test_server_session import http_get, of_type, pcm_message, pictures, receive_all, start, tone
from websockets.asyncio.client import connect

from framegraph.apps.server import pipelines
from framegraph.apps.server.pipelines.avatar import AvatarOptions
from framegraph.apps.server.pipelines.options import backgrounds_dir
from framegraph.apps.server.protocol import ProtocolError
from framegraph.assets import path as asset
from framegraph.models.avatar import load_avatar
from framegraph.models.composite import cover_picture, load_background
from framegraph.renderers.cameras import look_at


def test_the_avatar_talks_in_the_scene_while_the_camera_orbits():
    async def session(url):
        async with connect(url) as ws:
            ready = await start(ws, "scene_avatar", size="96x64", place="-0.6,-0.8,0,0,1.2")
            got = {"control": [], "video": [], "audio": []}
            reader = asyncio.create_task(receive_all(ws, timeout_s=90, got=got))
            audio = tone(2.0)
            cam = ready["camera"]
            for i, chunk in enumerate(audio.reshape(-1, 320)):
                await ws.send(pcm_message(i, chunk))
                if i == 50:  # after a second, the camera moves round to the avatar's front
                    eye = [cam["target"][0], cam["target"][1] - cam["distance"], cam["target"][2] + 1.0]
                    await ws.send(json.dumps({"type": "pose", "matrix": look_at(eye, cam["target"]).tolist()}))
                await asyncio.sleep(0.02)
            # The scene keeps rendering after the speech (the avatar's last frame stays). On a CPU the pure-torch
            # Gaussian renderer sets the pace (0.2-0.6 s a frame on 2 shared cores): wait for the frames, then stop.
            async with asyncio.timeout(60):
                while len(got["video"]) < 10:
                    await asyncio.sleep(0.05)
            await ws.send(json.dumps({"type": "stop"}))
            return ready, await reader

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


def _refused(pipeline: str, options: dict, match: str) -> ProtocolError:
    """Building ``pipeline`` with ``options`` raises a :class:`ProtocolError` matching ``match``; returns it."""
    with pytest.raises(ProtocolError, match=match) as e:
        pipelines.build(pipeline, options)
    return e.value


def test_bad_scene_avatar_options_are_refused_in_the_protocols_terms(tmp_path, monkeypatch):
    _refused("scene_avatar", {"place": "9,9,9"}, "option 'place' = '9,9,9'; expected x,y,z or x,y,z,yaw,height inside")
    _refused("scene_avatar", {"place": "here"}, "option 'place' = 'here'")
    _refused("scene_avatar", {"scene": "nothing.ply"}, "option 'scene' = 'nothing.ply'")
    shutil.copytree(asset("avatars", "astronaut"), tmp_path / "astronaut", ignore=shutil.ignore_patterns("matte.png"))
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))
    error = _refused("scene_avatar", {}, "expected an avatar with a person matte")
    assert str(tmp_path) not in str(error)


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
    _refused("avatar", {"codec": "webp"}, "option 'codec' = 'webp'; expected jpeg or h264")
    _refused("avatar", {"background": "transparent"},
             "'background' = 'transparent'; expected a colour, a picture or portrait")
    _refused("avatar", {"background": "mauve"}, "option 'background' = 'mauve'; expected \"portrait\", \"transparent\"")


def test_avatar_over_a_picture_of_the_servers_named_by_its_file_name():
    from framegraph.stream.quality import psnr

    matte = load_avatar(asset("avatars", "astronaut")).matte.numpy()
    shown = cover_picture(load_background(asset("backgrounds", "toy_scene.jpg")), 256, 256).numpy()
    with running() as server:
        schema = json.loads(http_get(server.http_url + "pipelines/avatar"))["options"]["background"]
        ready, got = _talk(server.url, background="toy_scene.jpg")
        _, own = _talk(server.url)  # the portrait's own background, for contrast
    assert schema["pictures"] == ["toy_scene.jpg"] and "<picture>" in schema["choices"]
    assert ready["background"] == "toy_scene.jpg" and not of_type(got, "error")
    behind = matte == 0  # where the matte leaves the background (as the colour test decides it)
    frame, portrait = pictures(got["video"], "jpeg")[-1], pictures(own["video"], "jpeg")[-1]
    assert psnr(frame[behind], shown[behind], data_range=255) > 30  # the picture, scaled to cover the frame
    assert psnr(portrait[behind], shown[behind], data_range=255) < 15  # not what the portrait shows there


def test_a_picture_name_the_folder_lacks_or_a_path_is_refused_and_the_server_keeps_serving():
    bad = ["nowhere.jpg", "../x.jpg", "/etc/passwd", "../backgrounds/toy_scene.jpg"]

    async def session(url):
        async with connect(url) as ws:
            replies = []
            for value in bad:
                await ws.send(json.dumps({"type": "start", "pipeline": "avatar", "options": {"background": value}}))
                replies.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            ready = await start(ws, "avatar", background="toy_scene.jpg")  # the same connection, then a good start
            await ws.send(json.dumps({"type": "stop"}))
            return replies, ready, await receive_all(ws, timeout_s=30)

    with running() as server:
        replies, ready, got = asyncio.run(session(server.url))
    for value, reply in zip(bad, replies):
        assert reply["type"] == "error" and reply["code"] == "bad_option", reply
        assert f"option 'background' = {value!r}" in reply["message"] and "a picture: toy_scene.jpg" in reply["message"]
        speaks_the_protocol(reply["message"], value)
        assert str(backgrounds_dir()) not in reply["message"]
    assert ready["background"] == "toy_scene.jpg" and of_type(got, "ended")[-1]["reason"] == "stopped"


def test_the_backgrounds_folder_is_the_servers_own_when_it_names_one(tmp_path, monkeypatch):
    from PIL import Image

    Image.new("RGB", (32, 18), (200, 30, 30)).save(tmp_path / "red wall.png")
    (tmp_path / "notes.txt").write_text("not a picture")
    monkeypatch.setenv("FRAMEGRAPH_BACKGROUNDS", str(tmp_path))
    assert backgrounds_dir() == tmp_path
    assert AvatarOptions.parse({"background": "red wall.png"}, "avatar").background == "red wall.png"
    assert AvatarOptions.schema()["background"]["pictures"] == ["red wall.png"]
    for value in ("toy_scene.jpg", "notes.txt", str(tmp_path / "red wall.png")):  # the shipped folder is not asked
        with pytest.raises(ProtocolError, match="or a picture: red wall.png$") as refused:
            AvatarOptions.parse({"background": value}, "avatar")
        assert str(tmp_path) not in refused.value.message.replace(repr(value), "")


def test_a_picture_that_does_not_decode_is_refused_without_the_servers_path(tmp_path, monkeypatch, caplog):
    (tmp_path / "broken.jpg").write_text("not a picture")
    monkeypatch.setenv("FRAMEGRAPH_BACKGROUNDS", str(tmp_path))
    refused = _refused("avatar", {"background": "broken.jpg"},
                       r"'broken.jpg'; expected another background \(this picture cannot be read")
    assert str(tmp_path) not in refused.message and "broken.jpg" in caplog.text  # the cause is in the log
