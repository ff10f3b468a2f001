"""framegraph on a real local Ray cluster (Ray Serve, CPU replicas, loopback): sessions spread by capacity
and stay on one replica, a full cluster answers 503, a replica whose model is full sends the session on, the
single server's rules hold through the front door, one Prometheus view, a killed replica, scaling with drain,
autoscaling on live sessions."""
import asyncio
import json
import os
import signal
import time

import pytest
from helpers import REPO, wait_for
from test_server_session import (
    check_hostile_session,
    hostile_session,
    http_request,
    pcm_message,
    receive_all,
    start,
    tone,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

pytest.importorskip("ray.serve")

from framegraph.apps.cluster import ClusterSettings, start_cluster  # noqa: E402
from framegraph.apps.cluster.replica import DRAIN_CODE  # noqa: E402

FPS = 10
GRACE_S = 2.0

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two CPU replicas of three session slots each, batching on, on a local Ray cluster of two cores.

    Their avatars are the shipped ones and ``heavy``, a video avatar whose model holds one session.
    The replicas' processes inherit ``FRAMEGRAPH_AVATARS`` from this one when Ray starts.
    """
    import ray

    from framegraph.models.avatar.video.bundle import random_video_avatar, save_video_avatar

    avatars = tmp_path_factory.mktemp("avatars")
    for shipped in (REPO / "assets" / "avatars").iterdir():
        (avatars / shipped.name).symlink_to(shipped)
    # wider than the trained bundles' generator, at a 256² region: on one thread a batch of 2 takes several frames
    save_video_avatar(avatars / "heavy", random_video_avatar(region_size=256, generator_channels=(32, 64, 128, 128)))
    settings = ClusterSettings(port=0, replicas=2, sessions_per_replica=3, cpus_per_replica=0.5,
                               drain_grace_s=GRACE_S, stats_interval_s=0.5, batching=True)
    before = os.environ.get("FRAMEGRAPH_AVATARS")
    os.environ["FRAMEGRAPH_AVATARS"] = str(avatars)
    try:
        c = start_cluster(settings, num_cpus=2)
        yield c
        c.stop()
    finally:
        if before is None:
            os.environ.pop("FRAMEGRAPH_AVATARS", None)
        else:
            os.environ["FRAMEGRAPH_AVATARS"] = before
        if ray.is_initialized():
            ray.shutdown()


def wait_idle(cluster) -> None:
    """Until every replica reports no session: a replica frees a slot once the session's graph has
    stopped and tells the front door at once."""
    wait_for(lambda: all(r["sessions"] == 0 and r["pending"] == 0 for r in cluster.live()), 30, "an idle cluster")


@pytest.fixture(autouse=True)
def idle_cluster(cluster):
    """Each test starts on an idle cluster."""
    wait_idle(cluster)


class Take:
    """One test-card session as a client sees it: where it landed, its frames' arrival times, its end."""

    def __init__(self):
        self.port = None
        self.session = None
        self.frames: list[float] = []
        self.ended = None
        self.close_code = None
        self.close_reason = ""
        self.closed_at = None

    def gap_s(self, after: float, before: float) -> float:
        """Longest wait between frames that arrived in [after, before] (s)."""
        times = [after] + [t for t in self.frames if after <= t <= before] + [before]
        return max(b - a for a, b in zip(times, times[1:]))


async def take(url: str, seconds: float, *, ready: asyncio.Event | None = None,
               stop: asyncio.Event | None = None) -> Take:
    """Run a test-card session of ``seconds`` through the front door (the client follows its 307); it
    sends ``stop`` when ``stop`` is set."""
    t = Take()
    async with connect(url, open_timeout=20) as ws:
        t.port = ws.remote_address[1]
        msg = await start(ws, "testcard", size="64x48", fps=FPS, seconds=seconds)
        t.session = msg["session"]
        if ready is not None:
            ready.set()
        stopper = asyncio.create_task(_stop_when(ws, stop)) if stop is not None else None
        try:
            async for m in ws:
                if isinstance(m, bytes):
                    t.frames.append(time.monotonic())
                elif json.loads(m)["type"] == "ended":
                    t.ended = json.loads(m)["reason"]
        except ConnectionClosed:
            pass
        if stopper is not None:
            stopper.cancel()
        t.close_code, t.close_reason, t.closed_at = ws.close_code, ws.close_reason or "", time.monotonic()
    return t


async def _stop_when(ws, stop: asyncio.Event) -> None:
    await stop.wait()
    try:
        await ws.send(json.dumps({"type": "stop"}))
    except ConnectionClosed:
        pass


def replica_ports(cluster) -> dict[int, dict]:
    return {int(r["url"].rsplit(":", 1)[1].split("/")[0]): r for r in cluster.live()}


def test_six_sessions_spread_by_capacity_each_on_one_replica_all_complete(cluster):
    async def main():
        tasks = [asyncio.create_task(take(cluster.url, 3.0)) for _ in range(6)]
        await asyncio.sleep(2.0)
        view = await asyncio.to_thread(cluster.view)
        return await asyncio.gather(*tasks), view

    takes, view = asyncio.run(main())
    ports = replica_ports(cluster)
    assert sorted(t.port for t in takes).count(sorted(ports)[0]) == 3  # three on each replica
    assert {t.port for t in takes} == set(ports)
    for t in takes:
        holders = [r for r in view["replicas"] if t.session in r["session_ids"]]
        assert len(holders) == 1 and str(t.port) in holders[0]["url"]  # the session lived on the replica it reached
        assert t.ended == "finished" and len(t.frames) >= 0.8 * 3.0 * FPS  # ~30 frames each, to the end


def test_a_full_cluster_answers_503_at_once_and_admits_again_when_a_slot_frees(cluster):
    async def main():
        readies = [asyncio.Event() for _ in range(6)]
        tasks = [asyncio.create_task(take(cluster.url, 4.0, ready=r)) for r in readies]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 30)
        t0 = time.monotonic()
        with pytest.raises(InvalidStatus) as refused:
            await connect(cluster.url, open_timeout=10)
        refused_in = time.monotonic() - t0
        place = await asyncio.to_thread(http_request, cluster.http_url + "place")
        await asyncio.gather(*tasks)
        await asyncio.to_thread(wait_idle, cluster)  # the replicas report the freed slots at once
        after = await take(cluster.url, 0.5)
        return refused.value.response, refused_in, place, after

    response, refused_in, place, after = asyncio.run(main())
    assert response.status_code == 503 and b"cluster full" in response.body and refused_in < 2.0
    assert place[0] == 503
    assert after.ended == "finished"


