"""The WebSocket server end to end: a real server on loopback, the real websockets client, no mocks.

Sessions per pipeline (test card, audio scope with JPEG and H.264), concurrency, disconnects, a slow
reader, hostile input, and barge-in. Limits, auth and HTTP routes are in test_server_limits.py.
"""
import asyncio
import io
import json
import socket
import time

import av
import numpy as np
import pytest
import server_util
from helpers import framegraph_threads, wait_for
from PIL import Image
from websockets.asyncio.client import connect

from framegraph.apps.server import ServerConfig
from framegraph.apps.server.protocol import Kind, MediaFlag, MediaHeader, pack_media, parse_media

CHUNK = 320  # 20 ms at 16 kHz


def running(**overrides):
    """A server on a free loopback port (stats every 0.25 s); on exit, every session must be gone and no
    graph thread left within 5 s."""
    return server_util.running(settle_s=5, stats_interval_s=0.25, **overrides)


def tone(seconds: float, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (amp * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def pcm_message(i: int, samples: np.ndarray, capture_ns: int | None = None) -> bytes:
    header = MediaHeader(Kind.PCM16, seq=i, pts=i * CHUNK * 3,
                         capture_ns=time.monotonic_ns() if capture_ns is None else capture_ns)
    return pack_media(header, samples.astype("<i2").tobytes())


async def start(ws, pipeline: str, **options) -> dict:
    await ws.send(json.dumps({"type": "start", "version": 1, "pipeline": pipeline, "options": options}))
    msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert msg["type"] == "ready", msg
    return msg


async def stream_audio(ws, samples: np.ndarray, realtime: bool = True) -> None:
    t0 = time.monotonic()
    for i in range(len(samples) // CHUNK):
        if realtime:
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
        await ws.send(pcm_message(i, samples[i * CHUNK:(i + 1) * CHUNK]))
    await ws.send(json.dumps({"type": "stop"}))


async def receive_all(ws, timeout_s: float = 20, got: dict | None = None) -> dict:
    """Everything until the server closes: control messages by type, media as (header, payload, t_ns); into
    ``got`` as it arrives when given (a caller can watch it while the session runs)."""
    got = {"control": [], "video": [], "audio": []} if got is None else got
    async with asyncio.timeout(timeout_s):
        async for m in ws:
            if isinstance(m, str):
                got["control"].append(json.loads(m))
            else:
                h, p = parse_media(m)
                got["audio" if h.kind == Kind.PCM16 else "video"].append((h, bytes(p), time.monotonic_ns()))
    return got


def of_type(got: dict, kind: str) -> list[dict]:
    return [m for m in got["control"] if m["type"] == kind]


def pictures(video: list, codec: str) -> list[np.ndarray]:
    """The received video messages decoded: ``uint8 [H, W, 3]`` RGB pictures, in order."""
    if codec == "jpeg":
        return [np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for _, p, _ in video]
    decoder = av.CodecContext.create("h264", "r")
    out = [f.to_ndarray(format="rgb24") for _, p, _ in video for f in decoder.decode(av.Packet(p))]
    return out + [f.to_ndarray(format="rgb24") for f in decoder.decode(None)]


def run(coro):
    return asyncio.run(coro)


# ---- whole sessions -----------------------------------------------------------------------------------

def test_testcard_session_streams_jpeg_video_and_audio_then_ends():
    async def session(url):
        async with connect(url) as ws:
            ready = await start(ws, "testcard", size="160x120", fps=25, seconds=1.2, quality=70)
            return ready, await receive_all(ws)

    with running() as srv:
        ready, got = run(session(srv.url))
    assert ready["protocol"] == 1 and ready["session"] and ready["header_bytes"] == 48
    assert ready["video"] == {"codec": "jpeg", "width": 160, "height": 120, "fps": 25.0, "quality": 70}
    assert ready["audio_out"]["sample_rate"] == 16000 and ready["audio_in"] is None
    video, audio = got["video"], got["audio"]
    assert 27 <= len(video) <= 30  # 1.2 s at 25 fps (a loaded machine may drop a few at the source)
    assert [h.seq for h, *_ in video] == list(range(len(video)))  # nothing dropped on the way out
    pts = [h.pts for h, *_ in video]
    assert pts[0] == 0 and all(p % 1920 == 0 for p in pts) and pts == sorted(set(pts))
    assert all(h.flags & MediaFlag.KEYFRAME and h.kind == Kind.JPEG for h, *_ in video)
    assert Image.open(io.BytesIO(video[5][1])).size == (160, 120)
    assert np.asarray(Image.open(io.BytesIO(video[0][1]))).mean() > 240  # the first-second flash
    assert sum(h.payload_len for h, *_ in audio) == 2 * 1.2 * 16000
    assert [h.pts for h, *_ in audio] == [i * 960 for i in range(len(audio))]
    stats = of_type(got, "stats")
    assert stats and stats[-1]["sent"]["video"] == len(video) and stats[-1]["dropped"]["video"] == 0
    assert stats[-1]["stages"]["encode"]["frames"] == len(video)
    # work and waits apart: the card is paced at 25 fps (40 ms a frame), so the encoder mostly waits for it
    stages = stats[-1]["stages"]
    enc, card = stages["encode"], stages["testcard_video"]
    assert enc["work_ms"]["p50"] < 20 and 20 < enc["input_wait_ms"]["p50"] < 60, enc
    assert enc["input_wait_ms"]["total_s"] > 0.5 and enc["output_wait_ms"]["p50"] < 5, enc
    assert card["input_wait_ms"] is None and card["work_ms"]["p50"] < 20, card  # pacing is neither work nor wait
    assert stages["send"]["output_wait_ms"] is None
    assert got["control"][-1] == {"type": "ended", "session": ready["session"], "reason": "finished"}


@pytest.mark.parametrize("codec", ["jpeg", "h264"])
def test_scope_session_echoes_audio_in_sync_and_measures_glass_to_glass(codec):
    sent = tone(1.0)

    async def session(url):
        async with connect(url) as ws:
            ready = await start(ws, "scope", size="160x120", fps=25, codec=codec)
            feeder = asyncio.create_task(stream_audio(ws, sent))
            got = await receive_all(ws)
            await feeder
            return ready, got

    with running() as srv:
        ready, got = run(session(srv.url))
    assert ready["audio_in"] == {"format": "pcm16", "sample_rate": 16000, "channels": 1, "chunk_ms": 20}
    echoed = np.concatenate([np.frombuffer(p, "<i2") for _, p, _ in got["audio"]])
    assert np.array_equal(echoed, sent)  # every sample back, in order
    video = got["video"]
    assert 22 <= len(video) <= 26  # one frame per 40 ms of audio (an overloaded machine drops a few)
    for h, _, t_ns in video:
        assert h.flags & MediaFlag.CLIENT_CLOCK
        assert 0 < (t_ns - h.capture_ns) / 1e6 < 1000  # glass-to-glass on the client's own clock
        assert h.encode_us > 0 and h.compute_us > 0
    if codec == "h264":
        assert video[0][0].flags & MediaFlag.KEYFRAME and video[0][1].startswith(b"\x00\x00\x00\x01")
    decoded = pictures(video, codec)
    assert len(decoded) == len(video) and all(p.shape == (120, 160, 3) for p in decoded)
    assert of_type(got, "ended")[-1]["reason"] == "stopped"
    assert not of_type(got, "error")
    # the client sends 20 ms of audio every 20 ms: the mic waits for it (input wait), it does not work 20 ms
    mic = of_type(got, "stats")[-1]["stages"]["mic"]
    assert mic["work_ms"]["p50"] < 10 and 8 < mic["input_wait_ms"]["p50"] < 60, mic


def test_scope_without_echo_keeps_sending_video_at_a_low_frame_rate():
    """The scope writes its audio copy to a port nobody reads when echo is off: that frame must not hold a
    flow-limiter credit, or after one picture every further microphone chunk was dropped (seen at fps <= 6)."""
    sent = tone(2.0)

    async def session(url):
        async with connect(url) as ws:
            await start(ws, "scope", size="64x48", fps=5, echo=False)
            feeder = asyncio.create_task(stream_audio(ws, sent))
            got = await receive_all(ws)
            await feeder
            return got

    with running() as srv:
        got = run(session(srv.url))
    assert not got["audio"]  # echo off
    assert len(got["video"]) >= 8  # 2 s at 5 fps (was: 1)
    assert np.mean([p.mean() for p in pictures(got["video"], "jpeg")[2:]]) > 20  # the tone drawn, not a blank
    assert of_type(got, "ended")[-1]["reason"] == "stopped"


def test_concurrent_sessions_each_get_their_own_graph():
    async def card(url, seconds):
        async with connect(url) as ws:
            await start(ws, "testcard", size="96x64", seconds=seconds)
            return await receive_all(ws)

    async def scope(url):
        async with connect(url) as ws:
            await start(ws, "scope", size="96x64")
            feeder = asyncio.create_task(stream_audio(ws, tone(1.0)))
            got = await receive_all(ws)
            await feeder
            return got

    async def all_of(url, srv):
        tasks = [asyncio.create_task(card(url, 1.0)), asyncio.create_task(card(url, 1.4)),
                 asyncio.create_task(scope(url))]
        await asyncio.sleep(0.5)
        counts = srv.server.session_count
        return counts, await asyncio.gather(*tasks)

    with running(max_sessions=3) as srv:
        counts, (a, b, c) = run(all_of(srv.url, srv))
    assert counts == 3
    assert 22 <= len(a["video"]) <= 25 and 32 <= len(b["video"]) <= 35 and 22 <= len(c["video"]) <= 26
    assert len({m["session"] for got in (a, b, c) for m in of_type(got, "ended")}) == 3


def test_disconnect_mid_stream_frees_the_session_at_once():
    async def session(url, srv):
        ws = await connect(url)
        await start(ws, "scope", size="96x64")
        for i in range(10):
            await ws.send(pcm_message(i, tone(0.02)))
        await asyncio.wait_for(ws.recv(), 5)  # media is flowing
        assert srv.server.session_count == 1
        ws.transport.abort()  # no close handshake: the client vanished
        t0 = time.monotonic()
        while srv.server.session_count:
            await asyncio.sleep(0.01)
        return time.monotonic() - t0

    with running() as srv:
        freed_after_s = run(session(srv.url, srv))
        assert freed_after_s < 2.0
        wait_for(lambda: not framegraph_threads(), 2, "graph threads to end")


def test_slow_reader_gets_frames_dropped_while_the_server_stays_responsive():
    async def slow(url, srv):
        host, port = srv.server.config.host, srv.server.port
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that barely reads
        sock.connect((host, port))
        async with connect(url, sock=sock, max_queue=1) as ws:
            await start(ws, "testcard", size="640x480", fps=30, quality=95, seconds=30)
            t0 = time.monotonic()
            healthz = []
            other = None
            while time.monotonic() - t0 < 3.0:  # not reading; meanwhile others are served
                t = time.monotonic()
                body = await asyncio.to_thread(http_get, srv.http_url + "healthz")
                healthz.append(time.monotonic() - t)
                if other is None:
                    other = asyncio.create_task(short_card(url))
                await asyncio.sleep(0.3)
            depth = max(s.outbox.depth for s in srv.server.sessions.values())
            await ws.send(json.dumps({"type": "stop"}))
            got = await receive_all(ws)
            return healthz, json.loads(body), await other, depth, got

    with running() as srv:
        healthz, body, other, depth, got = run(slow(srv.url, srv))
    assert max(healthz) < 1.0 and body["status"] == "ok"
    assert served_short_card(other), other["video"]
    assert depth <= ServerConfig().outbox_video + ServerConfig().outbox_audio + 4  # bounded, not growing
    final = of_type(got, "stats")[-1]
    assert final["dropped"]["video"] > 0
    seqs = [h.seq for h, *_ in got["video"]]
    assert seqs[-1] + 1 > len(seqs)  # the gaps in seq are the drops
    assert any(h.flags & MediaFlag.DISCONTINUITY for h, *_ in got["video"])


async def short_card(url):
    async with connect(url) as ws:
        await start(ws, "testcard", size="96x64", seconds=0.4)
        return await receive_all(ws)


def served_short_card(got) -> bool:
    """A short test-card session ran to its end: its 10 frames (a live session may drop one at the source
    when the machine stalls — counted, by design) and ``ended: finished``."""
    return 8 <= len(got["video"]) <= 10 and of_type(got, "ended")[-1]["reason"] == "finished"


def http_get(url: str, headers: dict | None = None) -> bytes:
    """GET ``url``; the body of a 200, else AssertionError with the status."""
    status, body = http_request(url, headers)
    assert status == 200, (status, body)
    return body


def http_request(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    """GET ``url`` → (status, body); the connection is closed either way."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


# ---- hostile and out-of-order input -------------------------------------------------------------------

GOOD_PCM = pcm_message(0, tone(0.02))
HOSTILE_BEFORE_START = [
    ("{not json", "bad_json"),
    ("[1, 2]", "bad_json"),
    (json.dumps({"type": 7}), "bad_message"),
    (json.dumps({"type": "dance"}), "unknown_type"),
    (json.dumps({"type": "start"}), "bad_message"),
    (json.dumps({"type": "start", "pipeline": "scope", "options": [1]}), "bad_message"),
    (json.dumps({"type": "start", "pipeline": "nope"}), "unknown_pipeline"),
    (json.dumps({"type": "start", "pipeline": "scope", "options": {"size": "7x3"}}), "bad_option"),
    (json.dumps({"type": "start", "pipeline": "scope", "options": {"colour": 1}}), "bad_option"),
    (json.dumps({"type": "start", "pipeline": "scope", "options": {"fps": "fast"}}), "bad_option"),
    (GOOD_PCM, "out_of_order"),  # audio before start
    (json.dumps({"type": "interrupt"}), "out_of_order"),
    (json.dumps({"type": "pose", "matrix": [[1, 0], [0, 1]]}), "bad_message"),
    ("x" * 100_000, "too_large"),
]
HOSTILE_AFTER_START = [
    (GOOD_PCM[:30], "bad_binary"),  # shorter than the header
    (GOOD_PCM[:-10], "bad_binary"),  # truncated payload
    (b"XX" + GOOD_PCM[2:], "bad_binary"),  # bad magic
    (GOOD_PCM[:48] + b"\x01", "bad_binary"),  # length mismatch
    (json.dumps({"type": "start", "pipeline": "scope"}), "out_of_order"),  # start twice
    (json.dumps({"type": "pose", "matrix": np.eye(4).tolist()}), "unsupported"),
    (json.dumps({"type": "config", "options": {"quality": 500}}), "bad_option"),
]


async def hostile_session(url):
    """One connection that sends every malformed message (before and after ``start``), then a valid
    config, a ping and 0.5 s of audio: ``(error codes before start, everything received)``."""
    async with connect(url) as ws:
        codes = []
        for message, _ in HOSTILE_BEFORE_START:
            await ws.send(message)
            reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
            codes.append(reply.get("code"))
        await start(ws, "scope", size="96x64")
        for message, _ in HOSTILE_AFTER_START:
            await ws.send(message)
        await ws.send(json.dumps({"type": "config", "options": {"quality": 50, "gain": 2.0}}))
        await ws.send(json.dumps({"type": "ping", "id": 7}))
        feeder = asyncio.create_task(stream_audio(ws, tone(0.5)))
        got = await receive_all(ws)
        await feeder
        return codes, got


def check_hostile_session(codes: list, got: dict) -> None:
    """Each malformed message got its error code, and the session still did everything valid."""
    assert codes == [code for _, code in HOSTILE_BEFORE_START]
    assert [m["code"] for m in of_type(got, "error")] == [code for _, code in HOSTILE_AFTER_START]
    assert of_type(got, "config")[0]["applied"] == {"quality": 50, "gain": 2.0}
    assert of_type(got, "pong")[0]["id"] == 7
    assert 12 <= len(got["video"]) <= 13 and of_type(got, "ended")[-1]["reason"] == "stopped"


def test_malformed_messages_get_errors_and_the_session_still_works():
    with running() as srv:
        codes, got = run(hostile_session(srv.url))
        other = run(short_card(srv.url))  # the server still serves another session
    check_hostile_session(codes, got)
    assert len(other["video"]) == 10


def test_start_timeout_and_stop_before_start_end_the_session_politely():
    async def idle(url):
        async with connect(url) as ws:
            return await receive_all(ws)

    async def stop_first(url):
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "stop"}))
            return await receive_all(ws)

    with running(start_timeout_s=0.3) as srv:
        timed_out, stopped = run(idle(srv.url)), run(stop_first(srv.url))
    assert [m["type"] for m in timed_out["control"]] == ["error", "ended"]
    assert timed_out["control"][0]["code"] == "timeout" and timed_out["control"][1]["reason"] == "timeout"
    assert stopped["control"][-1]["reason"] == "stopped"


def test_interrupt_resets_the_graph_and_flags_the_next_media():
    async def session(url):
        async with connect(url) as ws:
            await start(ws, "scope", size="96x64")
            sent = tone(0.6)
            for i in range(15):
                await ws.send(pcm_message(i, sent[i * CHUNK:(i + 1) * CHUNK]))
            await asyncio.sleep(0.6)  # all 15 chunks are through the graph
            await ws.send(json.dumps({"type": "interrupt"}))
            for i in range(15, 30):
                await ws.send(pcm_message(i, sent[i * CHUNK:(i + 1) * CHUNK]))
            await ws.send(json.dumps({"type": "stop"}))
            return await receive_all(ws)

    with running() as srv:
        got = run(session(srv.url))
    flagged = [h for h, *_ in got["audio"] if h.flags & MediaFlag.INTERRUPTED]
    assert len(flagged) == 1 and flagged[0].pts >= 15 * 960
    assert any(h.flags & MediaFlag.INTERRUPTED for h, *_ in got["video"])
    assert not of_type(got, "error")
