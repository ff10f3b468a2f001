"""Live video-to-video from a client's camera (``generate`` with ``input: "camera"``) over a real WebSocket on
loopback, with a tiny Wan folder from the server's model folder.

What a user relies on: the generated stream follows what the camera shows (a dark and a bright camera give
different videos at strength < 1, the same one at strength 1, where nothing of the input is kept); the live
stream is exactly the file video-to-video of the same pictures (none lost, none invented, none reordered);
nothing is generated before the first picture; each bad camera message gets its error code and the session
(and the sessions beside it) keep going.

The tiny VAE has random weights, so it does not reproduce the input picture itself — "close to the input" is
checked as "equal to the model's video-to-video of the input", the picture a trained model would make
recognisable.

Counted exchanges pace themselves on the server's output, as ``framegraph client --camera`` does (flow control,
``ready.video_in.pictures_per_chunk``): a chunk's pictures, then its frames read back, then the next chunk. A
picture sent while the model is still busy may be replaced or dropped (a live camera's newest picture wins),
so on a loaded machine a camera that just runs would make fewer frames than it sent pictures.
"""
import asyncio
import io
import json
import time

import numpy as np
import pytest
import torch
from PIL import Image
from server_util import jpeg_pictures, running
from websockets.asyncio.client import connect

from framegraph.apps.server.protocol import HEADER_BYTES, Kind, MediaHeader, pack_media, parse_media
from framegraph.models.generate import build_generate_graph, load_generate_model
from framegraph.stream import IterableSource, RecordingSink
from framegraph.stream.media import video_port

W, H, FPS = 48, 32, 8
OPTIONS = {"size": f"{W}x{H}", "fps": FPS, "chunk_frames": 2, "timesteps": [1000, 500], "quality": 100,
           "prompt_embeds": "a.safetensors", "input": "camera"}
FIRST, LATER = 5, 8  # video frames of the first chunk (1 + 4 * (2 - 1)) and of every later one (4 * 2)
N = FIRST + LATER


@pytest.fixture
def server(generate_models, monkeypatch):
    monkeypatch.setenv("FRAMEGRAPH_MODELS", str(generate_models))
    with running(settle_s=15, max_message_bytes=256 * 1024) as handle:
        yield handle


def camera_picture(level: int, width: int = W, height: int = H) -> np.ndarray:
    """A textured picture (``uint8 [height, width, 3]``): waves of 0..80 in each channel, raised by ``level``."""
    yy, xx = np.mgrid[0:height, 0:width] * (H / height)
    base = (np.sin(xx / 3.0) + np.cos(yy / 4.0) + 2) * 20
    return np.clip(np.stack([base, base[::-1], base[:, ::-1]], -1) + level, 0, 255).astype(np.uint8)