async def hold_heavy(url: str, ready: asyncio.Event, stop: asyncio.Event) -> dict:
    """A ``heavy`` avatar session through the front door, speaking and read from ``ready`` until ``stop``;
    returns ``ready``."""
    async with connect(url, open_timeout=20) as ws:
        await ws.send(json.dumps({"type": "start", "version": 1, "pipeline": "avatar", "options": HEAVY}))
        msg = json.loads(await asyncio.wait_for(ws.recv(), 90))  # the first session warms its replica's lane
        assert msg["type"] == "ready", msg
        ready.set()
        reading = asyncio.create_task(receive_all(ws, 300))
        chunk, i = tone(0.02, amp=0.3), 0
        while not stop.is_set():
            await ws.send(pcm_message(i, chunk))
            await asyncio.sleep(0.02)
            i += 1
        await ws.send(json.dumps({"type": "stop"}))
        await reading
    return msg


async def refusals(url: str) -> list[dict]:
    """Follow a ``heavy`` session that full replicas send on: each replica's ``error``, until one has no ``url``."""
    errors = []
    while url:
        async with connect(url, open_timeout=20) as ws:
            await ws.send(json.dumps({"type": "start", "version": 1, "pipeline": "avatar", "options": HEAVY}))
            errors.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        url = errors[-1].get("url")
    return errors


