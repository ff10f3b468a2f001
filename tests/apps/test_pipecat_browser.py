"""The example Pipecat agent (examples/pipecat_avatar_bot.py, what `framegraph pipecat-demo` runs) in a real headless
Chromium through Pipecat's SmallWebRTC transport: the page (Pipecat's browser client library) connects, a typed
sentence is spoken by eSpeak NG and the avatar, the page plays the sound and shows the avatar, and the page's own
recording of the stream it received (MediaRecorder, WebM) holds the speech and the mouth moving with it.

Needs ``chromium`` (apt) and ``playwright`` (pip; no ``playwright install``): see browser_util.py.
"""
import argparse
import base64
import time

import numpy as np
import pytest
import torch
from browser_util import assert_shows_portrait
from helpers import framegraph_threads, wait_for
from PIL import Image

pytest.importorskip("pipecat", reason="framegraph[pipecat] (pipecat-ai) is part of the dev extra")

from framegraph.apps.bench.pipecat_agent import best_lag  # noqa: E402
from framegraph.apps.commands.pipecat_demo import add_arguments  # noqa: E402
from framegraph.apps.pipecat.cli import load_example  # noqa: E402
from framegraph.apps.pipecat.webrtc import Server, build_app  # noqa: E402
from framegraph.models.avatar import load_avatar  # noqa: E402
from framegraph.models.avatar.eval.synthetic import mouth_openness, search_box  # noqa: E402
from framegraph.stream.media import read_video  # noqa: E402

SENTENCE = "Hello from the browser. I am the framegraph avatar, and I say what you type."


@pytest.fixture(scope="module")
def agent():
    """The example agent on a free port (its own options, no greeting)."""
    example = load_example()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--port", "0", "--greeting", ""])
    server = Server(build_app(lambda connection: example.run_bot(connection, args)), "127.0.0.1", 0)
    url = server.start()
    yield url, args
    server.stop()


def _take(webm: bytes, avatar, path) -> dict:
    """What the page recorded (WebM): per video frame the sound's RMS over its 40 ms, the mouth's openness and its
    change, and the lag at which the mouth best follows the sound (frames; positive: after it)."""
    path.write_bytes(webm)
    video = read_video(path)
    frames, audio = video["frames"], video["audio"].astype(np.float64)
    rate, times = video["audio_rate"], video["frame_times_s"]
    half = rate // 50  # RMS over each frame's 40 ms
    centres = np.round((times - video["audio_start_s"]) * rate).astype(int)
    rms = np.array([np.sqrt(np.mean(audio[max(0, c - half):c + half] ** 2)) if c + half > 0 else 0.0 for c in centres])
    opening = mouth_openness(torch.from_numpy(frames), avatar.mouth_box, avatar.portrait)
    x0, y0, x1, y1 = search_box(avatar.mouth_box, frames.shape[1:3])
    change = np.abs(np.diff(frames[:, y0:y1, x0:x1].astype(np.float64), axis=0)).mean(axis=(1, 2, 3))
    lag, corr = best_lag(opening, rms, max_lag=8)
    return {"frames": len(frames), "audio_rms": float(np.sqrt(np.mean(audio ** 2))), "speech": rms > 500,
            "silence": rms < 30, "opening": opening, "change": change, "lag": lag, "corr": corr}


def test_typed_sentence_is_heard_and_the_avatar_speaks_it_in_chromium(browser, agent, tmp_path):
    url, args = agent
    avatar = load_avatar(args.avatar)
    page = browser.new_context(viewport={"width": 1000, "height": 900}).new_page()
    errors, takes = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url)
        page.click("#connect")
        state = lambda: page.evaluate("fgPipecat.state()")  # noqa: E731
        wait_for(lambda: state()["status"] == "ready" and state()["video"]["width"] > 0, 60,
                 "the bot's video in the page")
        time.sleep(1.0)  # the idle face streams before anything is said
        page.fill("#text", SENTENCE)
        page.click("#send")
        webm = base64.b64decode(page.evaluate("fgPipecat.record(6500)"))
        s = state()
        page.locator("#bot-video").screenshot(path=str(tmp_path / "avatar.png"))
        shown = np.asarray(Image.open(tmp_path / "avatar.png").convert("RGB"))
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        takes.append(_take(webm, avatar, tmp_path / "received.webm"))
        if abs(takes[0]["lag"]) > 4:
            # The sync of one take wanders with the machine's load (about ±2 frames between runs, once +5 in a full
            # suite on 2 cores): a second sentence, measured the same way, before the sync is called broken.
            page.fill("#text", SENTENCE)
            page.click("#send")
            webm = base64.b64decode(page.evaluate("fgPipecat.record(6500)"))
            takes.append(_take(webm, avatar, tmp_path / "received2.webm"))
            s = state()
        page.click("#connect")  # "Disconnect": the bot's pipeline ends, and its avatar graph with it
        wait_for(lambda: state()["status"] == "disconnected", 10, "the page to disconnect")
        wait_for(lambda: not framegraph_threads(), 15, "the bot's avatar graph to end with the connection")
    finally:
        page.context.close()
    assert s["sent"] == len(takes) and s["botReady"] and not s["errors"] and not errors, (s, errors)
    assert (s["video"]["width"], s["video"]["height"]) == (256, 256) and s["video"]["time"] > 5
    assert not s["audio"]["paused"] and s["audio"]["time"] > 5  # the page plays the bot's sound
    assert_shows_portrait(shown, avatar.portrait.numpy(), "the page's video of the avatar")

    for t in takes:
        speech, silence, opening, change = t["speech"], t["silence"], t["opening"], t["change"]
        print(f"\nbrowser recording: {t['frames']} frames, audio rms {t['audio_rms']:.0f}, "
              f"{speech.sum()} speech / {silence.sum()} silent frames; openness {opening[speech].mean():.2f} "
              f"(max {opening[speech].max():.2f}) vs {opening[silence].mean():.2f}; change "
              f"{change[speech[1:]].mean():.2f} vs {change[silence[1:]].mean():.2f}; "
              f"mouth after sound by {t['lag']} frames (correlation {max(t['corr']):.2f})")
        assert t["frames"] > 100 and t["audio_rms"] > 500  # the speech was heard, not silence
        assert speech.sum() > 40 and silence.sum() > 5, (speech.sum(), silence.sum())
        assert opening[speech].max() > 3.0 and opening[silence].mean() < 2.0
        assert change[speech[1:]].mean() > 2 * change[silence[1:]].mean()  # the mouth moves while it is heard
    # lips and sound together within ±4 frames (±133 ms) in what the browser received: the example's 30 fps
    # (aiortc's stamps) and its 100 ms picture delay (the browser's slower audio path) put them there (measured
    # 0 to +3 frames; at 25 fps the lips ran 5-8 frames ahead of the sound, see docs/pipecat.md)
    last = takes[-1]
    assert max(last["corr"]) > 0.4 and abs(last["lag"]) <= 4, [(t["lag"], t["corr"]) for t in takes]
