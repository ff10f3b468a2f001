"""The served web page (apps/web) over the WebSocket (``?transport=websocket``: glass-to-glass and WebCodecs are
that transport's; the page over WebRTC, its default, is test_browser_webrtc.py) in a real headless Chromium
against a real server on loopback.

Chromium's fake microphone plays a speech-like WAV written here; the page streams it to the ``scope``
pipeline (and to the real ``avatar`` with the shipped bundle) and shows what comes back. Asserted from the page's own
measurements (``window.fg.stats()``) and screenshots: frames are presented on the canvas, the page's glass-to-glass
delay (mic capture → frame presented, on the browser's clock) is under a second, the ``testcard`` plays (H.264 through
WebCodecs), and in the ``scene`` viewer a mouse drag turns the camera: the page sends ``pose`` messages,
the server's camera receives exactly them, and the rendered picture changes.

Needs ``chromium`` (apt) and ``playwright`` (pip; its browsers are not downloaded): see browser_util.py.
A screenshot of each test is saved under its tmp_path.
"""
import numpy as np
import pytest
import torch
from browser_util import Page, assert_not_blank, assert_shows_portrait
from helpers import wait_for
from server_util import running

from framegraph.renderers.cameras import look_at


@pytest.fixture
def server():
    with running() as handle:
        yield handle


@pytest.fixture
def page(browser, server, tmp_path):
    p = Page(browser, server.http_url + "?transport=websocket", screenshot=tmp_path / "page.png")
    yield p
    if not p.screenshot_path.exists():  # the test failed before its own: keep what the page showed
        p.screenshot()
    p.close()


def stop_and_check(page: Page, reason: str = "stopped") -> dict:
    page.page.click("#stop")
    s = page.wait_stats(lambda s: s["closed"] is not None, 15, "the session to end")
    assert s["ended"] == reason and s["closed"] == 1000, s
    assert not page.errors, page.errors
    return s


def test_scope_presents_frames_with_sub_second_glass_to_glass(page, server):
    page.start("scope", size="320x240", codec="jpeg")
    s = page.wait_stats(lambda s: s["presented"] >= 60 and s["g2g_ms"]["n"] >= 50, 25,
                        "60 scope frames presented")
    rgb = page.canvas_rgb()
    page.screenshot()
    session = next(iter(server.server.sessions.values()))
    audio_in = session.counters["audio_samples_in"]
    assert s["pipeline"] == "scope" and s["video"]["width"] == 320
    assert_not_blank(rgb, "the scope canvas")
    assert rgb[..., 1].max() > 200  # the green level bars of the speech bursts are on screen
    assert 5 <= s["fps"] <= 40, s["fps"]  # 25 fps, give or take a loaded machine
    assert audio_in > 2 * 16000  # the fake microphone's audio reached the server
    # glass-to-glass as the page measures it: presented (performance.now) − capture time echoed in the
    # header, both on the browser's clock; it includes what the server measured on its own side
    g2g, srv = s["g2g_ms"], s["server_ms"]
    # the bar: the typical delay is under a second. The tail is printed, not asserted: on this
    # 2-core machine about one run in three shows a burst of 1.5–3 s frames (cause not yet found).
    assert 0 < g2g["p50"] < 1000, g2g
    # it includes the server's own share; Chromium's reported mic input latency is printed, not asserted
    # (its fake device has reported anywhere from ~50 ms to over a second on this loaded machine)
    assert g2g["p50"] > srv["p50"], (g2g, srv, s["input_latency_ms"])
    assert s["drops_seen"] == 0 or s["drops_seen"] < s["received"] / 10
    final = stop_and_check(page)
    assert final["server_stats"]["received"]["audio_samples_in"] > 0
    print(f"\nscope: {s['presented']} frames at {s['fps']:.1f} fps, first after {s['first_frame_ms']:.0f} ms, "
          f"glass-to-glass p50 {g2g['p50']:.0f} p95 {g2g['p95']:.0f} ms (mic input {s['input_latency_ms']:.0f} ms, "
          f"server {srv['p50']:.1f} ms)")


