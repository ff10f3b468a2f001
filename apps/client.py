"""``framegraph client``: stream to a ``framegraph serve`` server, record what comes back, measure latency.

    framegraph client --url ws://127.0.0.1:8765/ws --pipeline scope --audio speech.wav --out out/scope.mp4
    framegraph client --pipeline testcard --seconds 5 --out out/card.mp4 --json
    framegraph client --pipeline generate --camera walk.mp4 --option input=camera --option strength=0.5 \
        --option prompt="an oil painting" --out out/painted.mp4

The audio file is decoded to 16 kHz mono PCM16. It is sent in 20 ms messages paced in real time. Each message is stamped
with a time. It is when its last sample would have left a microphone. The server stamps every frame it sends back. The
stamp is the capture time of the audio that produced it. So **glass-to-glass latency** is measured on one clock, the
client's, with no clock sync. It is receipt − capture of that audio.

Frames, JPEG or H.264, and returned audio are recorded to MP4. A background thread does it. The MP4 is H.264 + AAC,
muxed by pts. The client prints time to first frame, FPS and latency percentiles. ``--json`` prints a summary.

``--camera VIDEO`` sends a video file's frames as the camera, in JPEG. It uses flow control. It sends a chunk of
pictures at the session fps. Then it waits for their generated frames. The chunk size is
``ready.video_in.pictures_per_chunk``. So no frame of the file is replaced by the next while the model is busy. That
holds however slow the model is. The recording holds one generated frame per frame sent. A last partial chunk makes
none.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
import torch
from PIL import Image
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from framegraph.apps.server.pipelines.scene import orbit_eye
from framegraph.apps.server.protocol import (
    AUDIO_SAMPLE_RATE,
    Kind,
    MediaFlag,
    MediaHeader,
    ProtocolError,
    pack_media,
    parse_media,
)
from framegraph.renderers.cameras import look_at
from framegraph.stream import TICKS_PER_SECOND
from framegraph.stream.files import partial_name
from framegraph.stream.media import decode_audio, iter_video_frames, scale_picture
from framegraph.stream.telemetry import percentiles

CHUNK_SAMPLES = AUDIO_SAMPLE_RATE * 20 // 1000  # 20 ms


class ClientError(RuntimeError):
    """The server refused the session, or the exchange went wrong. The message says how."""


# ---- recording ------------------------------------------------------------------------------------------

class Recorder:
    """Decodes received frames and writes them to an MP4, with the returned audio, muxed by pts.

    Frames are JPEG or H.264. With ``raw`` they are ``uint8 [H, W, 3]`` pictures. The MP4 is H.264 + AAC. It is
    written on its own thread behind a bounded queue. ``dropped`` counts what did not fit. ``NAME.partial.mp4``
    is renamed to ``path`` when :meth:`close` finishes."""

    def __init__(self, path: str, *, width: int, height: int, fps: float, codec: str, audio: bool,
                 max_queue: int = 512):
        self.path, self.partial = path, partial_name(path)
        self.width, self.height = width, height
        self.fps = Fraction(fps).limit_denominator(1001)
        self.codec, self.audio = codec, audio
        self.frames = self.samples = self.dropped = 0
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._main, name="client-recorder", daemon=True)
        self._thread.start()

    def put(self, header: MediaHeader, payload: bytes) -> None:
        try:
            self._queue.put_nowait((header, payload))
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise ClientError(f"recording {self.path} failed: {self.error}") from self.error
        os.replace(self.partial, self.path)

    def _main(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        out = av.open(self.partial, "w", format="mp4")
        try:
            vs = out.add_stream("libx264", rate=self.fps)
            vs.width, vs.height, vs.pix_fmt = self.width, self.height, "yuv420p"
            vs.codec_context.time_base = 1 / self.fps
            vs.codec_context.options = {"preset": "veryfast", "crf": "20"}
            astream = None
            if self.audio:
                astream = out.add_stream("aac", rate=AUDIO_SAMPLE_RATE)
                astream.layout = "mono"
                astream.codec_context.time_base = Fraction(1, AUDIO_SAMPLE_RATE)
            decoder = av.CodecContext.create("h264", "r") if self.codec == "h264" else None
            last_index = -1
            while True:
                item = self._queue.get()
                if item is None:
                    break
                header, payload = item
                if header.kind == Kind.PCM16:
                    if astream is None:
                        continue
                    pcm = np.frombuffer(payload, "<i2").reshape(1, -1)
                    af = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
                    af.sample_rate = AUDIO_SAMPLE_RATE
                    af.pts = header.pts * AUDIO_SAMPLE_RATE // TICKS_PER_SECOND
                    af.time_base = Fraction(1, AUDIO_SAMPLE_RATE)
                    out.mux(astream.encode(af))
                    self.samples += pcm.shape[1]
                    continue
                if isinstance(payload, np.ndarray):  # already decoded (WebRTC): uint8 [H, W, 3]
                    pictures = [payload]
                elif decoder is not None:
                    pictures = [f.to_ndarray(format="rgb24") for f in decoder.decode(av.Packet(payload))]
                else:
                    pictures = [np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))]
                for rgb in pictures:
                    index = int(Fraction(header.pts) * self.fps // TICKS_PER_SECOND)
                    index = max(index, last_index + 1)
                    vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                    vf.pts, vf.time_base = index, 1 / self.fps
                    out.mux(vs.encode(vf))
                    last_index = index
                    self.frames += 1
            out.mux(vs.encode(None))
            if astream is not None:
                out.mux(astream.encode(None))
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.error = exc
            while self._queue.get() is not None:  # let close() finish
                pass
        finally:
            out.close()


# ---- the session --------------------------------------------------------------------------------------

def _percentiles(values: list[float]) -> dict:
    """``values`` in ms as the summary's count, p50 / p95 / p99 and max, rounded to the µs."""
    if not values:
        return {"count": 0}
    v = np.asarray(values)
    p50, p95, p99 = percentiles(v, (50, 95, 99))
    return {"count": len(v), "p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3),
            "p99_ms": round(float(p99), 3), "max_ms": round(float(v.max()), 3)}