def jpeg(picture: np.ndarray, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def camera_message(payload: bytes, seq: int = 0) -> bytes:
    return pack_media(MediaHeader(Kind.JPEG, seq=seq, capture_ns=time.monotonic_ns()), payload)


async def send_camera(ws, pictures: list[bytes], fps: float = FPS, until: asyncio.Event | None = None) -> None:
    """The JPEGs, paced like a camera at ``fps`` (a camera's pace, not a wait for the server); the camera is
    switched off once ``until`` is set."""
    t0 = time.monotonic()
    for i, payload in enumerate(pictures):
        await asyncio.sleep(max(0.0, t0 + i / fps - time.monotonic()))
        if until is not None and until.is_set():
            return
        await ws.send(camera_message(payload, i))


async def camera_chunks(ws, ready: dict, pictures: list[bytes], replies: list) -> list[np.ndarray]:
    """Send ``pictures`` with flow control: a chunk's pictures (``ready.video_in.pictures_per_chunk``) at the
    camera's pace, then its frames read back, then the next chunk. Returns the frames, one per picture (the
    pictures must make whole chunks)."""
    per_chunk = ready["video_in"]["pictures_per_chunk"]
    got, start, size = [], 0, per_chunk["first"]
    while start < len(pictures):
        chunk = pictures[start:start + size]
        assert len(chunk) == size, "the pictures make whole chunks"
        await send_camera(ws, chunk)
        got += await jpeg_pictures(ws, size, timeout_s=60, replies=replies)
        start, size = start + size, per_chunk["next"]
    return got


async def drain(ws, replies: list) -> None:
    """Stop, then read to the end of the session (text messages to ``replies``)."""
    await ws.send(json.dumps({"type": "stop"}))
    async with asyncio.timeout(20):
        async for m in ws:
            if isinstance(m, str):
                replies.append(json.loads(m))


async def start(ws, options: dict) -> dict:
    await ws.send(json.dumps({"type": "start", "pipeline": "generate", "options": options}))
    reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
    assert reply["type"] == "ready", reply
    return reply


async def camera_session(url, pictures: list[bytes], strength: float):
    """One camera session: ``(ready, received pictures as float32, text replies)``."""
    replies = []
    async with connect(url) as ws:
        ready = await start(ws, OPTIONS | {"strength": strength})
        got = await camera_chunks(ws, ready, pictures, replies)
        await drain(ws, replies)
    return ready, np.stack(got).astype(np.float32), replies


def offline_video_to_video(folder, pictures: list[np.ndarray], strength: float) -> np.ndarray:
    """The same pictures through the file video-to-video graph (fast clock, no server): ``uint8 [T, H, W, 3]``."""
    gm = load_generate_model(str(folder))
    source = IterableSource([torch.from_numpy(p.copy()) for p in pictures], video_port(W, H), port="video", fps=FPS)
    gg = build_generate_graph(gm, size=(H, W), chunks=None, prompt_embeds=str(folder / "a.safetensors"),
                              chunk_frames=2, timesteps=[1000, 500], source=source, strength=strength, fps=FPS)
    sink = gg.graph.add(RecordingSink({"video": video_port(W, H)}))
    gg.graph.connect(gg.decode, sink, capacity=8)
    gg.graph.run()
    return np.stack([d.numpy() for d in sink.data()])


def test_the_generated_stream_follows_the_camera(server, generate_models):
    dark, bright = [jpeg(camera_picture(0))] * N, [jpeg(camera_picture(170))] * N
    out = {}
    for strength in (0.3, 1.0):
        for name, pictures in (("dark", dark), ("bright", bright)):
            ready, out[name, strength], replies = asyncio.run(camera_session(server.url, pictures, strength))
            stats = [m for m in replies if m["type"] == "stats"][-1]
            assert not [m for m in replies if m["type"] == "error"], replies
            assert stats["received"]["video_in"] == N and stats["received"]["video_dropped"] == 0, stats
            dropped = stats["dropped"]
            assert dropped["input_replaced_pictures"] == dropped["source"] == dropped["video"] == 0, stats  # all used
    assert ready["input"] == "camera" and ready["strength"] == 1.0
    assert ready["video_in"] == {"format": "jpeg", "width": W, "height": H, "max_bytes": 64 * 1024, "max_fps": FPS,
                                 "pictures_per_chunk": {"first": FIRST, "next": LATER}}
    assert out["dark", 0.3].shape == (N, H, W, 3) and out["dark", 0.3].std() > 5  # a picture per camera picture
    # Below strength 1 the camera shows: another camera picture, another video (the same seed otherwise) ...
    assert np.abs(out["dark", 0.3][FIRST:] - out["bright", 0.3][FIRST:]).mean() > 0.5
    # ... at strength 1 nothing of it is kept (as `framegraph generate --strength 1`): the two are one video.
    assert np.abs(out["dark", 1.0] - out["bright", 1.0]).max() <= 2  # JPEG rounding only

    # Live equals offline: the stream is the file video-to-video of exactly those pictures, sent as the server
    # sends them (JPEG at quality 100, chroma subsampled).
    decoded = [np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in dark]
    offline = np.stack([np.asarray(Image.open(io.BytesIO(jpeg(f, quality=100))), dtype=np.float32)
                        for f in offline_video_to_video(generate_models / "tiny-wan", decoded, 0.3)])
    assert offline.shape == out["dark", 0.3].shape
    assert np.abs(offline - out["dark", 0.3]).max() <= 1, np.abs(offline - out["dark", 0.3]).max()
    assert np.abs(offline - out["bright", 0.3]).mean() > 0.5  # (and the comparison tells the two cameras apart)


def test_pictures_of_another_size_are_scaled_and_nothing_is_made_before_the_first(server):
    async def run():
        replies = []
        async with connect(server.url) as ws:
            ready = await start(ws, OPTIONS | {"strength": 0.5})
            with pytest.raises(TimeoutError):  # no camera yet: the session waits, no frame is invented
                await jpeg_pictures(ws, 1, timeout_s=1.5, replies=replies)
            big = [jpeg(camera_picture(60, 4 * W, 4 * H))] * N  # 192x128: scaled to 48x32
            got = await camera_chunks(ws, ready, big, replies)
            await drain(ws, replies)
        return got, replies

    got, replies = asyncio.run(run())
    assert len(got) == N and got[0].shape == (H, W, 3) and np.std(got) > 5
    assert not [m for m in replies if m["type"] == "error"], replies
    assert replies[-1] == {"type": "ended", "session": replies[-1]["session"], "reason": "stopped"}


def test_bad_camera_messages_get_their_error_codes_and_the_sessions_go_on(server):
    good = jpeg(camera_picture(40))
    truncated = good[: len(good) // 2]
    png = io.BytesIO()
    Image.fromarray(camera_picture(40)).save(png, "PNG")

    async def camera(url):
        replies = []
        async with connect(url) as ws:
            ready = await start(ws, OPTIONS | {"strength": 0.5})
            limit = ready["video_in"]["max_bytes"]
            for message in (camera_message(b"\xff\xd8\xff" + bytes(limit)),  # over video_in.max_bytes
                            camera_message(png.getvalue()), camera_message(truncated), camera_message(b"hello")):
                await ws.send(message)
            for _ in range(2):  # two bursts far faster than max_fps: dropped, told once
                for i in range(12):
                    await ws.send(camera_message(good, i))
                await asyncio.sleep(0.3)
            await asyncio.sleep(1.0)  # the bucket fills again: a camera at its pace is served
            # A live camera, on until N frames came back: 1-5 burst pictures already started the first chunk, and
            # a picture that comes while the model is busy may be dropped (the newest wins), so it sends more.
            served = asyncio.Event()
            feeder = asyncio.create_task(send_camera(ws, [good] * (3 * N), until=served))
            got = await jpeg_pictures(ws, N, timeout_s=60, replies=replies)
            served.set()
            await feeder
            await drain(ws, replies)
        return got, replies

    async def bystander(url):
        """A test card session beside it: its pictures keep coming, with no error."""
        replies = []
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "pipeline": "testcard",
                                      "options": {"size": "64x48", "fps": 10, "seconds": 4, "audio": False}}))
            frames = 0
            async with asyncio.timeout(30):
                async for m in ws:
                    if isinstance(m, bytes):
                        frames += parse_media(m)[0].kind == Kind.JPEG
                    else:
                        replies.append(json.loads(m))
        return frames, replies

    async def unsupported(url, pipeline, options):
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "pipeline": pipeline, "options": options}))
            ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
            await ws.send(camera_message(good))
            async with asyncio.timeout(10):
                while True:
                    m = await ws.recv()
                    if isinstance(m, str) and json.loads(m)["type"] == "error":
                        return ready, json.loads(m)

    async def run():
        return await asyncio.gather(camera(server.url), bystander(server.url))

    (got, replies), (card_frames, card_replies) = asyncio.run(run())
    errors = [m["code"] for m in replies if m["type"] == "error"]
    assert errors == ["too_large", "bad_binary", "bad_binary", "bad_binary", "rate_limited"], replies
    messages = [m["message"] for m in replies if m["type"] == "error"]
    assert "video_in.max_bytes" in messages[0] and "not a JPEG" in messages[1] and "does not decode" in messages[2]
    stats = [m for m in replies if m["type"] == "stats"][-1]
    assert stats["received"]["video_dropped"] > 2 and stats["received"]["video_in"] >= N
    assert len(got) == N and np.std(got) > 5 and replies[-1]["reason"] == "stopped"  # served after all that
    assert card_frames >= 35 and not [m for m in card_replies if m["type"] == "error"]

    ready, error = asyncio.run(unsupported(server.url, "testcard", {"size": "64x48"}))
    assert ready["video_in"] is None and error["code"] == "unsupported" and "takes no camera" in error["message"]
    ready, error = asyncio.run(unsupported(server.url, "generate", OPTIONS | {"input": "noise"}))
    assert ready["video_in"] is None and error["code"] == "unsupported"


