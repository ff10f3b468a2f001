"""The ``avatar`` WebSocket pipeline end to end on a real server (tiny random bundles, a still portrait and a
video avatar, in a temporary avatar folder): microphone audio in, full-size video + echoed audio out, live ``state``
config, ``interrupt``, bad options."""
import asyncio
import io
import json

import numpy as np
import pytest
from PIL import Image
from test_server_session import of_type, pcm_message, receive_all, running, tone
from websockets.asyncio.client import connect

from framegraph.apps.server import pipelines
from framegraph.models.avatar import random_avatar, save_avatar
from framegraph.models.avatar.video.bundle import random_video_avatar, save_video_avatar


@pytest.fixture(scope="module")
def avatar_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("avatars")
    save_avatar(root / "astronaut", random_avatar())
    save_video_avatar(root / "me", random_video_avatar())  # a video avatar (bundle kind "video")
    mp = pytest.MonkeyPatch()
    mp.setenv("FRAMEGRAPH_AVATARS", str(root))  # the server's avatar folder, read when a session starts
    yield root
    mp.undo()


def test_the_pipeline_is_offered_only_while_the_avatar_folder_has_a_bundle(avatar_dir, tmp_path, monkeypatch):
    from framegraph.apps.server.pipelines import avatar as ap
    from framegraph.apps.server.protocol import ProtocolError

    assert ap.available_avatars(str(tmp_path)) == [] and ap.available_avatars() == ["astronaut", "me"]
    assert "avatar" in pipelines.available()
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))
    assert "avatar" not in pipelines.available()
    with pytest.raises(ProtocolError, match="'avatar' is not available on this server: it has no avatar bundle") as e:
        pipelines.build("avatar", {})
    assert str(tmp_path) not in str(e.value)  # the server's folder stays in its log


