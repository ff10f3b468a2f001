"""``framegraph client`` against a live server: the recorded MP4 decodes, the summary has the numbers."""
import argparse
import json

import av
import numpy as np
import pytest

from framegraph.apps import client
from framegraph.apps.commands import client as client_front
from framegraph.apps.server import ServerConfig, serve_in_thread
from framegraph.stream.media import read_video


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(ServerConfig(port=0, token="tok", stats_interval_s=0.25)) as handle:
        yield handle


def write_wav(path, seconds: float, rate: int = 44100):
    """A stereo 44.1 kHz tone with a loud beep every half second (the client resamples it)."""
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.1 * np.sin(2 * np.pi * 220 * t) + 0.7 * np.sin(2 * np.pi * 1000 * t) * ((t % 0.5) < 0.04)
    pcm = (wave * 32767).astype(np.int16)
    with av.open(str(path), "w") as c:
        s = c.add_stream("pcm_s16le", rate=rate)
        s.layout = "stereo"
        for i in range(0, len(pcm), 4096):
            block = np.repeat(pcm[None, i:i + 4096], 2, 0).T.reshape(1, -1).copy()
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout="stereo")
            frame.sample_rate, frame.pts = rate, i
            c.mux(s.encode(frame))
        c.mux(s.encode(None))
    return path


def run_client(argv, capsys):
    parser = argparse.ArgumentParser(prog="framegraph client")
    client_front.add_arguments(parser)
    rc = client.run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("codec", ["jpeg", "h264"])
def test_client_streams_audio_records_a_playable_mp4_and_reports_latency(server, tmp_path, capsys, codec):
    wav = write_wav(tmp_path / "speech.wav", 2.0)
    out = tmp_path / f"scope_{codec}.mp4"
    rc, stdout, stderr = run_client(["--url", server.url, "--token", "tok", "--pipeline", "scope",
                                     "--audio", str(wav), "--out", str(out), "--size", "160x120",
                                     "--codec", codec, "--json"], capsys)
    assert rc == 0, stderr
    summary = json.loads(stdout)
    assert summary["ended"] == "stopped" and not summary["errors"]
    assert summary["audio_messages_sent"] == 100 and summary["audio_messages_received"] == 100
    assert 45 <= summary["video_frames"] <= 51 and summary["recorded_frames"] == summary["video_frames"]
    assert 20 <= summary["fps"] <= 30
    g2g = summary["glass_to_glass"]
    assert g2g["count"] == summary["video_frames"] and 0 < g2g["p50_ms"] <= g2g["p95_ms"] < 1000
    assert 0 < summary["time_to_first_frame_ms"] < 2000
    assert summary["server_stats"]["dropped"]["video"] == 0
    assert "glass-to-glass" in stderr and "time to first frame" in stderr
    v = read_video(out)
    assert v["frames"].shape[1:] == (120, 160, 3) and len(v["frames"]) == summary["video_frames"]
    assert v["fps"] == pytest.approx(25)
    assert v["audio_rate"] == 16000 and len(v["audio"]) / 16000 == pytest.approx(2.0, abs=0.1)
    loud = np.abs(v["audio"].astype(float)).max() / 32767
    assert loud > 0.5  # the beeps came back
    assert not (tmp_path / f"scope_{codec}.partial.mp4").exists()


def test_client_testcard_needs_no_audio(server, tmp_path, capsys):
    out = tmp_path / "card.mp4"
    rc, stdout, stderr = run_client(["--url", server.url, "--token", "tok", "--pipeline", "testcard",
                                     "--seconds", "1", "--size", "128x96", "--out", str(out), "--json"], capsys)
    assert rc == 0, stderr
    summary = json.loads(stdout)
    # 25 frames; on a loaded 2-core machine the realtime source may drop one at its in-flight limit
    # (counted by the server, never queued)
    assert 23 <= summary["video_frames"] <= 25 and summary["ended"] == "finished"
    assert summary["glass_to_glass"]["count"] == 0 and summary["server"]["count"] == summary["video_frames"]
    v = read_video(out)
    assert v["frames"].shape == (summary["video_frames"], 96, 128, 3)
    flashes = np.where(v["frames"].mean(axis=(1, 2, 3)) > 200)[0]
    assert list(flashes) == [0]


