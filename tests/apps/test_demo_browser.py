"""The Gradio demo (apps/demo) in a real headless Chromium: the page loads with the player embedded (an iframe
of apps/web/player.html). Over its WebSocket (pinned, for the page's own glass-to-glass figure) a microphone take
(Chromium's fake microphone plays a speech-like WAV) presents frames with that delay under a second, "Stop take →
MP4" hands over an MP4 that decodes, typed text spoken by eSpeak NG streams into a take, and two tabs get two
sessions (these on the cheap ``scope`` pipeline); over WebRTC, the player's default, a microphone take is
recorded as well (the relay taps the session its offer opened). The demo as `framegraph demo` starts it (WebRTC)
runs the real avatar with the shipped bundle: before any take the idle face shows and "Stop take" says there is
none; the first Speak on a fresh server and page is heard in the recorded take and moves the mouth (not during
the silence after it); the state control reaches the avatar's graph.
A screenshot of each test is saved under its tmp_path.

Needs ``chromium`` (apt) and ``playwright`` (pip; no ``playwright install``): see browser_util.py.
"""
import os
import time

import numpy as np
import pytest
import torch
from browser_util import Page, assert_not_blank, assert_shows_portrait
from helpers import framegraph_threads, wait_for

from framegraph.apps.demo import DemoConfig, serve_demo_in_thread
from framegraph.apps.demo.ui import NO_TAKE
from framegraph.stream.media import read_video


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    config = DemoConfig(port=0, pipeline="scope", takes_dir=str(tmp_path_factory.mktemp("takes")),
                        transport="websocket")
    with serve_demo_in_thread(config) as handle:
        yield handle
    wait_for(lambda: not framegraph_threads(), 10, "graph threads to end")


class DemoPage(Page):
    """The Gradio page in a fresh browser context; the player is its iframe."""

    def __init__(self, browser, url: str, screenshot):
        super().__init__(browser, url, viewport=(1280, 900), screenshot=screenshot, console_errors=False)
        self.page.wait_for_selector("#fg-player iframe", timeout=30_000)
        self.player = self.page.frame_locator("#fg-player iframe")
        self.player.locator("#view").wait_for(timeout=30_000)
        wait_for(lambda: self.frame is not None and self.frame.evaluate("!!window.fg"), 30, "the player")

    @property
    def frame(self):
        return next((f for f in self.page.frames if "/fg/player.html" in f.url), None)

    @property
    def player_frame(self):
        return self.frame


@pytest.fixture
def page(browser, demo, tmp_path):
    p = DemoPage(browser, demo.url, tmp_path / "demo.png")
    yield p
    if not p.screenshot_path.exists():
        p.screenshot()
    p.close()
    wait_for(lambda: demo.server.server.session_count == 0, 10, "the page's session to close")


def test_microphone_take_shows_frames_at_sub_second_delay_and_records_an_mp4(page, demo):
    assert "scope" in page.page.inner_text("#fg-pipeline-note")  # the page says which pipeline runs
    page.player.locator("#start").click()
    s = page.wait_stats(lambda s: s["presented"] >= 50 and s["g2g_ms"]["n"] >= 40, 25, "50 frames presented")
    rgb = page.canvas_rgb()
    wait_for(lambda: "fps sent" in page.page.inner_text("#fg-readout"), 5, "the server readout")
    page.screenshot()
    assert s["mic"] and s["pipeline"] == "scope" and s["ready"]["session"] in demo.server.server.sessions
    assert_not_blank(rgb, "the player's canvas")
    assert rgb[..., 1].max() > 200  # the scope's green level bars: the microphone's speech bursts
    assert 5 <= s["fps"] <= 40, s["fps"]
    g2g = s["g2g_ms"]  # microphone capture → frame presented, on the browser's clock
    # the bar is the typical delay; the tail is printed (Chromium's fake mic shows occasional 1.5–3 s bursts
    # on this 2-core machine, see test_browser_page.py)
    assert 0 < g2g["p50"] < 1000, g2g
    assert not s["errors"] and not page.errors, (s["errors"], page.errors)

    page.page.click("#fg-stop")  # the relay stops the session, the recorder finishes the MP4
    page.page.locator("#fg-take a").first.wait_for(timeout=20_000)  # the download link of the take
    assert ".mp4" in page.page.inner_text("#fg-take")
    page.wait_stats(lambda s: s["closed"] == 1000 and s["ended"] == "stopped", 10, "the session to end")
    take = next(t for tabs in demo.ctx.relay.tabs.values() for t in tabs.finished if t.session == s["ready"]["session"])
    video = read_video(take.saved)
    assert len(video["frames"]) >= 40 and video["frames"].shape[1:] == (240, 320, 3)
    assert video["audio"] is not None and len(video["audio"]) >= 16000  # the returned audio, in sync by pts
    print(f"\ndemo mic take: {s['presented']} frames at {s['fps']:.1f} fps, glass-to-glass p50 {g2g['p50']:.0f} "
          f"p95 {g2g['p95']:.0f} ms (browser-reported mic input {s['input_latency_ms']:.0f} ms included)")


