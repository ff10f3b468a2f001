"""Batched sessions (`framegraph serve --batching on`) on a real server on loopback.

Admission from the model service's measured capacity: a video avatar whose generator takes longer than a frame
holds one session; the next one, over the WebSocket and over WebRTC, is refused `full` with its retry time, while
the first keeps streaming; `/metrics` shows the lane, its sessions and the refusal; once the first ends, a new
session is admitted. A session whose client stops reading holds up nobody on the lane it shares."""
import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from test_avatar_pipeline import speak
from test_server_limits import non_reader
from test_server_session import pcm_message, receive_all, start, tone
from websockets.asyncio.client import connect

from framegraph.models.avatar.video.bundle import random_video_avatar, save_video_avatar


def _post(url: str, body: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "metrics", timeout=10) as r:
        return r.read().decode()


@pytest.mark.slow
def test_a_session_past_the_models_measured_capacity_is_refused_full_and_the_first_keeps_streaming(tmp_path,
                                                                                                 monkeypatch):
    from server_util import running

    from framegraph.apps.server.pipelines import base

    # wider than the trained bundles' generator, at a 256² region: on one thread a batch of 2 takes several frames
    save_video_avatar(tmp_path / "heavy", random_video_avatar(region_size=256, generator_channels=(32, 64, 128, 128)))
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))
    monkeypatch.setattr(base, "_SERVICE", base.ModelService(admit=True))
    options = {"portrait": "heavy"}
    with running(stats_interval_s=0.25, batching=True) as srv:
        async def scenario():
            first = asyncio.create_task(speak(srv.url, options, tone(4.0, amp=0.3)))
            (lane,) = await _until(lambda: base._SERVICE.lanes().values() if any(
                ln.sessions for ln in base._SERVICE.lanes().values()) and all(
                ln.cost_ns for ln in base._SERVICE.lanes().values()) else None)
            async with connect(srv.url) as ws:  # the second session: refused at its start, told when to retry
                await ws.send(json.dumps({"type": "start", "version": 1, "pipeline": "avatar",
                                          "options": options}))
                refused = [json.loads(m) for m in await _texts(ws)]
            refused_ns = time.monotonic_ns()
            offer = await asyncio.to_thread(_post, srv.http_url + "webrtc/offer", {
                "type": "offer", "sdp": await _offer_text(), "pipeline": "avatar", "options": options})
            metrics = await asyncio.to_thread(_metrics, srv.http_url)
            ready, got = await first
            return lane, refused, refused_ns, offer, metrics, ready, got

        lane, refused, refused_ns, offer, metrics, ready, got = asyncio.run(scenario())
        assert ready["batched"] is True
        error = refused[0]
        assert error["type"] == "error" and error["code"] == "full" and error["retry_after_s"] == 5.0
        assert "avatar 'heavy' is full on this server" in error["message"] and "a batch of 2" in error["message"]
        assert refused[-1]["type"] == "ended" and not any(m["type"] == "ready" for m in refused)
        status, headers, body = offer  # the same refusal over WebRTC: 503, Retry-After, the code
        assert status == 503 and headers["Retry-After"] == "5" and body["code"] == "full"
        assert f'framegraph_batch_sessions{{lane="{lane.name}"}} 1' in metrics
        assert 'framegraph_server_errors_total{code="full"} 1' in metrics  # the WebSocket's error message
        assert 'framegraph_server_rejected_total{reason="full"} 1' in metrics  # the offer
        assert "framegraph_server_session_video_fps{session=" in metrics
        # the first session went on streaming after the refusals: pictures of the sound it sent after them
        after = [h for h, _, _ in got["video"] if h.capture_ns > refused_ns]
        assert len(after) >= 3 and lane.stats.served >= len(got["video"])
        assert lane.sessions == 0 and not lane.running  # its session ended: no thread left

        async def again():  # the lane is empty again: a new session is admitted
            return await speak(srv.url, options, tone(0.5, amp=0.3))

        ready, _ = asyncio.run(again())
        assert ready["type"] == "ready" and ready["batched"] is True


