"""Server limits and HTTP: token, Origin, session limit, message size and rate, /metrics, /healthz,
static files, startup refusals, and a pipeline registered from outside (camera poses on a latest edge)."""
import asyncio
import json
import math
import re
import socket

import numpy as np
import pytest
import torch
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from framegraph.apps.server import Pipeline, ServerConfig, StreamServer, add_video_out, register, video_options
from framegraph.apps.server.cli import add_arguments, config_from_args
from framegraph.apps.server.protocol import MediaFlag
from framegraph.apps.server.stages import PoseSource
from framegraph.stream import Clock, Graph, PortSpec, Stage
from framegraph.stream.testcard import TestCardVideo
from test_server_session import http_get, http_request, of_type, receive_all, running, served_short_card, short_card, start, stream_audio, tone


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
        for bad in ("nope.html", "..%2Fserver%2Fapp.py", ".hidden", "../server/app.py"):
            assert http_request(srv.http_url + bad)[0] == 404, bad
        assert http_request(srv.http_url + "ws")[0] == 426
        after = parse_prometheus(http_get(srv.http_url + "metrics").decode())
    assert health == {"status": "ok", "sessions": 1, "max_sessions": 4}
    m = parse_prometheus(text)
    stages = {labels["stage"] for _, labels, _ in m["framegraph_stage_latency_seconds"]["samples"]}
    assert stages == {"mic", "scope", "encode", "send"}
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


@register("posecard", "test: test-card clock + client poses → solid colour")
def build_posecard(opts):
    v = video_options(opts, size=(64, 48))
    opts.done()
    graph = Graph(Clock("realtime"), name="posecard")
    clock = graph.add(TestCardVideo(width=v.width, height=v.height, fps=v.fps, seconds=60), max_in_flight=2)
    pose = graph.add(PoseSource())
    render = graph.add(PoseTint(v.width, v.height))
    encoder, sink = add_video_out(graph, v)
    graph.connect(clock, render, "video", policy="drop_oldest")
    graph.connect(pose, render, "pose", policy="latest")
    graph.connect(render, encoder, "video", policy="drop_oldest")
    return Pipeline(graph, sink, encoder=encoder, pose_in=pose, format={"video": v.describe(), "pose_in": True})


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

    from PIL import Image
    import io
    with running() as srv:
        ready, got = asyncio.run(session(srv.url))
    assert ready["pose_in"] is True
    colours = [np.asarray(Image.open(io.BytesIO(p))).reshape(-1, 3).mean(0) for _, p, _ in got["video"]]
    assert len(colours) >= 10
    assert np.allclose(colours[0], (255, 0, 0), atol=12) and np.allclose(colours[-1], (0, 0, 255), atol=12)
    assert not of_type(got, "error") and of_type(got, "ended")[-1]["reason"] == "stopped"
    assert all(h.flags & MediaFlag.KEYFRAME for h, *_ in got["video"])
    assert math.isfinite(of_type(got, "stats")[-1]["fps"])