def test_avatar_speaks_the_microphone_with_sub_second_glass_to_glass(page, server):
    """The real avatar pipeline with the shipped bundle: the microphone's speech drives the generated face
    (Denoiser on this CPU: fewer frames per second than 25, reported, but the delay stays bounded)."""
    from framegraph.models.avatar import load_avatar

    page.start("avatar", size="", codec="jpeg")
    s = page.wait_stats(lambda s: s["presented"] >= 40 and s["g2g_ms"]["n"] >= 30, 90, "40 avatar frames presented")
    rgb = page.canvas_rgb()
    page.screenshot()
    assert s["pipeline"] == "avatar" and (s["video"]["width"], s["video"]["height"]) == (256, 256)
    assert_not_blank(rgb, "the avatar canvas")
    assert_shows_portrait(rgb, load_avatar("assets/avatars/astronaut").portrait.numpy(), "the avatar canvas")
    g2g = s["g2g_ms"]
    assert 0 < g2g["p50"] < 1000, g2g
    assert s["fps"] >= 2, s["fps"]
    final = stop_and_check(page)
    assert final["server_stats"]["received"]["audio_samples_in"] > 0
    print(f"\navatar: {s['presented']} frames at {s['fps']:.1f} fps, first after {s['first_frame_ms']:.0f} ms, "
          f"glass-to-glass p50 {g2g['p50']:.0f} p95 {g2g['p95']:.0f} ms")