def stop_take(page: DemoPage, relay, session: str):
    """Press "Stop take → MP4"; the take once its MP4 is written (its download link shown)."""
    page.page.click("#fg-stop")
    page.page.locator("#fg-take a").first.wait_for(timeout=20_000)
    return next(t for tab in relay.tabs.values() for t in tab.finished if t.session == session)


@pytest.fixture(scope="module")
def webrtc_demo(tmp_path_factory):
    config = DemoConfig(port=0, pipeline="scope", takes_dir=str(tmp_path_factory.mktemp("takes")))
    with serve_demo_in_thread(config) as handle:
        yield handle
    wait_for(lambda: not framegraph_threads(), 10, "graph threads to end")


def test_the_player_takes_over_webrtc_by_default_and_the_take_is_recorded(browser, webrtc_demo, tmp_path):
    page = DemoPage(browser, webrtc_demo.url, tmp_path / "webrtc.png")
    try:
        page.player.locator("#start").click()
        s = page.wait_stats(lambda s: s["presented"] >= 50, 30, "50 frames over WebRTC")
        assert s["transport"] == "webrtc" and s["mic"], s  # its offer went through the demo's port
        assert "transport     webrtc" in page.frame.inner_text("#readout")
        wait_for(lambda: "fps sent" in page.page.inner_text("#fg-readout"), 5, "the server readout (the tap)")
        assert_not_blank(page.canvas_rgb(), "the player's canvas")
        page.screenshot()
        take = stop_take(page, webrtc_demo.ctx.relay, s["ready"]["session"])
        page.wait_stats(lambda s: s["closed"] == 1000 and s["ended"] == "stopped", 10, "the session to end")
        video = read_video(take.saved)
        assert len(video["frames"]) >= 40 and video["frames"].shape[1:] == (240, 320, 3)
        assert video["audio"] is not None and len(video["audio"]) >= 16000
        assert not page.stats()["errors"], page.stats()["errors"]
    finally:
        page.close()
    wait_for(lambda: webrtc_demo.server.server.session_count == 0, 10, "the session to close")