def test_camera_options_are_checked_like_the_command_line(server):
    async def refused(options):
        async with connect(server.url) as ws:
            await ws.send(json.dumps({"type": "start", "pipeline": "generate", "options": options}))
            return json.loads(await asyncio.wait_for(ws.recv(), 30))

    for options, words in ((OPTIONS, "a strength with input \"camera\""),
                           (OPTIONS | {"strength": 0}, "expected a number in (0, 1]"),
                           (OPTIONS | {"strength": 1.5}, "expected a number in (0, 1]"),
                           (OPTIONS | {"strength": "0.5"}, "expected a number in (0, 1]"),
                           (OPTIONS | {"input": "noise", "strength": 0.5}, "strength goes with input \"camera\""),
                           (OPTIONS | {"input": "webcam", "strength": 0.5}, "one of ['noise', 'camera']")):
        reply = asyncio.run(refused(options))
        assert reply["type"] == "error" and reply["code"] == "bad_option" and words in reply["message"], reply


def test_the_largest_camera_picture_fits_the_servers_message_limit(generate_models, monkeypatch):
    monkeypatch.setenv("FRAMEGRAPH_MODELS", str(generate_models))
    with running(settle_s=15, max_message_bytes=16 * 1024) as handle:
        async def ready():
            async with connect(handle.url) as ws:
                r = await start(ws, OPTIONS | {"strength": 0.5})
                await drain(ws, [])
                return r
        assert asyncio.run(ready())["video_in"]["max_bytes"] == 16 * 1024 - HEADER_BYTES