def test_client_waits_for_a_server_that_is_still_starting_and_says_when_none_came(tmp_path, capsys):
    import socket
    import threading
    import time

    with socket.socket() as probe:  # a free port: nothing listens there yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    t0 = time.monotonic()
    rc, _, err = run_client(["--url", f"ws://127.0.0.1:{port}/ws", "--wait", "1"], capsys)
    assert rc == 1 and time.monotonic() - t0 >= 1
    assert err.strip() == (f"framegraph client: error: no server answered at http://127.0.0.1:{port}/healthz within "
                           f"--wait 1 s: start `framegraph serve` first, or give its address with --url")
    started, done = threading.Event(), threading.Event()

    def serve_late():  # `framegraph serve &` still loading when the client starts
        time.sleep(1.0)
        with serve_in_thread(ServerConfig(port=port, stats_interval_s=0.25)):
            started.set()
            done.wait(60)

    late = threading.Thread(target=serve_late, daemon=True)
    late.start()
    rc, _, err = run_client(["--url", f"ws://127.0.0.1:{port}/ws", "--wait", "30", "--seconds", "1",
                             "--size", "128x96"], capsys)
    done.set()
    late.join(10)
    assert started.is_set() and rc == 0, err
    assert "testcard over websocket" in err


def test_client_reports_refusals_clearly(server, tmp_path, capsys):
    rc, _, err = run_client(["--url", server.url, "--token", "wrong", "--pipeline", "testcard"], capsys)
    assert rc == 1 and "HTTP 401" in err
    rc, _, err = run_client(["--url", server.url, "--token", "tok", "--pipeline", "nope"], capsys)
    assert rc == 1 and "unknown_pipeline" in err
    rc, _, err = run_client(["--url", server.url, "--token", "tok", "--pipeline", "scope"], capsys)
    assert rc == 1 and "--audio" in err


def test_client_scene_orbit_sends_poses_and_the_view_turns(server, tmp_path, capsys):
    out = tmp_path / "orbit.mp4"
    rc, stdout, stderr = run_client(["--url", server.url, "--token", "tok", "--scene", "random", "--orbit", "90",
                                     "--seconds", "2", "--size", "64x48", "--fps", "8", "--out", str(out),
                                     "--json"], capsys)
    assert rc == 0, stderr
    summary = json.loads(stdout)
    assert summary["pipeline"] == "scene" and summary["video_frames"] >= 4
    assert summary["server_stats"]["received"]["poses_in"] >= 4
    v = read_video(out)
    assert not np.array_equal(v["frames"][0], v["frames"][-1])  # the camera moved
    parser = argparse.ArgumentParser()
    client_front.add_arguments(parser)
    with pytest.raises(ValueError, match="--orbit goes with --scene"):
        client.run(parser.parse_args(["--orbit", "--url", server.url]))


def test_client_drives_the_shipped_avatar_and_records_its_face(server, tmp_path, capsys):
    """`framegraph client --pipeline avatar --audio speech.wav --out take.mp4` against the real avatar
    pipeline (shipped bundle): every audio message echoed, frames at the portrait's size, bounded delay
    (late frames are skipped on a slow machine, never queued), a bad start option refused clearly."""
    from browser_util import write_speech_wav

    wav = tmp_path / "speech.wav"
    write_speech_wav(wav, seconds=3.0)
    out = tmp_path / "avatar.mp4"
    rc, stdout, stderr = run_client(["--url", server.url, "--token", "tok", "--pipeline", "avatar",
                                     "--audio", str(wav), "--out", str(out), "--json"], capsys)
    assert rc == 0, stderr
    summary = json.loads(stdout)
    assert summary["ended"] == "stopped" and not summary["errors"]
    assert summary["audio_messages_sent"] == summary["audio_messages_received"] == 150
    assert summary["video_frames"] >= 15  # ≤ 75: the CPU generates fewer than 25 fps, honestly
    g2g = summary["glass_to_glass"]
    assert 0 < g2g["p50_ms"] < 1000, g2g
    v = read_video(out)
    assert v["frames"].shape[1:] == (256, 256, 3) and len(v["frames"]) == summary["video_frames"]
    assert v["frames"].std() > 20  # a face, not a blank
    rc, _, err = run_client(["--url", server.url, "--token", "tok", "--pipeline", "avatar", "--audio", str(wav),
                             "--option", "portrait=nobody"], capsys)
    assert rc == 1 and "portrait" in err