@dataclass
class _Tally:
    """What a session received, counted as it arrives. The summary is made from it."""

    frames_ns: list[int] = field(default_factory=list)  # receipt time of each video frame
    g2g_ms: list[float] = field(default_factory=list)
    source_ms: list[float] = field(default_factory=list)  # frames without CLIENT_CLOCK: receipt − the server's time
    server_ms: list[float] = field(default_factory=list)
    compute_ms: list[float] = field(default_factory=list)
    encode_ms: list[float] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    video_seqs: list[int] = field(default_factory=list)
    audio_seqs: list[int] = field(default_factory=list)
    stats: dict | None = None
    ended: dict | None = None
    audio_sent: int = 0
    camera_sent: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set on every message (flow control waits on it)

    @property
    def pictures_lost(self) -> int:
        """Camera pictures the server reports it did not use, in the latest ``stats``.

        Some were dropped for the rate. Some were replaced by a newer one. Some were dropped at the source while
        the model was busy."""
        received, dropped = (self.stats or {}).get("received", {}), (self.stats or {}).get("dropped", {})
        return received.get("video_dropped", 0) + dropped.get("source", 0) + dropped.get("input_replaced_pictures", 0)

    @property
    def video_answered(self) -> int:
        """Video frames the server has sent so far, counted by ``seq``. Those dropped for a slow reader count too."""
        return self.video_seqs[-1] + 1 if self.video_seqs else 0

    def text(self, msg: dict) -> None:
        if msg["type"] == "error":
            self.errors.append(msg)
        elif msg["type"] == "stats":
            self.stats = msg
        elif msg["type"] == "ended":
            self.ended = msg

    def media(self, header: MediaHeader, now_ns: int, latency_trace: list | None) -> None:
        if header.kind == Kind.PCM16:
            self.audio_seqs.append(header.seq)
            return
        self.video_seqs.append(header.seq)
        self.frames_ns.append(now_ns)
        if header.flags & MediaFlag.CLIENT_CLOCK:
            self.g2g_ms.append((now_ns - header.capture_ns) / 1e6)
            if latency_trace is not None:
                latency_trace.append((now_ns, self.g2g_ms[-1]))
        elif header.capture_ns:
            self.source_ms.append((now_ns - header.capture_ns) / 1e6)
        self.server_ms.append((header.graph_us + header.send_wait_us) / 1e3)
        self.compute_ms.append(header.compute_us / 1e3)
        self.encode_ms.append(header.encode_us / 1e3)