def test_the_python_client_sends_a_video_file_as_the_camera_and_records_the_stream(server, tmp_path):
    from helpers import write_video

    from framegraph.apps.cli import main
    from framegraph.stream.media import read_video

    video = tmp_path / "walk.mp4"
    levels = [0] * FIRST + [170] * (2 * LATER)  # 21 frames: 3 chunks; dark, then bright
    write_video(video, np.stack([camera_picture(lv, 2 * W, 2 * H) for lv in levels]), fps=FPS)
    out, summary = tmp_path / "painted.mp4", tmp_path / "summary.json"
    argv = ["client", "--url", server.url, "--pipeline", "generate", "--camera", str(video), "--out", str(out),
            "--json", "--size", f"{W}x{H}", "--fps", str(FPS), "--quality", "100", "--option", "input=camera",
            "--option", "strength=0.3", "--option", "chunk_frames=2", "--option", "timesteps=[1000, 500]",
            "--option", "prompt_embeds=a.safetensors"]
    import contextlib
    with open(summary, "w") as f, contextlib.redirect_stdout(f):
        assert main(argv) == 0
    s = json.loads(summary.read_text())
    frames = read_video(out)["frames"]
    assert s["camera_pictures_sent"] == len(levels) and s["ended"] == "stopped" and not s["errors"]
    received, dropped = s["server_stats"]["received"], s["server_stats"]["dropped"]
    assert received["video_in"] == len(levels) and dropped["input_replaced_pictures"] == dropped["source"] == 0, \
        s["server_stats"]  # every frame of the file used
    assert s["video_frames"] == len(levels) and s["gaps"]["video"] == 0, s
    assert frames.shape == (len(levels), H, W, 3) and frames.std() > 5  # one generated frame per camera frame