def post_following(url: str, body: dict) -> list[tuple[int, dict, bytes]]:
    """POST ``body`` and follow each 307 by hand; ``(status, headers, body)`` of every answer."""
    import urllib.error
    import urllib.request

    answers = []
    while url:
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"},
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                answers.append((r.status, dict(r.headers), r.read()))
        except urllib.error.HTTPError as exc:
            with exc:
                answers.append((exc.code, dict(exc.headers), exc.read()))
        url = answers[-1][1].get("Location") if answers[-1][0] == 307 else None
    return answers


HEAVY = {"avatar": "heavy"}


def test_a_replica_whose_model_is_full_sends_the_session_on_and_a_cluster_all_full_refuses_it(cluster):
    """The first replica's model holds one ``heavy`` session; a new one placed there lands on the second. With
    both full, a session is refused ``full`` with its retry time, over the WebSocket and over WebRTC."""
    pytest.importorskip("aiortc", reason="WebRTC needs aiortc: pip install 'framegraph[webrtc]'")
    from prometheus_client.parser import text_string_to_metric_families
    from test_server_webrtc import offer_text

    from framegraph.apps.client import stream_session

    def holding() -> list[str]:
        return [r["id"] for r in cluster.live() if r["sessions"] == 1 and r["pending"] == 0]

    def measured_full() -> set[str]:
        """The replicas whose heavy lane has a session and has measured a batch of 2: no room for another."""
        families = {f.name: f for f in text_string_to_metric_families(cluster.metrics())}
        held = {s.labels["replica"] for s in getattr(families.get("framegraph_batch_sessions"), "samples", [])
                if s.value >= 1}
        two = {s.labels["replica"] for s in getattr(families.get("framegraph_batch_cost_ms"), "samples", [])
               if s.labels["size"] == "2"}
        return held & two

    async def main():
        ready, stop = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(hold_heavy(cluster.url, ready, stop))
        await asyncio.wait_for(ready.wait(), 120)
        await asyncio.to_thread(wait_for, lambda: len(holding()) == 1, 10, "the first replica's report")
        (full,) = await asyncio.to_thread(holding)
        # two slots reserved on the other replica (a placement's ticket counts 10 s): the first has the most free
        places = [json.loads((await asyncio.to_thread(http_request, cluster.http_url + "place"))[1])["replica"]
                  for _ in range(2)]
        second = asyncio.create_task(stream_session(cluster.url, "avatar", HEAVY, audio=tone(14.0, amp=0.3)))
        # both lanes full, and the reservations expired: the other replica has slots for the refused sessions
        await asyncio.to_thread(wait_for, lambda: len(measured_full()) == 2 and len(holding()) == 2, 60,
                                "both replicas' lanes held")
        before = await asyncio.to_thread(cluster.view)
        ws_errors = await refusals(cluster.url)  # both full: sent on once, then refused
        offers = await asyncio.to_thread(post_following, cluster.http_url + "webrtc/offer", {
            "type": "offer", "sdp": await offer_text(), "pipeline": "avatar", "options": HEAVY})
        after = await asyncio.to_thread(cluster.view)
        stop.set()
        return full, places, await first, await second, before, ws_errors, offers, after

    full, places, ready, second, before, ws_errors, offers, after = asyncio.run(main())
    (other,) = [r for r in after["replicas"] if r["alive"] and r["id"] != full]
    assert places == [other["id"]] * 2 and ready["batched"] is True
    # the second session: placed on the full replica, sent on by it, streamed by the other; its client saw no refusal
    assert before["moved"] == 1 and f":{second['server_address'].rsplit(':', 1)[1]}/" in other["url"]
    assert second["errors"] == [] and second["format"]["batched"] is True and second["video_frames"] > 0
    first, last = ws_errors
    assert first["code"] == last["code"] == "full" and first["url"] and "url" not in last
    assert last["retry_after_s"] == 5.0 and "avatar 'heavy' is full on this server" in last["message"]
    assert [status for status, _, _ in offers] == [307, 307, 503]  # the front door, the first full replica, the last
    status, headers, body = offers[-1]
    assert headers["Retry-After"] == "5" and json.loads(body)["code"] == "full"
    assert after["moved"] == 3 and after["rejected"]["full"] == before["rejected"].get("full", 0) + 2