def test_testcard_plays_through_webcodecs_h264(page):
    page.start("testcard", size="320x240", codec="h264")
    s = page.wait_stats(lambda s: s["presented"] >= 40, 20, "40 test-card frames presented")
    assert s["pipeline"] == "testcard" and s["video"]["codec"] == "h264"
    assert s["audio_out"] > 50  # the beep track arrives too (played by pts when "play" is ticked)
    assert 5 <= s["fps"] <= 40, s["fps"]
    assert s["g2g_ms"]["n"] == 0  # no microphone behind these frames: no glass-to-glass claimed
    rgb = page.canvas_rgb()
    page.screenshot()
    assert_not_blank(rgb, "the test card")
    assert len(np.unique(rgb.reshape(-1, 3)[::5] // 32, axis=0)) >= 6  # the coloured bands
    stop_and_check(page)


def drag_view(page, right: float, down: float, steps: int) -> None:
    """Drag the mouse from the middle of the page's ``#view`` by ``right`` of its width and ``down`` of its height,
    in ``steps`` moves."""
    box = page.page.locator("#view").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    mouse = page.page.mouse
    mouse.move(x, y)
    mouse.down()
    mouse.move(x + box["width"] * right, y + box["height"] * down, steps=steps)
    mouse.up()


def test_scene_viewer_camera_follows_a_mouse_drag(page, server):
    page.start("scene", size="320x240", codec="jpeg")
    s = page.wait_stats(lambda s: s["presented"] >= 3, 30, "the first scene frames")
    session = next(iter(server.server.sessions.values()))
    cam = s["ready"]["camera"]
    from framegraph.apps.server.pipelines.scene import orbit_eye
    initial = look_at(orbit_eye(cam["target"], cam["distance"], cam["azimuth_deg"], cam["elevation_deg"]),
                      cam["target"], cam["up"])
    assert np.allclose(s["pose"], initial.numpy(), atol=1e-5)  # the page starts where the server's camera is
    assert s["poses_sent"] == 0 and session.counters["poses_in"] == 0
    before = page.canvas_rgb()
    assert_not_blank(before, "the rendered scene")

    drag_view(page, 1 / 3, 1 / 8, steps=12)
    s = page.wait_stats(lambda s: s["poses_sent"] >= 3, 10, "poses sent while dragging")
    pose_in = session.pipeline.pose_in
    wait_for(lambda: session.counters["poses_in"] == page.stats()["poses_sent"], 5, "the server to get every pose")
    s = page.stats()
    assert pose_in.received == s["poses_sent"]
    assert np.allclose(pose_in.last.numpy(), s["pose"], atol=1e-6)  # the camera got the page's newest pose
    assert abs(s["orbit"]["az"] - (cam["azimuth_deg"] - 60)) < 2  # a third of the width: 60° round
    assert s["orbit"]["el"] > cam["elevation_deg"]
    # the camera's position moved on the orbit, at the same distance from the target
    R, t = pose_in.last[:3, :3], pose_in.last[:3, 3]
    eye = -(R.T @ t)
    assert abs(float((eye - torch.tensor(cam["target"])).norm()) - cam["distance"]) < 1e-3
    assert not np.allclose(s["pose"], initial.numpy(), atol=1e-2)
    shown = s["presented"]
    page.wait_stats(lambda s: s["presented"] >= shown + 3, 20, "frames rendered from the new pose")
    after = page.canvas_rgb()
    page.screenshot()
    assert_not_blank(after, "the rendered scene after the drag")
    diff = np.abs(after.astype(int) - before.astype(int)).mean()
    assert diff > 3, f"the picture did not change after the drag (mean abs diff {diff:.2f})"
    stop_and_check(page)


def test_the_page_orbits_the_scene_while_the_avatar_talks_in_it(page, server):
    """``scene_avatar``: the fake microphone's speech drives the shipped avatar standing in the toy scene; a drag
    turns the camera while it talks — the server's camera gets the page's poses and the picture changes."""
    page.start("scene_avatar", size="", codec="jpeg")  # its own size: 320x180
    s = page.wait_stats(lambda s: s["presented"] >= 5, 60, "the first frames of the avatar in the scene")
    session = next(iter(server.server.sessions.values()))
    assert s["ready"]["pose_in"] is True and s["ready"]["audio_in"] and s["ready"]["avatar"] == "astronaut"
    before = page.canvas_rgb()
    assert_not_blank(before, "the avatar in the scene")
    drag_view(page, 1 / 4, 0, steps=10)
    page.wait_stats(lambda s: s["poses_sent"] >= 3, 10, "poses sent while dragging")
    wait_for(lambda: session.counters["poses_in"] == page.stats()["poses_sent"], 5, "the server to get every pose")
    shown = page.stats()["presented"]
    page.wait_stats(lambda s: s["presented"] >= shown + 3, 30, "frames from the new pose")
    after = page.canvas_rgb()
    page.screenshot()
    assert np.abs(after.astype(int) - before.astype(int)).mean() > 3  # seen from elsewhere now
    final = stop_and_check(page)
    assert final["server_stats"]["received"]["audio_samples_in"] > 0  # the microphone drove the avatar


def test_the_readout_says_n_a_for_glass_to_glass_it_cannot_measure_never_nan(browser, server, tmp_path):
    """The page over WebRTC (its default, as in the demo) without a microphone: no frame carries a capture time."""
    page = Page(browser, server.http_url, screenshot=tmp_path / "page.png")
    try:
        page.page.wait_for_selector("#pipeline option[value='scope']", state="attached", timeout=10_000)
        page.page.select_option("#pipeline", "scope")
        page.player_frame.evaluate("window.fg.start({ mic: false })")
        page.wait_stats(lambda s: s["presented"] >= 10, 40, "10 scope frames presented")
        wait_for(lambda: "glass→glass" in page.player_frame.inner_text("#readout"), 5, "the readout")
        readout = page.player_frame.inner_text("#readout")
        assert "glass→glass   n/a — not measured over WebRTC" in readout and "NaN" not in readout, readout
        stop_and_check(page)
    finally:
        page.close()