def test_the_python_client_sends_a_chunk_of_pictures_then_waits_for_its_frames(tmp_path):
    """The client's flow control, against a stand-in socket: a chunk's pictures, then none until their frames
    came back; a picture the server reports lost (``stats``) is made up by one more."""
    from helpers import write_video

    from framegraph.apps.client import _send_camera, _Tally

    video = tmp_path / "walk.mp4"
    write_video(video, np.stack([camera_picture(0)] * 7), fps=FPS)
    ready = {"video": {"fps": 1000}, "video_in": {"width": W, "height": H, "max_bytes": 64 * 1024, "max_fps": 1000,
                                                  "pictures_per_chunk": {"first": 2, "next": 3}}}

    class Socket:
        def __init__(self):
            self.sent, self.news = [], asyncio.Event()

        async def send(self, message):
            self.sent.append(message)
            self.news.set()

        async def until_sent(self, n):
            async with asyncio.timeout(10):
                while len(self.sent) < n:
                    self.news.clear()
                    await self.news.wait()
            await asyncio.sleep(0.3)  # (at 1000 pictures a second, a sender that did not wait would send on)
            return len(self.sent)

    async def run():
        ws, tally = Socket(), _Tally()
        sender = asyncio.create_task(_send_camera(ws, str(video), ready, None, tally))

        def server_says(frames=(), lost=0):
            tally.video_seqs += frames
            tally.stats = {"type": "stats", "received": {"video_dropped": 0}, "dropped": {"source": lost}}
            tally.arrived.set()

        assert await ws.until_sent(2) == 2  # the first chunk's pictures; then it waits for their frames
        server_says(frames=[0, 1])
        assert await ws.until_sent(5) == 5  # the next chunk's three
        server_says(lost=1)  # one of them was lost on the server: one more makes the chunk
        assert await ws.until_sent(6) == 6
        server_says(frames=[2, 3, 4], lost=1)
        await asyncio.wait_for(sender, 10)  # the last picture (a partial chunk: no wait), then stop
        return ws.sent

    sent = asyncio.run(run())
    assert [parse_media(m)[0].seq for m in sent[:-1]] == list(range(7))
    assert json.loads(sent[-1]) == {"type": "stop"}


async def webrtc_camera_session(url: str, picture: np.ndarray, strength: float, server) -> list[np.ndarray]:
    """A real aiortc peer that sends ``picture`` as its camera track (as the page sends the browser's camera) and
    receives the generated video: the first ``N`` frames that come back, as ``uint8 [H, W, 3]``."""
    from aiortc import RTCPeerConnection, RTCSessionDescription, VideoStreamTrack
    from av import VideoFrame

    from framegraph.apps.client_webrtc import offer_url, post_offer

    class Camera(VideoStreamTrack):
        async def recv(self):
            pts, time_base = await self.next_timestamp()  # aiortc paces it at 30 fps (over max_fps: skipped)
            frame = VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = pts, time_base
            return frame

    pc = RTCPeerConnection()
    pc.createDataChannel("control")
    pc.addTransceiver("video", direction="recvonly")
    pc.addTransceiver(Camera(), direction="sendonly")
    got: list[np.ndarray] = []
    done = asyncio.Event()

    @pc.on("track")
    def on_track(track):
        async def drain():
            while len(got) < N:
                got.append((await track.recv()).to_ndarray(format="rgb24"))
            done.set()
        asyncio.ensure_future(drain())

    await pc.setLocalDescription(await pc.createOffer())
    answer = await asyncio.to_thread(post_offer, offer_url(url), {"type": "offer", "sdp": pc.localDescription.sdp,
                                                                  "pipeline": "generate",
                                                                  "options": OPTIONS | {"strength": strength}}, None)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
    try:
        await asyncio.wait_for(done.wait(), 60)
        camera = server.server.sessions[answer["session"]].pipeline.video_in
        assert camera.frames_in >= N and camera.last_size == tuple(picture.shape[1::-1]), camera.last_size
    finally:
        await pc.close()
    return got