async def _until(probe, timeout_s: float = 60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = probe()
        if value:
            return tuple(value)
        await asyncio.sleep(0.05)
    raise AssertionError("the first session's lane never measured its cost")


async def _texts(ws) -> list[str]:
    """Every text message until the server closes the connection."""
    texts = []
    try:
        async for message in ws:
            if isinstance(message, str):
                texts.append(message)
    except Exception:  # noqa: BLE001 - the close, whichever code
        pass
    return texts


async def _offer_text() -> str:
    from test_server_webrtc import offer_text

    return await offer_text()


@pytest.mark.slow
def test_a_session_whose_client_stops_reading_holds_up_nobody_on_the_lane(tmp_path, monkeypatch):
    from server_util import running

    from framegraph.apps.server.pipelines import base

    save_video_avatar(tmp_path / "me", random_video_avatar())
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))
    monkeypatch.setattr(base, "_SERVICE", base.ModelService(admit=True, window_ms=45.0))
    samples = tone(3.0, amp=0.3)
    with running(stats_interval_s=0.25, batching=True) as srv:
        async def scenario():
            stalled = await non_reader(srv.url, srv.server.port)
            await start(stalled, "avatar", portrait="me")  # reads "ready", then never again

            async def speak_unread():  # the stalled client keeps speaking (its frames fill its socket)
                for i in range(len(samples) // 320):
                    await stalled.send(pcm_message(i, samples[i * 320:(i + 1) * 320]))
                    await asyncio.sleep(0.02)

            talking = asyncio.create_task(speak_unread())
            async with connect(srv.url) as ws:  # the other client reads as it speaks
                ready = await start(ws, "avatar", portrait="me")
                reading = asyncio.create_task(receive_all(ws, 60))
                for i in range(len(samples) // 320):
                    await ws.send(pcm_message(i, samples[i * 320:(i + 1) * 320]))
                    await asyncio.sleep(0.02)
                await ws.send(json.dumps({"type": "stop"}))
                got = await reading
            await talking
            metrics = await asyncio.to_thread(_metrics, srv.http_url)
            stalled.transport.abort()
            return ready, got, metrics

        ready, got, metrics = asyncio.run(scenario())
        (lane,) = base._SERVICE.lanes().values()
    assert ready["batched"] is True
    captured = [h.capture_ns for h, _, _ in got["video"]]
    assert len(captured) >= 50  # of 75 frames (3 s at 25 fps): a loaded CPU skips some live
    assert max(b - a for a, b in zip(captured, captured[1:])) < 0.5e9  # the reader's pictures never stalled
    drops = [line for line in metrics.splitlines() if line.startswith("framegraph_server_send_drops_total")]
    assert any(float(line.split()[-1]) > 0 for line in drops), drops  # the other did stop reading
    assert lane.stats.served >= len(captured) and not lane.running


@pytest.mark.slow
def test_the_page_refused_full_by_a_server_that_knows_another_starts_the_session_there(tmp_path, monkeypatch):
    """A cluster replica whose model is full names another in its ``full`` error (``url``). The browser page goes
    on there: the user sees the avatar from the other server, not an error. The two are real servers on loopback;
    the first is told where the other is as a cluster replica is, through ``place_elsewhere``."""
    import threading

    from browser_util import Page, assert_not_blank, chromium, write_speech_wav
    from helpers import wait_for
    from server_util import running

    from framegraph.apps.server.pipelines import base

    save_video_avatar(tmp_path / "heavy", random_video_avatar(region_size=256, generator_channels=(32, 64, 128, 128)))
    monkeypatch.setenv("FRAMEGRAPH_AVATARS", str(tmp_path))
    monkeypatch.setattr(base, "_SERVICE", base.ModelService(admit=True))
    write_speech_wav(tmp_path / "mic.wav")
    options = {"portrait": "heavy"}
    with running(stats_interval_s=0.25, batching=True) as full, \
            running(allowed_origins=(full.http_url.rstrip("/"),)) as other:  # the page's origin is the first's
        elsewhere = other.url
        full.server.place_elsewhere = lambda ticket: elsewhere
        holder = threading.Thread(target=lambda: asyncio.run(speak(full.url, options, tone(14.0, amp=0.3))))
        holder.start()
        try:
            wait_for(lambda: any(ln.sessions and ln.cost_ns for ln in base._SERVICE.lanes().values()), 90,
                     "the first session's lane to measure its cost")
            page_url = f"{full.http_url}?transport=websocket&options={urllib.parse.quote(json.dumps(options))}"
            with chromium(tmp_path / "mic.wav") as browser:
                page = Page(browser, page_url, screenshot=tmp_path / "page.png")
                try:
                    page.start("avatar", size="", codec="jpeg")
                    s = page.wait_stats(lambda s: s["presented"] >= 10, 60, "10 pictures from the other server")
                    rgb = page.canvas_rgb()
                    page.screenshot()
                    log = page.page.inner_text("#log")
                finally:
                    page.close()
        finally:
            holder.join(60)
    assert s["sent_on"] == 1 and s["errors"] == [] and s["pipeline"] == "avatar" and s["ended"] is None, s
    assert "full here" in log and f"goes on to {elsewhere}" in log, log
    assert full.server.rejected["full"] == 0 and full.server.errors["full"] == 1  # refused once, at its start
    assert other.server.sessions_total == 1
    assert_not_blank(rgb, "the avatar from the other server")
    assert not page.errors, page.errors
