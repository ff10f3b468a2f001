"""The Gradio demo (apps/demo) driven through its API with gradio_client, against the real app: the
framegraph server, the relay and Gradio in one process on a loopback port. No browser here
(test_demo_browser.py runs the page in Chromium).

Typed text → eSpeak NG → a take streamed in real time through a fresh session → an MP4 that decodes,
with frames and audio; an uploaded file does the same; ``/speak`` makes a clip the page's player
fetches; the player's WebSocket refuses foreign origins and unknown tabs; the pipeline choice falls
back to ``scope`` with a note when there is no avatar.
"""
import argparse
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from browser_util import write_speech_wav
from helpers import framegraph_threads, wait_for
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from framegraph.apps.commands.demo import add_arguments
from framegraph.apps.demo import DemoConfig, choose_pipeline, serve_demo_in_thread
from framegraph.apps.server import pipelines
from framegraph.stream.media import read_video


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    # pinned to the scope: cheap on 2 CPU cores and its picture is known; the avatar / scope choice is
    # tested on its own below
    config = DemoConfig(port=0, pipeline="scope", takes_dir=str(tmp_path_factory.mktemp("takes")))
    with serve_demo_in_thread(config) as handle:
        yield handle
        wait_for(lambda: handle.server.server.session_count == 0, 10, "sessions to close")
    wait_for(lambda: not framegraph_threads(), 10, "graph threads to end")


@pytest.fixture(scope="module")
def client(demo):
    from gradio_client import Client

    return Client(demo.url, verbose=False)


def test_typed_text_becomes_a_recorded_take_with_frames_and_audio(demo, client):
    text = "Hello, this is a take."
    mp4, summary = client.predict(text, "en-us", None, "astronaut", api_name="/take")
    assert summary["pipeline"] == demo.ctx.choice.name == "scope"
    assert summary["ended"] == "stopped" and not summary["errors"], summary
    video = read_video(mp4)
    frames, audio = video["frames"], video["audio"]
    seconds = summary["audio_seconds"]
    assert frames.shape[1:] == (240, 320, 3)
    assert len(frames) >= 0.7 * 25 * seconds, (len(frames), seconds)  # ~25 fps for the length of the speech
    assert video["audio_rate"] == 16000 and len(audio) >= 0.8 * 16000 * seconds
    assert np.abs(audio.astype(np.int32)).max() > 3000  # the speech came back (the scope echoes it)
    assert frames.std() > 8
    # streamed in real time: the delay from a chunk being sent to its frame arriving, measured by the demo
    g2g = summary["glass_to_glass"]
    assert g2g["count"] >= 20 and g2g["p50_ms"] < 1000, g2g
    assert 10 <= summary["fps"] <= 40, summary["fps"]


def test_an_uploaded_file_becomes_a_take(client, tmp_path):
    from gradio_client import handle_file

    wav = tmp_path / "speech.wav"
    write_speech_wav(wav, seconds=1.5, rate=48_000)
    mp4, summary = client.predict("", "en-us", handle_file(str(wav)), "astronaut", api_name="/take")
    video = read_video(mp4)
    assert abs(summary["audio_seconds"] - 1.8) < 0.05  # 1.5 s + the 0.3 s tail, resampled to 16 kHz
    assert len(video["frames"]) >= 25 and len(video["audio"]) >= 16000


def test_speak_makes_a_clip_the_player_fetches(demo, client):
    from gradio_client.exceptions import AppError

    url = client.predict("One two three.", "en-gb-scotland", api_name="/speak")
    assert url.startswith("fg/clip/")
    with urllib.request.urlopen(demo.url + url, timeout=10) as r:
        pcm = np.frombuffer(r.read(), "<i2")
    assert 0.5 < len(pcm) / 16000 < 5 and np.abs(pcm.astype(np.int32)).max() > 3000
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(demo.url + "fg/clip/nope", timeout=10)
    assert err.value.code == 404
    with pytest.raises(AppError, match="type something"):
        client.predict("   ", "en-us", api_name="/speak")


def test_player_files_are_served_and_nothing_else(demo):
    for name in ("player.html", "app.js", "pcm-worklet.js"):
        with urllib.request.urlopen(demo.url + "fg/" + name, timeout=10) as r:
            assert r.status == 200 and r.read()
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(demo.url + "fg/index.html", timeout=10)


def test_player_socket_refuses_foreign_origins_and_unknown_tabs(demo):
    ws_url = demo.url.replace("http://", "ws://") + "fg/ws"
    tab = demo.ctx.relay.new_tab()
    for url, origin in ((f"{ws_url}?tab={tab}", "http://evil.example"), (f"{ws_url}?tab=nope", None)):
        with pytest.raises(InvalidStatus) as err:
            connect(url, origin=origin, open_timeout=10)
        assert err.value.response.status_code == 403
    with connect(f"{ws_url}?tab={tab}", origin=demo.url.rstrip("/"), open_timeout=10) as ws:
        ws.send(json.dumps({"type": "start", "pipeline": "scope"}))
        ready = json.loads(ws.recv(timeout=10))
        assert ready["type"] == "ready" and ready["pipeline"] == "scope"
        assert demo.ctx.relay.tab(tab).live.session == ready["session"]


def test_pipeline_choice_falls_back_to_scope_and_prefers_the_avatar(monkeypatch, tmp_path):
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))  # an avatar folder without a bundle
    choice = choose_pipeline("auto")
    assert choice.name == "scope" and not choice.avatar
    assert str(tmp_path) in choice.note and "scope" in choice.note  # the demo runs here: it says where to put one
    assert choice.start_options({}, "someone") == {"size": "320x240"}  # no portrait for the scope

    spec = pipelines.spec("scope")
    monkeypatch.setitem(pipelines.REGISTRY, "avatar", pipelines.PipelineSpec("avatar", "test avatar", spec.options,
                                                                             spec.build))
    choice = choose_pipeline("auto")
    assert choice.name == "avatar" and choice.avatar and "avatar" in choice.note
    assert choice.start_options({}, "astronaut") == {}  # the shipped portrait is the pipeline's default
    assert choice.start_options({"codec": "h264"}, "me") == {"codec": "h264", "avatar": "me"}
    assert choice.start_options({}, None, "onnx") == {"runtime": "onnx"}  # framegraph demo --runtime onnx
    with pytest.raises(ValueError, match="not available"):
        choose_pipeline("no-such-pipeline")


def test_command_line_defaults_bind_loopback():
    from framegraph.apps.demo.cli import config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([])
    assert args.host == "127.0.0.1" and not args.no_browser
    cfg = config_from_args(p.parse_args(["--port", "0", "--no-browser", "--size", "640x360"]))
    assert cfg.port == 0 and cfg.video == {"size": "640x360"} and cfg.pipeline == "auto"
    assert cfg.runtime == "torch" and config_from_args(p.parse_args(["--runtime", "onnx"])).runtime == "onnx"
    assert config_from_args(p.parse_args(["--backend", "onnx"])).runtime == "onnx"  # the old name still works
