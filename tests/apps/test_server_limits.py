"""Server limits and HTTP: token, Origin, session limit, message size and rate, closing and shutdown
(a flood of bad messages, the slot of a closing connection, SIGTERM with a client that never reads),
each pipeline's size / fps range, /metrics, /healthz, /pipelines/NAME, static files, startup refusals, and a pipeline
registered from outside (camera poses on a latest edge)."""
import asyncio
import json
import logging
import math
import re
import signal
import socket
import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from test_server_session import (
    http_get,
    http_request,
    of_type,
    pictures,
    receive_all,
    running,
    served_short_card,
    short_card,
    start,
    stream_audio,
    tone,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus

from framegraph.apps.commands.serve import add_arguments
from framegraph.apps.server import Pipeline, ServerConfig, StreamServer, VideoOptions, add_video_out, option, register
from framegraph.apps.server.cli import config_from_args
from framegraph.apps.server.pipelines.options import Size
from framegraph.apps.server.protocol import MediaFlag
from framegraph.stream import Clock, Graph, PortSpec, PushSource, Stage
from framegraph.stream.testcard import TestCardVideo


def status_of(coro) -> int | None:
    """HTTP status a WebSocket handshake was refused with (None: accepted)."""
    async def attempt():
        try:
            async with await coro:
                return None
        except InvalidStatus as exc:
            return exc.response.status_code
    return asyncio.run(attempt())


def test_token_is_required_and_checked_on_connect():
    with running(token="s3cret") as srv:
        url = srv.url
        assert status_of(connect(url)) == 401
        assert status_of(connect(url, additional_headers={"Authorization": "Bearer wrong"})) == 401
        assert status_of(connect(url + "?token=wrong")) == 401
        assert status_of(connect(url, additional_headers={"Authorization": "Bearer s3cret"})) is None
        assert status_of(connect(url + "?token=s3cret")) is None
        assert http_request(srv.http_url + "metrics")[0] == 401
        assert b"framegraph_server_sessions" in http_get(srv.http_url + "metrics",
                                                         {"Authorization": "Bearer s3cret"})
        assert srv.server.rejected["token"] == 3  # /metrics refusals are not connections


def test_binding_beyond_localhost_needs_a_token():
    with pytest.raises(ValueError, match="token"):
        StreamServer(ServerConfig(host="0.0.0.0", port=0))
    StreamServer(ServerConfig(host="0.0.0.0", port=0, token="t"))  # fine with one
    StreamServer(ServerConfig(host="::1", port=0))  # loopback needs none
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(ValueError, match="token"):
        config_from_args(p.parse_args(["--host", "0.0.0.0", "--token", ""])).validate()


def test_serve_batching_is_the_servers_own_config():
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert config_from_args(p.parse_args(["--batching", "on"])).batching is True
    assert config_from_args(p.parse_args([])).batching is False


def test_browser_origins_same_origin_and_configured_list_only():
    with running(allowed_origins=("https://app.example",)) as srv:
        url, port = srv.url, srv.server.port
        assert status_of(connect(url, origin=f"http://127.0.0.1:{port}")) is None  # the served page
        assert status_of(connect(url, origin="https://app.example")) is None
        assert status_of(connect(url, origin="https://evil.example")) == 403
        assert status_of(connect(url, origin=f"http://127.0.0.1:{port + 1}")) == 403
        assert status_of(connect(url)) is None  # not a browser: no Origin
        # DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1
        assert status_of(connect(f"ws://evil.example:{port}/ws", origin=f"http://evil.example:{port}",
                                 sock=socket.create_connection(("127.0.0.1", port)))) == 403
        assert status_of(connect(f"ws://localhost:{port}/ws", origin=f"http://localhost:{port}",
                                 sock=socket.create_connection(("127.0.0.1", port)))) is None


def test_session_limit_refuses_with_503_and_frees_slots():
    async def scenario(url):
        async with connect(url) as ws:
            await start(ws, "testcard", size="96x64", seconds=5)
            refused = status_of_async = None
            try:
                async with connect(url):
                    pass
            except InvalidStatus as exc:
                refused = exc.response.status_code
            await ws.send(json.dumps({"type": "stop"}))
            await receive_all(ws)
        return refused, status_of_async

    with running(max_sessions=1) as srv:
        refused, _ = asyncio.run(scenario(srv.url))
        assert refused == 503
        assert served_short_card(asyncio.run(short_card(srv.url)))  # the slot is free again


def test_message_rate_and_transport_size_limits_do_not_take_the_server_down():
    async def flood(url):
        async with connect(url) as ws:
            for i in range(300):
                await ws.send(json.dumps({"type": "ping", "id": i}))
            await asyncio.sleep(0.5)  # let the bucket refill, or "stop" would be rate limited too
            await ws.send(json.dumps({"type": "stop"}))
            return await receive_all(ws)

    async def huge(url):
        async with connect(url, max_size=None) as ws:
            await ws.send(b"\0" * (5 * 64 * 1024))  # over 4x the message limit: the transport closes
            with pytest.raises(ConnectionClosedError) as err:
                await asyncio.wait_for(ws.recv(), 5)
            return err.value.rcvd.code

    with running(max_messages_per_s=50) as srv:
        got = asyncio.run(flood(srv.url))
        assert asyncio.run(huge(srv.url)) == 1009
        assert served_short_card(asyncio.run(short_card(srv.url)))
    errors = of_type(got, "error")
    assert errors and all(e["code"] == "rate_limited" for e in errors)
    assert 1 <= len(of_type(got, "pong")) <= 80  # at most the burst allowance, not all 300


# ---- closing and shutdown ------------------------------------------------------------------------------

async def non_reader(url: str, port: int):
    """A connected client that barely reads: a tiny receive buffer and a one-message queue, so the
    server's send buffer fills and a close frame from the server is never read. Close it with
    ``ws.transport.abort()``."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return await connect(url, sock=sock, max_queue=1)


def test_a_flood_of_bad_messages_is_closed_1008_with_one_warning_and_the_rest_unread(caplog):
    async def flood(url):
        async with connect(url) as ws:
            try:
                for _ in range(300):
                    await ws.send("{not json")
            except ConnectionClosed:
                pass  # the server closed while we were still sending
            t0, errors = time.monotonic(), []
            with pytest.raises(ConnectionClosedError) as closed:
                async with asyncio.timeout(10):
                    async for m in ws:
                        errors.append(json.loads(m)["code"])
            return errors, closed.value.rcvd.code, time.monotonic() - t0

    caplog.set_level(logging.WARNING, logger="framegraph.server")
    with running(max_errors=4) as srv:
        errors, code, closed_after = asyncio.run(flood(srv.url))
        handled = dict(srv.server.errors)
    assert code == 1008 and closed_after < 2.0  # the close handshake completes: not the 5 s close timeout
    assert handled == {"bad_json": 4}  # exactly the messages before the close were read
    assert errors == ["bad_json"] * 4
    warnings = [r for r in caplog.records if r.name == "framegraph.server" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "4 protocol errors in a row" in warnings[0].getMessage(), warnings


def test_a_closing_connection_frees_its_session_slot_when_the_close_starts():
    async def scenario(url, port):
        bad = await non_reader(url, port)
        await start(bad, "testcard", size="640x480", fps=30, quality=95, seconds=30)
        await asyncio.sleep(0.5)  # its buffers fill: it cannot see a close frame now
        for _ in range(4):
            await bad.send("{not json")  # max_errors: the server starts closing (1008)
        t0 = time.monotonic()
        while True:
            try:
                other = await short_card(url)  # max_sessions=1: needs the slot
                break
            except InvalidStatus as exc:
                assert exc.response.status_code == 503 and time.monotonic() - t0 < 5, exc
                await asyncio.sleep(0.05)
        waited = time.monotonic() - t0
        bad.transport.abort()
        return waited, other

    with running(max_sessions=1, max_errors=4) as srv:
        waited, other = asyncio.run(scenario(srv.url, srv.server.port))
    assert waited < 1.5  # not the 5 s close timeout
    assert served_short_card(other)


def test_serve_exits_within_2_s_of_sigterm_with_a_client_that_never_reads():
    from framegraph.apps.bench.network import server_process

    async def client(proc, ws_url, port):
        ws = await non_reader(ws_url, port)
        await start(ws, "testcard", size="640x480", fps=30, quality=95, seconds=60)
        t_term, n = None, 0
        try:
            while proc.poll() is None:
                await ws.send(json.dumps({"type": "ping", "id": n}))  # keeps sending, never reads
                n += 1
                if t_term is None and n == 25:  # half a second of video: the server's send buffer is full
                    proc.send_signal(signal.SIGTERM)
                    t_term = time.monotonic()
                if t_term is not None and time.monotonic() - t_term > 10:
                    break
                await asyncio.sleep(0.02)
        except ConnectionClosed:
            pass
        while proc.poll() is None and time.monotonic() - t_term < 10:
            await asyncio.sleep(0.02)
        exited_after = time.monotonic() - t_term
        ws.transport.abort()
        return exited_after

    with server_process(start_timeout_s=60) as server:  # its stderr read all along: the server never blocks on it
        proc, lines = server.proc, server.log
        exited_after = asyncio.run(client(proc, server.url, int(re.search(r":(\d+)/ws", server.url).group(1))))
    assert exited_after < 2.0, (exited_after, "".join(lines))
    assert proc.returncode == 0, "".join(lines)
    assert "shutting down" in "".join(lines)


# ---- each pipeline's size and fps range -----------------------------------------------------------------

OUT_OF_RANGE = [({"size": "14x16"}, "at least 16 (16x16)"), ({"size": [16, 2]}, "at least 16 (16x16)"),
                ({"size": "1922x1080"}, "at most 2073600 pixels"), ({"fps": 0.5}, "[1, 60]"), ({"fps": 61}, "[1, 60]")]


@pytest.mark.parametrize("pipeline, codec", [("testcard", "h264"), ("scope", "jpeg"), ("scene", "jpeg")])
def test_each_pipeline_refuses_sizes_and_rates_out_of_range_and_draws_at_its_smallest_size(pipeline, codec):
    async def session(url):
        async with connect(url) as ws:
            refusals = []
            for options, _ in OUT_OF_RANGE:
                await ws.send(json.dumps({"type": "start", "pipeline": pipeline, "options": options}))
                refusals.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            extra = {"seconds": 1.0} if pipeline == "testcard" else {}
            ready = await start(ws, pipeline, size="16x16", codec=codec, **extra)
            if pipeline == "scope":  # silence, then a loud tone
                feeder = asyncio.create_task(stream_audio(ws, np.concatenate([tone(0.4, amp=0.0), tone(0.4)])))
            elif pipeline == "scene":
                await asyncio.sleep(1.0)
                await ws.send(json.dumps({"type": "stop"}))
            got = await receive_all(ws, timeout_s=30)
            if pipeline == "scope":
                await feeder
            return refusals, ready, got

    with running() as srv:
        refusals, ready, got = asyncio.run(session(srv.url))
    for (options, expected), reply in zip(OUT_OF_RANGE, refusals):
        assert reply["type"] == "error" and reply["code"] == "bad_option", (options, reply)
        assert expected in reply["message"], (options, reply)
    assert (ready["video"]["width"], ready["video"]["height"]) == (16, 16)
    assert not of_type(got, "error")
    frames = pictures(got["video"], codec)
    assert len(frames) >= 8 and all(f.shape == (16, 16, 3) for f in frames)
    f = [x.astype(np.float32) for x in frames]
    if pipeline == "testcard":  # the bands move
        assert np.abs(f[2] - f[-1]).mean() > 20
    elif pipeline == "scope":  # dark in the silence, bright with the tone
        assert f[1].mean() < 60 and f[-2].mean() > 100, (f[1].mean(), f[-2].mean())
    else:  # the splats stand out from the background (0.08, 0.08, 0.1)
        assert np.abs(f[-1] - np.array([20, 20, 26])).max(-1).mean() > 20


# ---- HTTP -----------------------------------------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse_prometheus(text: str) -> dict:
    """Strict enough parser of the text format: family → {"type", "samples": [(name, labels, value)]}."""
    families: dict[str, dict] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in families, f"family {name} declared twice"
            families[name] = {"type": kind, "samples": []}
            continue
        if line.startswith("#"):
            assert line.startswith("# HELP "), line
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, _, labels_text, value = m.groups()
        labels = {}
        if labels_text:
            pos = 0
            while pos < len(labels_text):
                lm = LABEL.match(labels_text, pos)
                assert lm, f"bad labels in {line!r}"
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name
        assert family in families, f"sample {name} has no # TYPE"
        families[family]["samples"].append((name, labels, float(value)))
    return families


def test_metrics_healthz_and_static_files():
    async def with_session(srv):
        async with connect(srv.url) as ws:
            await start(ws, "scope", size="96x64")
            feeder = asyncio.create_task(stream_audio(ws, tone(0.6)))
            await asyncio.sleep(0.45)
            text = (await asyncio.to_thread(http_get, srv.http_url + "metrics")).decode()
            health = json.loads(await asyncio.to_thread(http_get, srv.http_url + "healthz"))
            await feeder
            await receive_all(ws)
            return text, health

    with running() as srv:
        text, health = asyncio.run(with_session(srv))
        index = http_get(srv.http_url).decode()
        script = http_get(srv.http_url + "app.js")
        pipelines = json.loads(http_get(srv.http_url + "pipelines"))
        scope = json.loads(http_get(srv.http_url + "pipelines/scope"))
        missing = http_request(srv.http_url + "pipelines/nope")
        for bad in ("nope.html", "..%2Fserver%2Fapp.py", ".hidden", "../server/app.py"):
            assert http_request(srv.http_url + bad)[0] == 404, bad
        assert http_request(srv.http_url + "ws")[0] == 426
        after = parse_prometheus(http_get(srv.http_url + "metrics").decode())
    assert health == {"status": "ok", "sessions": 1, "max_sessions": 4}
    m = parse_prometheus(text)
    def stages(family):
        return {labels["stage"] for _, labels, _ in m[family]["samples"]}

    assert stages("framegraph_stage_work_seconds") == {"mic", "scope", "encode", "send"}
    assert stages("framegraph_stage_output_wait_seconds") == {"mic", "scope", "encode"}  # the sink has no output
    # mic: the client's audio
    assert stages("framegraph_stage_input_wait_seconds") == {"mic", "scope", "encode", "send"}
    e2e = {n: v for n, labels, v in m["framegraph_end_to_end_latency_seconds"]["samples"] if labels.get("le") in
           (None, "+Inf")}
    assert e2e["framegraph_end_to_end_latency_seconds_count"] > 5
    assert e2e["framegraph_end_to_end_latency_seconds_bucket"] == e2e["framegraph_end_to_end_latency_seconds_count"]
    for family in ("framegraph_edge_queue_depth", "framegraph_edge_drops_total", "framegraph_deadline_misses_total",
                   "framegraph_server_send_drops_total", "framegraph_server_messages_sent_total"):
        assert m[family]["samples"], family
    assert all(labels["pipeline"] == "scope" for _, labels, _ in m["framegraph_edge_drops_total"]["samples"])
    assert m["framegraph_server_sessions"]["samples"][0][2] == 1
    assert after["framegraph_server_sessions"]["samples"][0][2] == 0
    assert after["framegraph_server_sessions_total"]["samples"][0][2] == 1
    assert "<canvas" in index and b"WebSocket" in script
    assert {"testcard", "scope"} <= set(pipelines)
    # one pipeline's options, from its declaration: what the start and config messages may carry
    assert scope["available"] and scope["description"] == pipelines["scope"]
    assert scope["options"]["gain"] == {"type": "number", "range": [0.01, 100.0], "default": 1.0,
                                        "help": "how much the waveform is magnified", "live": True}
    assert scope["options"]["size"]["default"] == "320x240" and scope["options"]["codec"]["choices"] == ["jpeg", "h264"]
    assert missing[0] == 404 and json.loads(missing[1])["code"] == "unknown_pipeline"


# ---- a pipeline registered from outside: camera poses through a latest edge -----------------------------

class PoseTint(Stage):
    """Paints each test-card frame with a colour from the newest pose's translation (a stand-in renderer)."""

    def __init__(self, w, h):
        super().__init__("render")
        self.inputs = {"video": PortSpec((h, w, 3), torch.uint8), "pose": PortSpec((4, 4), torch.float32)}
        self.outputs = {"video": PortSpec((h, w, 3), torch.uint8)}

    def process(self, inputs, out):
        t = inputs["pose"].data[:3, 3].clamp(0, 1) * 255
        out.write("video").data[:] = t.to(torch.uint8)


@dataclass
class PosecardOptions(VideoOptions):
    size: tuple[int, int] = option((64, 48), "the card's width and height", Size())


@register("posecard", "test: test-card clock + client poses → solid colour", PosecardOptions)
def build_posecard(v: PosecardOptions):
    graph = Graph(Clock("realtime"), name="posecard")
    clock = graph.add(TestCardVideo(width=v.width, height=v.height, fps=v.fps, seconds=60), max_in_flight=2)
    pose = graph.add(PushSource(PortSpec((4, 4), torch.float32), name="pose"))
    render = graph.add(PoseTint(v.width, v.height))
    encoder, sink = add_video_out(graph, v)
    graph.connect(clock, render, "video", policy="drop_oldest")
    graph.connect(pose, render, "value", "pose", policy="latest")
    graph.connect(render, encoder, "video", policy="drop_oldest")
    return Pipeline(graph, sink, encoder=encoder, pose_in=pose, format={"video": v.video_format(), "pose_in": True})


def test_registered_pipeline_takes_camera_poses_through_a_latest_edge():
    async def session(url):
        async with connect(url) as ws:
            ready = await start(ws, "posecard", codec="jpeg", quality=95)
            red = np.eye(4)
            red[:3, 3] = (1.0, 0.0, 0.0)
            await ws.send(json.dumps({"type": "pose", "matrix": red.tolist()}))
            await asyncio.sleep(0.3)
            blue = np.eye(4)
            blue[:3, 3] = (0.0, 0.0, 1.0)
            await ws.send(json.dumps({"type": "pose", "matrix": blue.reshape(-1).tolist()}))  # 16 numbers
            await asyncio.sleep(0.3)
            await ws.send(json.dumps({"type": "stop"}))
            return ready, await receive_all(ws)

    import io

    from PIL import Image
    with running() as srv:
        ready, got = asyncio.run(session(srv.url))
    assert ready["pose_in"] is True
    colours = [np.asarray(Image.open(io.BytesIO(p))).reshape(-1, 3).mean(0) for _, p, _ in got["video"]]
    assert len(colours) >= 10
    assert np.allclose(colours[0], (255, 0, 0), atol=12) and np.allclose(colours[-1], (0, 0, 255), atol=12)
    assert not of_type(got, "error") and of_type(got, "ended")[-1]["reason"] == "stopped"
    assert all(h.flags & MediaFlag.KEYFRAME for h, *_ in got["video"])
    assert math.isfinite(of_type(got, "stats")[-1]["fps"])