def wait_for_server(url: str, seconds: float) -> None:
    """Return once the server of WebSocket URL ``url`` answers ``/healthz``.

    Raises :class:`ClientError` when none answered within ``seconds``. That is ``--wait``. It is for a server just
    started in the background that is still loading."""
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    health = urllib.parse.urlunsplit(("https" if parts.scheme == "wss" else "http", parts.netloc, "/healthz", "", ""))
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(health, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers: the session says what is wrong
        except OSError:
            if time.monotonic() >= deadline:
                raise ClientError(f"no server answered at {health} within --wait {seconds:g} s: start `framegraph "
                                  f"serve` first, or give its address with --url") from None
            time.sleep(0.25)


async def _connect(url: str, token: str | None):
    """Open the WebSocket. Returns ``(context manager, websocket)``. Refusals become :class:`ClientError`."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        ws_cm = connect(url, additional_headers=headers, max_size=2**24, compression=None, open_timeout=10)
        return ws_cm, await ws_cm.__aenter__()
    except InvalidStatus as exc:
        raise ClientError(f"{url} refused the connection: HTTP {exc.response.status_code} "
                          f"{exc.response.body.decode(errors='replace').strip()}") from None
    except OSError as exc:
        raise ClientError(f"cannot connect to {url}: {exc}") from None


class _SentOn(Exception):
    """A full cluster replica sent the session on to ``url``, another replica with room."""

    def __init__(self, url: str):
        super().__init__(url)
        self.url = url


async def _open(url: str, token: str | None, pipeline: str, options: dict | None, audio: np.ndarray | None,
                hops: int = 3):
    """Connect and start: ``(context manager, websocket, ready, when start was first sent in ns)``.

    A full cluster replica may name another one, ``url`` in its ``full`` error. The session starts there.
    """
    t_start = None
    for _ in range(hops + 1):
        ws_cm, ws = await _connect(url, token)
        t_start = t_start or time.monotonic_ns()
        try:
            return ws_cm, ws, await _start(ws, pipeline, options, audio), t_start
        except _SentOn as sent:
            url = sent.url
            await ws_cm.__aexit__(None, None, None)
        except BaseException as exc:
            await ws_cm.__aexit__(None, None, None)
            if isinstance(exc, (ProtocolError, ConnectionClosed)):
                raise ClientError(f"session failed: {exc}") from None
            raise
    raise ClientError(f"full cluster replicas sent the session on {hops + 1} times; the last was {url}")


async def _start(ws, pipeline: str, options: dict | None, audio: np.ndarray | None) -> dict:
    """Send ``start`` and wait for ``ready``. Returns its message. A refusal is a :class:`ClientError`."""
    await ws.send(json.dumps({"type": "start", "version": 1, "pipeline": pipeline, "options": options or {}}))
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if msg["type"] == "error" and msg["code"] == "full" and msg.get("url"):
            raise _SentOn(msg["url"])
        if msg["type"] == "error":
            raise ClientError(f"server refused start: {msg['code']}: {msg['message']}")
        if msg["type"] == "ready":
            break
    if msg.get("audio_in") and audio is None:
        await ws.send(json.dumps({"type": "stop"}))
        raise ClientError(f"pipeline {pipeline!r} takes audio input: pass --audio FILE")
    return msg


async def _send_audio(ws, audio: np.ndarray, seconds: float | None, tally: _Tally) -> None:
    """Stream ``audio`` in 20 ms messages paced like a microphone, then ``stop``."""
    t0 = time.monotonic()
    n_chunks = (len(audio) + CHUNK_SAMPLES - 1) // CHUNK_SAMPLES
    for i in range(n_chunks):
        if seconds is not None and (i + 1) * 0.02 > seconds:
            break
        await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))  # mic pacing
        block = audio[i * CHUNK_SAMPLES:(i + 1) * CHUNK_SAMPLES]
        header = MediaHeader(Kind.PCM16, seq=i, pts=i * CHUNK_SAMPLES * 3, capture_ns=time.monotonic_ns())
        await ws.send(pack_media(header, block.astype("<i2").tobytes()))
        tally.audio_sent += 1
    await ws.send(json.dumps({"type": "stop"}))


def camera_jpegs(path: str, video_in: dict):
    """The frames of a video file as the camera pictures ``ready.video_in`` asks for.

    Each is scaled to its size, aspect kept, by :func:`~framegraph.stream.media.scale_picture`. Each is JPEG at
    quality 90, lowered until under ``max_bytes``."""
    size = (video_in["width"], video_in["height"])
    for rgb in iter_video_frames(path):
        if rgb.shape[:2] != (size[1], size[0]):
            rgb = scale_picture(torch.from_numpy(rgb), size).numpy()
        for quality in (90, 75, 60, 45, 30):
            buf = io.BytesIO()
            Image.fromarray(rgb).save(buf, "JPEG", quality=quality)
            if buf.tell() <= video_in["max_bytes"]:
                break
        yield buf.getvalue()


async def _send_camera(ws, path: str, ready: dict, seconds: float | None, tally: _Tally) -> None:
    """A video file's frames as camera pictures, kind JPEG, then ``stop``.

    Flow control uses ``ready.video_in.pictures_per_chunk``. One chunk's pictures go at the session fps. Then it
    waits until the server has sent their frames. Then it sends the next chunk. No picture reaches the server while
    the model is busy. So none is replaced or dropped, however slow the model. Every frame of the file is used.
    The recording has one generated frame per frame sent. A last partial chunk makes none.

    The server may report a picture lost anyway, in ``stats.dropped`` or ``stats.received.video_dropped``. The
    next one makes up for it, so the wait cannot hang. After an error the rest is sent at the session fps.
    Without ``pictures_per_chunk`` it sends at the session fps throughout."""
    fps = min(ready["video"]["fps"], ready["video_in"]["max_fps"])
    per_chunk = ready["video_in"].get("pictures_per_chunk")
    chunk_end = per_chunk["first"] if per_chunk else None  # pictures used (= frames made) once this chunk is out
    due = time.monotonic()
    for i, payload in enumerate(camera_jpegs(path, ready["video_in"])):
        if seconds is not None and i / fps >= seconds:
            break
        await asyncio.sleep(max(0.0, due - time.monotonic()))  # camera pacing: never over video_in.max_fps
        header = MediaHeader(Kind.JPEG, seq=i, pts=round(i * TICKS_PER_SECOND / fps), capture_ns=time.monotonic_ns())
        await ws.send(pack_media(header, payload))
        tally.camera_sent += 1
        due += 1 / fps
        while chunk_end is not None and tally.camera_sent - tally.pictures_lost >= chunk_end and not tally.errors:
            if tally.video_answered >= chunk_end:  # the chunk's frames are back: on to the next chunk
                chunk_end += per_chunk["next"]
                due = max(due, time.monotonic())
            else:  # its pictures are in: wait for its frames (or news of a lost picture)
                tally.arrived.clear()
                await tally.arrived.wait()
    await ws.send(json.dumps({"type": "stop"}))


async def _stop_after(ws, delay: float) -> None:
    await asyncio.sleep(delay)
    await ws.send(json.dumps({"type": "stop"}))


async def _send_orbit(ws, ready: dict, deg_per_s: float) -> None:
    """One ``pose`` per frame period, orbiting the server's starting camera, ``ready.camera``."""
    cam = ready.get("camera") or {}
    t0 = time.monotonic()
    while True:
        await asyncio.sleep(1.0 / ready["video"]["fps"])
        az = cam.get("azimuth_deg", 0.0) + deg_per_s * (time.monotonic() - t0)
        matrix = orbit_pose(cam.get("target", [0, 0, 0]), cam.get("distance", 3.0), az, cam.get("elevation_deg", 20.0))
        await ws.send(json.dumps({"type": "pose", "matrix": matrix}))


async def _receive(ws, tally: _Tally, recorder: Recorder | None, limit_s: float, latency_trace: list | None) -> None:
    """Count and record everything the server sends, until it ends the session or ``limit_s`` passes."""
    try:
        async with asyncio.timeout(limit_s):
            async for message in ws:
                now = time.monotonic_ns()
                if isinstance(message, str):
                    tally.text(json.loads(message))
                else:
                    header, payload = parse_media(message)
                    tally.media(header, now, latency_trace)
                    if recorder is not None:
                        recorder.put(header, bytes(payload))
                tally.arrived.set()
    except TimeoutError:
        tally.errors.append({"type": "error", "code": "client_timeout",
                             "message": f"no end of session within {limit_s:.0f} s"})
    except ConnectionClosed:
        pass


def close_of(ws) -> dict:
    """How the connection ended: ``{"code", "reason"}``.

    The code is 1006 when it was lost without a close frame. Then the serving process stopped or the network
    failed. A cluster client connects again."""
    code = ws.close_code
    if code is None:
        return {"code": None, "reason": ""}
    if code == 1006:
        return {"code": 1006, "reason": "connection lost without a close frame (the serving process stopped "
                                        "or the network failed); connect again to continue"}
    return {"code": code, "reason": ws.close_reason or ""}


def _summary(url: str, pipeline: str, ready: dict, tally: _Tally, t_start: int, out: str | None,
             recorder: Recorder | None, *, server_address: str, close: dict) -> dict:
    frames_ns = tally.frames_ns
    span = (frames_ns[-1] - frames_ns[0]) / 1e9 if len(frames_ns) > 1 else 0.0
    return {
        "url": url, "server_address": server_address, "close": close, "transport": "websocket",
        "pipeline": pipeline, "session": ready["session"], "format": ready,
        "video_frames": len(frames_ns), "audio_messages_received": len(tally.audio_seqs),
        "audio_messages_sent": tally.audio_sent, "camera_pictures_sent": tally.camera_sent,
        "time_to_first_frame_ms": round((frames_ns[0] - t_start) / 1e6, 3) if frames_ns else None,
        "fps": round((len(frames_ns) - 1) / span, 3) if span > 0 else 0.0,
        "longest_stall_ms": round(max(np.diff(frames_ns)) / 1e6, 3) if len(frames_ns) > 1 else None,
        "glass_to_glass": _percentiles(tally.g2g_ms),
        # frames made without client input (the test card): the server's monotonic clock at their source to
        # their receipt; one clock only when client and server share a host
        "source_to_glass_same_host": _percentiles(tally.source_ms), "server": _percentiles(tally.server_ms),
        "compute": _percentiles(tally.compute_ms), "encode": _percentiles(tally.encode_ms),
        "gaps": {"video": _gaps(tally.video_seqs), "audio": _gaps(tally.audio_seqs)},
        "server_stats": tally.stats, "ended": (tally.ended or {}).get("reason"), "errors": tally.errors,
        "out": os.path.abspath(out) if out else None,
        "recorded_frames": recorder.frames if recorder else 0, "record_drops": recorder.dropped if recorder else 0,
    }


async def stream_session(url: str, pipeline: str = "testcard", options: dict | None = None, *,
                         audio: np.ndarray | None = None, seconds: float | None = None, token: str | None = None,
                         out: str | None = None, end_timeout_s: float = 15.0,
                         latency_trace: list | None = None, orbit_deg_per_s: float | None = None,
                         camera: str | None = None) -> dict:
    """Run one session against a server and return the summary dict. See the module docstring.

    Phases: connect → start (``ready``) → feeders → receive until ``ended`` → summary. The feeders send audio at
    mic pace, or a timed stop, and a camera orbit.

    Args:
        audio: int16 mono 16 kHz samples to stream in real time. Pipelines with audio input need it.
        seconds: stop after this long. By default it stops when the audio ends, or when the server ends.
        out: record received video, and audio, to this MP4.
        orbit_deg_per_s: for pipelines that take camera poses, ``ready.pose_in``. It sends a ``pose`` per frame
            period. The poses orbit the server's starting camera, ``ready.camera``, at this rate.
        camera: a video file sent as the camera, for pipelines with ``ready.video_in``. Its frames go as JPEG at
            the session fps, once, a chunk at a time. Each chunk is sent when the frames of the one before came
            back. So no picture is lost to a slow model. Then ``stop``, or stop at ``seconds`` of the file.
        latency_trace: when given, ``(receipt monotonic ns, glass-to-glass ms)`` of every video frame is
            appended to it. Soak runs use it to look at latency over time.
    """
    tally, recorder = _Tally(), None
    ws_cm, ws, ready, t_start = await _open(url, token, pipeline, options, audio)
    try:
        video = ready["video"]
        if out:
            recorder = Recorder(out, width=video["width"], height=video["height"], fps=video["fps"],
                                codec=video["codec"], audio=bool(ready.get("audio_out")))
        tasks = []
        if orbit_deg_per_s and ready.get("pose_in"):
            tasks.append(asyncio.create_task(_send_orbit(ws, ready, orbit_deg_per_s)))
        if camera is not None:
            if not ready.get("video_in"):
                await ws.send(json.dumps({"type": "stop"}))
                raise ClientError(f"pipeline {pipeline!r} takes no camera pictures (ready.video_in is null); for "
                                  f"generate, pass --option input=camera --option strength=0.5")
            tasks.append(asyncio.create_task(_send_camera(ws, camera, ready, seconds, tally)))
        elif ready.get("audio_in"):
            tasks.append(asyncio.create_task(_send_audio(ws, audio, seconds, tally)))
        elif seconds is not None:
            tasks.append(asyncio.create_task(_stop_after(ws, seconds)))
        limit = (seconds or (len(audio) / AUDIO_SAMPLE_RATE if audio is not None and camera is None else 3600)) \
            + end_timeout_s
        await _receive(ws, tally, recorder, limit, latency_trace)
        for task in tasks:
            task.cancel()
    except (ProtocolError, ConnectionClosed) as exc:
        raise ClientError(f"session failed: {exc}") from None
    finally:
        await ws_cm.__aexit__(None, None, None)
        if recorder is not None:
            recorder.close()
    return _summary(url, pipeline, ready, tally, t_start, out, recorder,
                    server_address="{}:{}".format(*ws.remote_address[:2]), close=close_of(ws))


def orbit_pose(target, distance: float, azimuth_deg: float, elevation_deg: float) -> list[list[float]]:
    """World-to-camera 4×4, OpenCV, on the orbit the ``scene`` pipeline and the web page use. z is up."""
    eye = orbit_eye(target, distance, azimuth_deg, elevation_deg)
    return look_at(torch.tensor(eye), torch.tensor(target, dtype=torch.float64)).tolist()


def _gaps(seqs: list[int]) -> int:
    """Messages missing from a per-kind sequence: dropped by the server for a slow reader."""
    return int(sum(max(0, b - a - 1) for a, b in zip(seqs, seqs[1:])))


# ---- command line -------------------------------------------------------------------------------------

def options_from_args(args: argparse.Namespace) -> dict:
    options = {k: v for k, v in (("size", args.size), ("fps", args.fps), ("codec", args.codec),
                                 ("quality", args.quality)) if v is not None}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def run(args: argparse.Namespace, webrtc_session=None) -> int:
    """The command.

    ``webrtc_session`` is the WebRTC session function, ``client_webrtc.stream_session_webrtc``.
    ``client_webrtc.run``, the command's entry, passes it in. So this module does not import it."""
    options = options_from_args(args)
    audio = decode_audio(args.audio) if args.audio else None
    if args.camera and not os.path.isfile(args.camera):
        raise FileNotFoundError(f"--camera {args.camera}: no such file; expected a video file")
    seconds = args.seconds
    if args.scene:
        args.pipeline = "scene"
        if args.scene != "random":
            options.setdefault("scene", args.scene)
        if seconds is None:
            seconds = 5.0
    elif args.orbit is not None:
        raise ValueError("--orbit goes with --scene NAME")
    if seconds is None and audio is None and args.pipeline == "testcard":
        seconds = 5.0
    if args.pipeline == "testcard" and seconds is not None:
        options.setdefault("seconds", seconds)
        seconds += 2.0  # the server ends the card; stop is only the fallback
    if args.transport == "webrtc" and (args.camera or args.orbit is not None):
        raise ValueError("--camera and --orbit go over the WebSocket transport only (for now)")
    try:
        if args.wait:
            wait_for_server(args.url, args.wait)
        if args.transport == "webrtc":
            if webrtc_session is None:
                raise ValueError("--transport webrtc: run it as `framegraph client` (apps/client_webrtc.py)")
            summary = asyncio.run(webrtc_session(args.url, args.pipeline, options, audio=audio,
                                                 seconds=seconds, token=args.token, out=args.out))
        else:
            summary = asyncio.run(stream_session(args.url, args.pipeline, options, audio=audio, seconds=seconds,
                                                 token=args.token, out=args.out, orbit_deg_per_s=args.orbit,
                                                 camera=args.camera))
    except ClientError as exc:
        print(f"framegraph client: error: {exc}", file=sys.stderr)
        return 1
    print_summary(summary)
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    return 0 if not summary["errors"] and summary["video_frames"] else 1


def print_summary(s: dict) -> None:
    def pct(d: dict) -> str:
        return (f"p50 {d['p50_ms']:.1f} / p95 {d['p95_ms']:.1f} / p99 {d['p99_ms']:.1f} ms" if d.get("count")
                else "n/a")

    v = s["format"]["video"]
    lines = [
        f"session {s['session']} ({s['pipeline']} over {s['transport']}, {v['codec']} {v['width']}x{v['height']} "
        f"@ {v['fps']:g} fps): "
        f"{s['video_frames']} frames, ended: {s['ended']}",
        f"  time to first frame  {s['time_to_first_frame_ms']} ms",
        f"  fps                  {s['fps']:.2f} (longest wait between two frames {s['longest_stall_ms']} ms)",
        f"  glass-to-glass       {pct(s['glass_to_glass'])}",
        f"  server (graph+send)  {pct(s['server'])}",
        f"  dropped              {s['gaps']['video']} video, {s['gaps']['audio']} audio messages",
    ]
    if s["out"]:
        lines.append(f"  recorded             {s['out']} ({s['recorded_frames']} frames)")
    for e in s["errors"]:
        lines.append(f"  error                {e.get('code')}: {e.get('message')}")
    print("\n".join(lines), file=sys.stderr)