def test_typed_text_streams_into_the_take_and_interrupt_stops_it(page, demo):
    from framegraph.apps.demo import clips

    # a clip fed to an idle player starts a session and is queued before the session is ready: it is
    # spoken once it is, to its end (it was dropped at `ready`, issue #11)
    first = clips.speak("One, two.")
    page.frame.evaluate("url => fg.feed(url)", f"{demo.url}fg/clip/{demo.ctx.clips.put(first)}")
    chunks = -(-len(first) // 320)  # 20 ms chunks
    s = page.wait_stats(lambda s: s["clips"] == 1 and s["presented"] >= 10 and not s["feeding"], 25,
                        "the first clip to be spoken")
    assert s["fed_chunks"] == chunks, (s["fed_chunks"], chunks)
    page.page.fill("#fg-text textarea", "Good morning. This sentence is long enough to interrupt it halfway.")
    page.page.click("#fg-speak")  # into the running session
    s = page.wait_stats(lambda s: s["fed_chunks"] >= chunks + 40 and s["presented"] >= 30, 25,
                        "the spoken clip streaming")
    assert not s["mic"] and s["clips"] == 2 and s["feeding"]
    assert 0 < s["g2g_ms"]["p50"] < 1000, s["g2g_ms"]  # clip chunk sent → its frame presented
    rgb = page.canvas_rgb()
    page.screenshot()
    assert_not_blank(rgb, "the canvas while speaking")
    page.page.click("#fg-interrupt")
    s = page.wait_stats(lambda s: not s["feeding"], 5, "the rest of the clip to be dropped")
    fed = s["fed_chunks"]
    assert fed - chunks < 200  # ~4 s of speech: interrupted well before its end
    time.sleep(0.5)
    assert page.stats()["fed_chunks"] == fed
    assert not page.stats()["errors"] and not page.errors


def test_two_tabs_get_two_sessions(browser, demo, tmp_path):
    pages = [DemoPage(browser, demo.url, tmp_path / f"tab{i}.png") for i in range(2)]
    try:
        for p in pages:
            p.player.locator("#start").click()
        stats = [p.wait_stats(lambda s: s["presented"] >= 10, 25, "frames in both tabs") for p in pages]
        sessions = {s["ready"]["session"] for s in stats}
        assert len(sessions) == 2 and sessions <= set(demo.server.server.sessions)
        tabs = [p.frame.evaluate("new URLSearchParams(location.search).get('url')") for p in pages]
        assert len(set(tabs)) == 2  # each page load has its own relay tab
        pages[1].screenshot()
    finally:
        for p in pages:
            p.close()
    wait_for(lambda: demo.server.server.session_count == 0, 10, "both sessions to close with their tabs")


def audio_rms_at_frames(video: dict) -> np.ndarray:
    """``float [T]``: RMS (int16 units) of a video's audio over each frame's period (40 ms at 25 fps) centred
    on its time; ``video`` from ``read_video``."""
    audio, rate = video["audio"].astype(np.float64), video["audio_rate"]
    half = rate // 50
    centres = np.round((video["frame_times_s"] - video["audio_start_s"]) * rate).astype(int)
    windows = [audio[max(0, c - half):c + half] for c in centres]
    return np.array([np.sqrt(np.mean(w ** 2)) if w.size else 0.0 for w in windows])


@pytest.fixture(scope="module")
def avatar_demo(tmp_path_factory):
    """The demo as `framegraph demo` starts it (pipeline "auto"): the real ``avatar`` pipeline with the
    shipped bundle."""
    config = DemoConfig(port=0, takes_dir=str(tmp_path_factory.mktemp("takes")))
    with serve_demo_in_thread(config) as handle:
        yield handle
    wait_for(lambda: not framegraph_threads(), 10, "graph threads to end")


def test_avatar_first_press_speaks_the_clip_the_mouth_moves_and_the_take_is_heard(browser, avatar_demo, tmp_path,
                                                                                     capfd):
    """On a fresh server and a fresh page, the first press of Speak streams the clip: the take's audio is
    the speech (not silence), the avatar's mouth moves while it plays and rests after it, with a delay of
    one frame's compute (no queue); before that the idle face shows and "Stop take" says there is no take; the state
    control reaches the avatar's graph."""
    from PIL import Image

    from framegraph.apps.server.pipelines.avatar import avatars_dir, load_bundle

    # nothing here loads the avatar before the first press (its bundle, the models): the server alone does
    portrait = np.asarray(Image.open(os.path.join(avatars_dir(), "astronaut", "portrait.png")).convert("RGB"))
    p = DemoPage(browser, avatar_demo.url, tmp_path / "avatar.png")
    try:
        assert "avatar" in p.page.inner_text("#fg-pipeline-note")
        # before any take: the avatar's idle face is on the canvas, and Stop says there is nothing to stop
        wait_for(lambda: p.stats()["poster"], 10, "the idle face to be drawn")
        p.screenshot(tmp_path / "idle.png")
        assert_shows_portrait(p.canvas_rgb(), portrait, "the idle face before any take")
        p.page.click("#fg-stop")
        p.page.get_by_text(NO_TAKE).first.wait_for(timeout=10_000)
        p.page.click("#fg-speak")  # the first press: starts the session and streams the clip
        s = p.wait_stats(lambda s: s["clips"] == 1 and s["presented"] >= 30, 90, "30 avatar frames of the first clip")
        assert s["pipeline"] == "avatar" and (s["video"]["width"], s["video"]["height"]) == (256, 256)
        assert s["transport"] == "webrtc", s["transport"]  # as `framegraph demo` starts it
        # The delay is one frame's compute, never a queue: each frame starts from the newest audio (Stage.stale).
        # On this 2-core CPU, shared with the browser, that compute alone is 0.3-0.7 s (CI saw a 1.3 s p50 while
        # frames still started from audio up to 250 ms old); the sub-second figures are the benchmarks'. Over
        # WebRTC the page cannot stamp its audio's capture: the server's time per frame (graph + send) stands in.
        work = {k: v["work_ms"]["p95"] for k, v in (s["server_stats"] or {}).get("stages", {}).items()}
        assert 0 < s["server_ms"]["p50"] < 1500, (s["server_ms"], work)
        spoken = p.wait_stats(lambda s: not s["feeding"], 30, "the clip to be spoken to its end")
        assert spoken["fed_chunks"] * 0.02 > 2.5, spoken  # all of the ~3.5 s sentence was streamed
        time.sleep(1.5)  # a silent stretch after the speech, in the same take
        from framegraph.models.avatar import StateOverride
        from framegraph.models.avatar.eval.synthetic import mouth_openness, search_box

        session = next(iter(avatar_demo.server.server.sessions.values()))
        state = next(st for st in session.pipeline.graph.stages if isinstance(st, StateOverride))
        assert state.mode == "auto"
        p.page.get_by_label("speaking").check()
        p.wait_stats(lambda s: s["configs_sent"] >= 1, 5, "the state to be sent")
        wait_for(lambda: state.mode == "speaking", 5, "the avatar's state override to be set")
        p.screenshot()
        assert not p.stats()["errors"], p.stats()["errors"]
        p.page.click("#fg-stop")
        p.page.locator("#fg-take a").first.wait_for(timeout=20_000)
        take = next(t for tab in avatar_demo.ctx.relay.tabs.values() for t in tab.finished
                    if t.session == s["ready"]["session"])
        video = read_video(take.saved)  # before the page closes: its takes are deleted with it
    finally:
        p.close()
    wait_for(lambda: avatar_demo.server.server.session_count == 0, 10, "the session to close")
    assert "Traceback" not in capfd.readouterr().err  # "Stop take" before a take is a message, not a crash

    # the take as the user heard and saw it: speech, then silence; the mouth moves with the speech only
    avatar = load_bundle("astronaut")
    audio = video["audio"].astype(np.float64)
    rms = audio_rms_at_frames(video)
    speech, silence = rms > 500, rms < 30
    # enough frames of each to compare (a loaded 2-core CPU presents 6-8 fps: ~21-28 in the speech, 9-12 after)
    assert np.sqrt(np.mean(audio ** 2)) > 500 and speech.sum() >= 12, (np.sqrt(np.mean(audio ** 2)), speech.sum())
    assert silence.sum() >= 5, silence.sum()  # the stretch after the speech
    x0, y0, x1, y1 = search_box(avatar.mouth_box, video["frames"].shape[1:3])
    mouth = video["frames"][:, y0:y1, x0:x1].astype(np.float64)
    change = np.abs(np.diff(mouth, axis=0)).mean(axis=(1, 2, 3))  # frame to frame, in the mouth region
    moving, resting = change[speech[1:]].mean(), change[silence[1:]].mean()
    opening = mouth_openness(torch.from_numpy(video["frames"]), avatar.mouth_box, avatar.portrait)
    print(f"\ndemo avatar over WebRTC: {s['presented']} frames at {s['fps']:.1f} fps, graph + send p50 "
          f"{s['server_ms']['p50']:.0f} p95 {s['server_ms']['p95']:.0f} ms (server); "
          f"take: audio rms {np.sqrt(np.mean(audio ** 2)):.0f}, "
          f"{speech.sum()} speech / {silence.sum()} silent frames, mouth change {moving:.2f} vs {resting:.2f} "
          f"at rest, openness {opening[speech].mean():.2f} vs {opening[silence].mean():.2f} px")
    assert moving > 2.0 and moving > 2 * resting, (moving, resting)
    assert opening[speech].max() > 3.0 and opening[silence].mean() < 2.0, (opening[speech], opening[silence])