def test_the_single_server_rules_hold_through_the_front_door(cluster):
    codes, got = asyncio.run(hostile_session(cluster.url))
    check_hostile_session(codes, got)

    async def bad_avatar():
        async with connect(cluster.url) as ws:
            await ws.send(json.dumps({"type": "start", "pipeline": "avatar", "options": {"portrait": "nobody"}}))
            return json.loads(await asyncio.wait_for(ws.recv(), 60))

    reply = asyncio.run(bad_avatar())
    assert reply["type"] == "error" and reply["code"] == "bad_option" and "astronaut" in reply["message"]
    status, body = http_request(cluster.http_url + "nope.html")
    assert status == 404


def test_one_prometheus_view_of_the_cluster(cluster):
    from prometheus_client.parser import text_string_to_metric_families

    async def main():
        readies = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(take(cluster.url, 2.5, ready=r)) for r in readies]
        await asyncio.gather(*(r.wait() for r in readies))
        await asyncio.sleep(1.0)
        text = await asyncio.to_thread(cluster.metrics)
        await asyncio.gather(*tasks)
        return text

    text = asyncio.run(main())
    families = {f.name: f for f in text_string_to_metric_families(text)}  # a real parser: the text is valid
    sessions = {s.labels["replica"]: s.value for s in families["framegraph_cluster_replica_sessions"].samples}
    assert len(sessions) == 2 and sum(sessions.values()) == 2
    stage = families["framegraph_stage_work_seconds"].samples
    assert {s.labels["replica"] for s in stage} == set(sessions)  # both replicas' graphs, labelled
    assert text.count("# TYPE framegraph_stage_work_seconds ") == 1


def test_a_killed_replica_ends_its_sessions_at_once_and_the_others_keep_streaming(cluster):
    async def main():
        readies = [asyncio.Event() for _ in range(4)]
        tasks = [asyncio.create_task(take(cluster.url, 8.0, ready=r)) for r in readies]
        await asyncio.gather(*(r.wait() for r in readies))
        await asyncio.sleep(0.5)
        victim = (await asyncio.to_thread(cluster.live))[0]
        killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        await asyncio.sleep(0.6)  # more than two heartbeats: the front door probes it, and it refuses
        try:
            newcomer = await take(cluster.url, 0.5)
        except InvalidStatus as exc:
            raise AssertionError(f"{exc.response.body} {await asyncio.to_thread(cluster.view)}") from None
        return victim, killed_at, newcomer, await asyncio.gather(*tasks)

    victim, killed_at, newcomer, takes = asyncio.run(main())
    port = int(victim["url"].rsplit(":", 1)[1].split("/")[0])
    lost = [t for t in takes if t.port == port]
    kept = [t for t in takes if t.port != port]
    assert len(lost) == 2 and len(kept) == 2
    for t in lost:
        assert t.close_code == 1006 and t.closed_at - killed_at < 2.0  # ended within 2 s, connection lost
    for t in kept:
        assert t.ended == "finished" and t.gap_s(killed_at, killed_at + 3.0) < 1.0  # no stall
    assert newcomer.port != port and newcomer.ended == "finished"
    cluster.wait_for_replicas(2, timeout_s=90)  # Serve starts a replacement, which reports in


def test_the_page_from_the_front_door_plays_a_session_held_by_a_replica(cluster, tmp_path):
    from browser_util import Page, assert_not_blank, chromium, write_speech_wav

    # Chromium for this test alone: Playwright's sync API keeps an event loop running on this thread while
    # it is open, and the tests after this one drive sessions with asyncio.run.
    write_speech_wav(tmp_path / "mic.wav")
    with chromium(tmp_path / "mic.wav") as browser:
        page = Page(browser, cluster.http_url, screenshot=tmp_path / "page.png")
        try:
            page.start("testcard", size="320x240", codec="jpeg")  # the page asks /place, then the replica
            s = page.wait_stats(lambda s: s["presented"] >= 20, 40, "20 test-card frames presented")
            rgb = page.canvas_rgb()
            page.screenshot()
            holders = [r for r in cluster.live() if r["sessions"] == 1]
            assert len(holders) == 1 and s["pipeline"] == "testcard"  # the session lives on one replica
            assert_not_blank(rgb, "the test card through the cluster")
            assert not page.errors, page.errors
        finally:
            page.close()