async def speak(url: str, options: dict, samples, events: dict | None = None):
    """An ``avatar`` session: start with ``options``, send ``samples`` at microphone pace (20 ms messages),
    the control message ``events[i]`` after audio message ``i``, then ``stop``, reading all along (a client that
    did not would have its video dropped); returns ``(ready, got)``."""
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "start", "version": 1, "pipeline": "avatar", "options": options}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert ready["type"] == "ready", ready
        reading = asyncio.create_task(receive_all(ws, 60))
        for i in range(len(samples) // 320):
            await asyncio.sleep(0.02)
            await ws.send(pcm_message(i, samples[i * 320:(i + 1) * 320]))
            if events and i in events:
                await ws.send(json.dumps(events[i]))
        await ws.send(json.dumps({"type": "stop"}))
        return ready, await reading


def test_avatar_session_streams_video_and_echo_and_takes_state_and_interrupt(avatar_dir):
    samples = tone(1.2, amp=0.3)
    events = {10: {"type": "config", "options": {"state": "listening"}}, 30: {"type": "interrupt"}}
    with running() as srv:
        ready, got = asyncio.run(speak(srv.url, {"portrait": "astronaut", "steps": 1}, samples, events))
    assert ready["video"]["width"] == 256 and ready["video"]["height"] == 256 and ready["avatar"] == "astronaut"
    assert ready["audio_in"]["sample_rate"] == 16000 and ready["audio_out"]["sample_rate"] == 16000
    assert len(got["video"]) >= 20  # 1.2 s at 25 fps; a loaded CPU may drop a few live
    assert Image.open(io.BytesIO(got["video"][-1][1])).size == (256, 256)
    assert sum(h.payload_len for h, *_ in got["audio"]) >= 2 * 0.8 * 16000
    applied = [m for m in of_type(got, "config")]
    assert any(m.get("applied", {}).get("state") == "listening" for m in applied), got["control"]
    assert got["control"][-1]["type"] == "ended"


def test_bad_options_are_rejected(avatar_dir):
    from framegraph.apps.server.protocol import ProtocolError

    for options, what in (({"portrait": "../etc"}, "portrait"), ({"state": "shouting"}, "state"),
                          ({"size": "320x240"}, "size"), ({"steps": 9}, "steps")):
        with pytest.raises(ProtocolError, match=what):
            pipelines.build("avatar", options)
    p = pipelines.build("avatar", {"state": "idle"})
    assert p.format["state"] == "idle" and p.apply_config({"state": "auto"}) == {"state": "auto"}


def test_onnx_backend_session_streams_and_a_missing_export_is_refused(avatar_dir, caplog):
    pytest.importorskip("onnx")
    from framegraph.apps.server.protocol import ProtocolError
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.portrait.onnx import export_avatar

    # the client hears what it may send instead; the server's log says how its operator makes an export
    with pytest.raises(ProtocolError, match="'runtime' = 'onnx'; expected 'torch' .*no up-to-date onnx export"):
        pipelines.build("avatar", {"runtime": "onnx"})
    assert "no ONNX export" in caplog.text and "framegraph export" in caplog.text
    with pytest.raises(ProtocolError, match="backend"):
        pipelines.build("avatar", {"backend": "tensorrt"})  # the option's old name, still accepted
    export_avatar(load_avatar(avatar_dir / "astronaut"), str(avatar_dir / "astronaut" / "onnx"))
    samples = tone(0.8, amp=0.3)

    with running() as srv:
        ready, got = asyncio.run(speak(srv.url, {"backend": "onnx", "steps": 1}, samples))
    assert ready["runtime"] == ready["backend"] == "onnx" and ready["device"] == "cpu"
    assert len(got["video"]) >= 12 and Image.open(io.BytesIO(got["video"][-1][1])).size == (256, 256)
    assert got["control"][-1]["type"] == "ended"


def test_video_avatar_session_streams_its_own_frames_at_their_size(avatar_dir):
    samples = tone(1.0, amp=0.3)

    with running() as srv:
        ready, got = asyncio.run(speak(srv.url, {"portrait": "me"}, samples))
    assert ready["avatar"] == "me" and (ready["video"]["width"], ready["video"]["height"]) == (256, 256)
    assert len(got["video"]) >= 15  # 1 s at 25 fps; a loaded CPU may drop a few live
    picture = np.asarray(Image.open(io.BytesIO(got["video"][-1][1])).convert("RGB"), np.float64)
    from framegraph.models.synth import astronaut_portrait

    photo = np.asarray(astronaut_portrait().image, np.float64)
    assert np.abs(picture[:80] - photo[:80]).mean() < 12  # the person's own frames (top: no mouth region)
    assert sum(h.payload_len for h, *_ in got["audio"]) >= 2 * 0.7 * 16000


def test_sessions_of_one_video_avatar_share_the_model_service_when_batching_is_on(avatar_dir, monkeypatch):
    """Two servers in one process: the one with batching on shares the model service, the other does not."""
    from framegraph.apps.server.pipelines import base

    # the lane waits up to one frame (40 ms at 25 fps) for the other session's request: the two sessions' frames
    # are not in phase, and with the default 2 ms they meet only when the lane falls behind (a loaded CPU)
    monkeypatch.setattr(base, "_SERVICE", base.ModelService(window_ms=45.0))
    samples = tone(1.0, amp=0.3)
    with running(batching=True) as srv, running() as alone:
        async def both():
            return await asyncio.gather(*(speak(srv.url, {"portrait": "me"}, samples) for _ in range(2)),
                                        speak(alone.url, {"portrait": "me"}, tone(0.3, amp=0.3)))

        *sessions, (ready_alone, _) = asyncio.run(both())
    assert ready_alone["batched"] is False
    for ready, got in sessions:  # each streams (a loaded CPU skips live frames it cannot make in time)
        assert ready["batched"] is True and len(got["video"]) >= 5
    (lane,) = base._SERVICE.lanes().values()
    assert lane.stats.served >= sum(len(got["video"]) for _, got in sessions)  # every picture from the lane
    assert max(lane.stats.batches) >= 2 and not lane.running  # batches shared; no thread left
    text = base.batching_metrics_text()
    assert f'framegraph_batch_requests_served_total{{lane="{lane.name}"}} {lane.stats.served}' in text
    assert 'framegraph_batches_total{lane="' in text and "framegraph_batch_capacity_sessions" in text


def test_portrait_sessions_share_the_dit_and_decoder_lanes_when_batching_is_on(avatar_dir, monkeypatch):
    from framegraph.apps.server.pipelines import base

    monkeypatch.setattr(base, "_SERVICE", base.ModelService(window_ms=45.0))  # as above: the frames meet
    samples = tone(1.0, amp=0.3)
    with running(batching=True) as srv:
        async def both():
            return await asyncio.gather(*(speak(srv.url, {"portrait": "astronaut", "steps": 1}, samples)
                                          for _ in range(2)))

        sessions = asyncio.run(both())
    for ready, got in sessions:
        assert ready["batched"] is True and ready["kind"] == "portrait" and len(got["video"]) >= 5
    lanes = {lane.name: lane for lane in base._SERVICE.lanes().values()}
    assert "portrait-vae-torch" in lanes and any(name.startswith("portrait-dit-") for name in lanes)
    for lane in lanes.values():
        assert lane.stats.failed == 0 and not lane.running  # no thread left
    assert max(max(lane.stats.batches) for lane in lanes.values()) >= 2