def test_over_webrtc_the_camera_is_a_video_track_and_the_generated_stream_follows_it(server):
    """What the page sends over WebRTC: its camera as a video track (VP8 or H.264, any size: scaled here). A dark and
    a bright camera at strength 0.3 give different generated videos on the video track that comes back."""
    pytest.importorskip("aiortc", reason="WebRTC needs aiortc: pip install 'framegraph[webrtc]'")
    out = {level: asyncio.run(webrtc_camera_session(server.url, camera_picture(level, 2 * W, 2 * H), 0.3, server))
           for level in (0, 170)}
    dark, bright = (np.stack(out[level]).astype(np.float32) for level in (0, 170))
    assert dark.shape == (N, H, W, 3) and dark.std() > 5
    assert np.abs(dark[FIRST:] - bright[FIRST:]).mean() > 0.5, np.abs(dark - bright).mean()


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
def test_the_page_sends_chromiums_fake_camera_and_shows_the_generated_video(browser, server, tmp_path, transport):
    """Over WebRTC (the page's default) the camera goes as a video track; over the WebSocket as JPEG pictures drawn
    at the session size by the page."""
    import urllib.parse

    from browser_util import Page, assert_not_blank
    from helpers import wait_for

    options = {"size": "96x64", "chunk_frames": 2, "timesteps": [1000, 500], "prompt_embeds": "a.safetensors",
               "fps": 10}
    page = Page(browser, f"{server.http_url}?transport={transport}&options={urllib.parse.quote(json.dumps(options))}",
                screenshot=tmp_path / "camera.png")
    try:
        page.page.wait_for_selector("#pipeline option[value='generate']", state="attached", timeout=10_000)
        page.page.select_option("#pipeline", "generate")
        assert page.page.is_visible("#camera")  # the toggle shows for generate
        page.page.check("#camera")
        page.page.fill("#strength", "0.5")
        page.start("generate")
        s = page.wait_stats(lambda s: s["camera"]["sent"] >= 20 and s["presented"] >= 10, 90,
                            "camera pictures sent and generated frames presented")
        assert s["ready"]["input"] == "camera" and s["ready"]["strength"] == 0.5 and s["transport"] == transport
        assert s["ready"]["video_in"]["width"] == 96 and s["camera"]["width"] > 0  # the fake camera runs
        assert bool(s["camera"].get("track")) == (transport == "webrtc"), s["camera"]
        session = next(iter(server.server.sessions.values()))
        camera = session.pipeline.video_in
        wait_for(lambda: camera.frames_in >= 20, 20, "the server to take 20 camera pictures")
        if transport == "websocket":
            assert camera.last_size == (96, 64) and camera.scaled == 0  # drawn at the session size by the page
        else:  # the track's pictures, as the browser sent them (asked for at the session size)
            assert camera.last_size is not None and session.counters["video_in"] >= 20
        assert_not_blank(page.canvas_rgb(), "the generated video")
        page.screenshot()
        page.page.click("#stop")
        s = page.wait_stats(lambda s: s["closed"] is not None, 20, "the session to end")
        assert s["ended"] == "stopped" and not [e for e in s["errors"]], (s["ended"], s["errors"], page.errors)
        assert not s["camera"]["on"]
    finally:
        page.close()