def test_a_webrtc_offer_at_the_front_door_is_placed_on_a_replica_that_streams_it_directly(cluster):
    """POST /webrtc/offer at the front door → 307 to a replica's own offer endpoint with a ticket (followed by the
    client); the session runs there and its RTP goes from the replica to the client, not through Ray."""
    pytest.importorskip("aiortc", reason="WebRTC needs aiortc: pip install 'framegraph[webrtc]'")
    from framegraph.apps.client_webrtc import stream_session_webrtc

    s = asyncio.run(stream_session_webrtc(cluster.url, "testcard", {"seconds": 2.0, "size": "160x120", "fps": FPS}))
    ports = replica_ports(cluster)
    assert int(s["server_address"].rsplit(":", 1)[1]) in ports  # the offer was answered by a replica
    assert s["ended"] == "finished" and s["video_frames"] >= 0.8 * 2.0 * FPS, s


def test_autoscaling_on_live_sessions_1_2_1_with_the_drain_honoured(cluster):
    """Last in this module: it replaces the module's fixed-size application with an autoscaled one."""
    settings = ClusterSettings(port=0, replicas=1, min_replicas=1, max_replicas=2, sessions_per_replica=3,
                               target_fill=0.75, cpus_per_replica=0.5, drain_grace_s=GRACE_S, stats_interval_s=0.5)
    auto = start_cluster(settings)  # replaces the fixed-size application on the same Ray cluster
    wait_for(lambda: [r["capacity"] for r in auto.live()] == [3], 120, "the autoscaled application alone")

    async def main():
        stops = [asyncio.Event() for _ in range(4)]
        readies = [asyncio.Event() for _ in range(4)]
        tasks = [asyncio.create_task(take(auto.url, 120.0, ready=readies[i], stop=stops[i])) for i in range(3)]
        await asyncio.gather(*(r.wait() for r in readies[:3]))  # 3 sessions on a replica of 3: want 2 replicas
        await asyncio.to_thread(wait_for, lambda: len(auto.live()) == 2, 90, "a second replica")
        tasks.append(asyncio.create_task(take(auto.url, 120.0, ready=readies[3], stop=stops[3])))
        await readies[3].wait()  # on the new replica: it has every slot free
        stops[0].set()
        stops[1].set()  # 2 sessions left, one per replica: want 1 replica
        await asyncio.to_thread(wait_for, lambda: len(auto.live()) == 1, 60, "a replica draining")
        drain_seen = time.monotonic()
        during = await take(auto.url, 0.5)
        await asyncio.sleep(GRACE_S + 2)
        stops[2].set()
        stops[3].set()
        return drain_seen, during, await asyncio.gather(*tasks)

    drain_seen, during, takes = asyncio.run(main())
    stayer = auto.live()[0]["url"]
    assert takes[3].port != takes[0].port == takes[1].port == takes[2].port  # the 4th went to the new replica
    assert takes[0].ended == takes[1].ended == "stopped"
    cut = [t for t in takes[2:] if t.close_code == DRAIN_CODE]
    kept = [t for t in takes[2:] if t.close_code != DRAIN_CODE]
    assert len(cut) == 1 and len(kept) == 1  # the stopped replica's session, and the stayer's
    assert "draining" in cut[0].close_reason and len(cut[0].frames) > 0
    assert kept[0].ended == "stopped" and str(kept[0].port) in stayer
    assert kept[0].gap_s(drain_seen, drain_seen + GRACE_S + 1) < 1.0  # the stayer's session never stalled
    assert all(t.close_code != 1006 for t in takes)  # nothing lost without a reason
    assert str(during.port) in stayer and during.ended == "finished"
