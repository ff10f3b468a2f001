"""``framegraph client --transport webrtc``: the same session as :func:`..client.stream_session`, over WebRTC.

The offer goes to ``POST /webrtc/offer`` on the server named by the same ``--url`` as for the WebSocket
(``ws://HOST:PORT/ws?token=T`` → ``http://HOST:PORT/webrtc/offer?token=T``; a cluster front door answers 307
to a replica, followed here). Audio goes up as an Opus track whose packets this client stamps itself, so it
can tell the server, in ``clock`` messages, when the audio behind each RTP timestamp was captured; the server's
``frame`` message for each video frame carries the frame's RTP timestamp and the media header's fields
(capture time of that audio on this client's clock, server timings). Glass-to-glass latency is then receipt of
the decoded frame − capture, on one clock, as over the WebSocket, and the summary has the same fields.
Received frames and audio are recorded by the same :class:`..client.Recorder`, placed by session pts.

The ``framegraph client`` command enters here (:func:`run`: both transports), so that ``client.py`` itself never
imports WebRTC.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from framegraph.apps.server.protocol import AUDIO_SAMPLE_RATE, Kind, MediaHeader

from . import client
from .client import CHUNK_SAMPLES, ClientError, Recorder, _summary, _Tally

__all__ = ["run", "offer_url", "post_offer", "stream_session_webrtc"]

OFFER_PATH = "/webrtc/offer"


def offer_url(ws_url: str) -> str:
    """The offer endpoint of the server at ``ws_url`` (its query, e.g. a token or a cluster ticket, kept)."""
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, OFFER_PATH, parts.query, ""))


def post_offer(url: str, body: dict, token: str | None, hops: int = 3) -> dict:
    """POST the offer; the answer as a dict, with ``url``: where it was answered. A 307 (a cluster front door
    placing the session) is followed; a refusal is a :class:`ClientError` with the server's code and message."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method="POST"), timeout=30) as r:
            return {**json.loads(r.read()), "url": url}
    except urllib.error.HTTPError as exc:
        if exc.code in (307, 308) and hops > 0:
            return post_offer(exc.headers["Location"], body, token, hops - 1)
        text = exc.read().decode(errors="replace").strip()
        try:
            err = json.loads(text)
            text = f"{err['code']}: {err['message']}"
        except (ValueError, KeyError, TypeError):
            pass
        raise ClientError(f"{url} refused the offer: HTTP {exc.code} {text}") from None
    except OSError as exc:
        raise ClientError(f"cannot reach {url}: {exc}") from None


class _Microphone:
    """The audio file as a live microphone: 20 ms Opus packets paced in real time (a track for aiortc), each
    one's capture time kept by RTP timestamp for the ``clock`` messages."""

    def __init__(self, audio: np.ndarray, seconds: float | None, on_clock):
        from aiortc import MediaStreamTrack

        from framegraph.apps.server.webrtc_media import OpusPackets, rtp_origin

        outer = self

        class Track(MediaStreamTrack):
            kind = "audio"

            async def recv(self):
                return await outer.next_packet()

        self.track = Track()
        self.sender = None
        self.audio, self.on_clock = audio, on_clock
        n = (len(audio) + CHUNK_SAMPLES - 1) // CHUNK_SAMPLES
        self.chunks = n if seconds is None else min(n, int(seconds / 0.02))
        self.sent = 0
        self.done = asyncio.Event()
        self._opus, self._origin_of = OpusPackets(), rtp_origin
        self._origin = None
        self._last_pts = None  # of the packet handed to aiortc last
        self._t0 = None

    async def next_packet(self):
        i = self.sent
        ticks = i * CHUNK_SAMPLES * 3  # 48 kHz
        if self._origin is None and self._last_pts is not None:
            # RTP timestamp = origin + the pts of the sound (OpusPackets stamps each packet with it)
            self._origin = self._origin_of(self.sender, self._last_pts)
        if i >= self.chunks:
            self.done.set()
            await asyncio.sleep(3600)  # the stream is over: nothing more (the session is stopped)
        if self._t0 is None:
            self._t0 = time.monotonic()
        await asyncio.sleep(max(0.0, self._t0 + (i + 1) * 0.02 - time.monotonic()))  # mic pacing
        block = np.zeros(CHUNK_SAMPLES, np.int16)
        part = self.audio[i * CHUNK_SAMPLES:(i + 1) * CHUNK_SAMPLES]
        block[:len(part)] = part
        captured = time.monotonic_ns()  # the last sample of this block has just been "captured"
        if self._origin is not None and (i % 25 == 0 or i < 5):  # tell the server twice a second
            self.on_clock((self._origin + ticks) % 2**32, captured - 20_000_000 + 62_500)  # first sample's time
        self.sent += 1
        packet = self._opus.encode(block.astype("<i2").tobytes(), ticks)
        while packet is None:  # the encoder's first call may hold its packet back: feed it
            packet = self._opus.encode(block.astype("<i2").tobytes(), ticks)
        self._last_pts = packet.pts
        return packet


class _Receiver:
    """Pairs decoded frames with the server's ``frame`` messages by RTP timestamp; feeds the tally and the
    recorder as the WebSocket client's receive loop does."""

    def __init__(self, tally: _Tally, recorder_box: list, latency_trace: list | None):
        self.tally, self.recorder_box, self.trace = tally, recorder_box, latency_trace
        self.meta: dict[int, dict] = {}
        self.pending: dict[int, tuple[int, object]] = {}
        self.video_origin = None
        self.audio_anchor = None
        self.resampler = None
        self.audio_messages = 0
        self.video_receiver = self.audio_receiver = None

    def on_frame_message(self, msg: dict) -> None:
        rtp = msg["rtp_timestamp"]
        self.video_origin = (rtp - msg["pts"] * 15 // 8) % 2**32
        if rtp in self.pending:
            now, rgb = self.pending.pop(rtp)
            self._count(msg, now, rgb)
        else:
            self.meta[rtp] = msg
            if len(self.meta) > 256:
                self.meta.pop(next(iter(self.meta)))

    def on_video(self, frame, now: int) -> None:
        from framegraph.apps.server.webrtc_media import received_rtp

        rgb = frame.to_ndarray(format="rgb24")
        rtp = received_rtp(self.video_receiver, frame.pts)
        msg = self.meta.pop(rtp, None)
        if msg is not None:
            self._count(msg, now, rgb)
            return
        self.pending[rtp] = (now, rgb)
        if len(self.pending) > 64:  # no timing came for it: counted without glass-to-glass
            old = next(iter(self.pending))
            self._count(None, *self.pending.pop(old), rtp=old)

    def flush(self) -> None:
        for rtp, (now, rgb) in sorted(self.pending.items(), key=lambda kv: kv[1][0]):
            self._count(None, now, rgb, rtp=rtp)
        self.pending.clear()

    def _count(self, msg: dict | None, now: int, rgb, rtp: int | None = None) -> None:
        if msg is not None:
            h = MediaHeader(Kind.H264, msg["flags"], msg["seq"], msg["pts"], msg["capture_ns"], msg["graph_us"],
                            msg["compute_us"], msg["encode_us"], msg["send_wait_us"])
        else:
            pts = 0 if self.video_origin is None else ((rtp - self.video_origin) % 2**32) * 8 // 15
            seq = self.tally.video_seqs[-1] + 1 if self.tally.video_seqs else 0
            h = MediaHeader(Kind.H264, 0, seq, pts)
        self.tally.media(h, now, self.trace)
        if self.recorder_box[0] is not None:
            self.recorder_box[0].put(h, rgb)

    def on_audio(self, frame) -> None:
        import av

        from framegraph.apps.server.webrtc_media import received_rtp

        rtp = received_rtp(self.audio_receiver, frame.pts)
        if self.audio_anchor is None or rtp is None:
            return  # which session pts this is is not known yet (the server's "rtp" message is on its way)
        pts0, rtp0 = self.audio_anchor
        start = pts0 + ((rtp - rtp0 + 2**31) % 2**32 - 2**31)  # 48 kHz RTP clock = session ticks
        if self.resampler is None:
            self.resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_SAMPLE_RATE)
        for out in self.resampler.resample(frame):
            pcm = out.to_ndarray().astype("<i2", copy=False).tobytes()
            h = MediaHeader(Kind.PCM16, 0, self.audio_messages, start)
            self.tally.media(h, time.monotonic_ns(), None)
            self.audio_messages += 1
            if self.recorder_box[0] is not None:
                self.recorder_box[0].put(h, pcm)


def _release_at_marker(receiver) -> None:
    """Decode a video frame as soon as its last packet (RTP marker bit) is in, as browsers do: aiortc's jitter
    buffer (1.x, private) releases a frame only when the next frame's first packet arrives, which put a frame
    period (40 ms at 25 fps) of this client's own into every glass-to-glass figure."""
    from aiortc.jitterbuffer import JitterBuffer, JitterFrame

    class MarkerJitterBuffer(JitterBuffer):
        def _remove_frame(self, sequence_number: int):
            packets = []
            for count in range(self.capacity):
                packet = self._packets[(self._origin + count) % self.capacity]
                if packet is None or (packets and packet.timestamp != packets[0].timestamp):
                    break
                packets.append(packet)
                if packet.marker:  # the frame from the origin on is complete
                    self.remove(count + 1)
                    return JitterFrame(data=b"".join(p._data for p in packets), timestamp=packets[0].timestamp)
            return super()._remove_frame(sequence_number)

    if hasattr(receiver, "_RTCRtpReceiver__jitter_buffer"):
        receiver._RTCRtpReceiver__jitter_buffer = MarkerJitterBuffer(capacity=512, is_video=True)


async def _drain(track, handle) -> None:
    from aiortc.mediastreams import MediaStreamError

    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        handle(frame)


def _control_handler(receiver: _Receiver, tally: _Tally, ready_box: list[dict], got_ready: asyncio.Event,
                     ended: asyncio.Event):
    """The data channel's message handler: ``frame`` timings and the ``rtp`` anchor go to the receiver,
    ``ready`` into ``ready_box``, the rest to the tally; ``close``, ``ended`` (or an error before ``ready``)
    set ``ended``."""
    def on_message(text) -> None:
        msg = json.loads(text)
        kind = msg.get("type")
        if kind == "frame":
            receiver.on_frame_message(msg)
        elif kind == "rtp":
            receiver.audio_anchor = (msg["pts"], msg["rtp_timestamp"])
        elif kind == "ready":
            ready_box.append(msg)
            got_ready.set()
        elif kind == "close":
            ended.set()
        else:
            tally.text(msg)
            if kind == "ended" or (kind == "error" and not got_ready.is_set()):
                ended.set()
                got_ready.set()
        tally.arrived.set()

    return on_message


def _track_handler(pc, receiver: _Receiver, tasks: list, frames_ns: list | None, release_at_marker: bool):
    """The peer connection's ``track`` handler: each of the server's tracks drained into the receiver by a task
    added to ``tasks`` (each video frame's receipt time also appended to ``frames_ns``, when given)."""
    def on_track(track):
        rtp_receiver = next((r for r in pc.getReceivers() if r.track is track), None)
        setattr(receiver, f"{track.kind}_receiver", rtp_receiver)
        if track.kind == "video" and release_at_marker:
            _release_at_marker(rtp_receiver)
        def on_video(frame):
            now = time.monotonic_ns()
            if frames_ns is not None:
                frames_ns.append(now)
            receiver.on_video(frame, now)

        handle = on_video if track.kind == "video" else receiver.on_audio
        tasks.append(asyncio.ensure_future(_drain(track, handle)))

    return on_track


def _add_media(pc, channel, audio: np.ndarray | None, seconds: float | None) -> _Microphone | None:
    """Receive video; send ``audio`` as a live microphone (its ``clock`` messages on ``channel``), or receive
    audio when there is none to send. Returns the microphone (None without audio)."""
    mic = None
    pc.addTransceiver("video", direction="recvonly")
    if audio is not None:
        mic = _Microphone(audio, seconds, lambda rtp, ns: channel.send(json.dumps(
            {"type": "clock", "rtp_timestamp": rtp, "capture_ns": ns})) if channel.readyState == "open" else None)
        mic.sender = pc.addTrack(mic.track)
    else:
        pc.addTransceiver("audio", direction="recvonly")
    return mic


async def _await_ready(pc, got_ready: asyncio.Event, ready_box: list[dict], tally: _Tally) -> dict:
    """The server's ``ready`` message, waited for 30 s at most; a :class:`ClientError` when none comes or the
    session failed before it."""
    try:
        await asyncio.wait_for(got_ready.wait(), 30)
    except TimeoutError:
        raise ClientError(f"no \"ready\" within 30 s (ICE state {pc.iceConnectionState})") from None
    if not ready_box:
        raise ClientError(f"session failed before ready: {tally.errors}")
    return ready_box[0]


async def stream_session_webrtc(url: str, pipeline: str = "testcard", options: dict | None = None, *,
                                audio: np.ndarray | None = None, seconds: float | None = None,
                                token: str | None = None, out: str | None = None, end_timeout_s: float = 15.0,
                                latency_trace: list | None = None, ice_servers: list[dict] | None = None,
                                frames_ns: list | None = None, release_at_marker: bool = True) -> dict:
    """One session over WebRTC; returns the summary of :func:`..client.stream_session` (``transport``:
    ``"webrtc"``). ``url`` is the server's WebSocket URL (the offer endpoint is found from it).
    ``frames_ns``: when given, the receipt time (monotonic ns) of each decoded video frame is appended.
    ``release_at_marker``: decode each frame once its last packet is in (:func:`_release_at_marker`); False:
    aiortc's own jitter buffer (a frame period later)."""
    from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

    from framegraph.apps.server.webrtc_media import survive_loss

    tally, recorder_box = _Tally(), [None]
    receiver = _Receiver(tally, recorder_box, latency_trace)
    ice = [RTCIceServer(**s) for s in ice_servers or []]
    pc = RTCPeerConnection(RTCConfiguration(iceServers=ice or None))
    channel = pc.createDataChannel("control")
    ready_box: list[dict] = []
    got_ready, ended = asyncio.Event(), asyncio.Event()
    channel.on("message", _control_handler(receiver, tally, ready_box, got_ready, ended))
    tasks = []
    pc.on("track", _track_handler(pc, receiver, tasks, frames_ns, release_at_marker))
    pc.on("connectionstatechange", lambda: ended.set() if pc.connectionState in ("failed", "closed") else None)
    mic = _add_media(pc, channel, audio, seconds)
    t_start = time.monotonic_ns()
    endpoint = offer_url(url)
    try:
        await pc.setLocalDescription(await pc.createOffer())
        answer = await asyncio.to_thread(post_offer, endpoint, {"type": "offer", "sdp": pc.localDescription.sdp,
                                                                "pipeline": pipeline, "options": options or {}}, token)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
        survive_loss(pc)
        ready = await _await_ready(pc, got_ready, ready_box, tally)
        video = ready["video"]
        if ready.get("audio_in") and audio is None:
            raise ClientError(f"pipeline {pipeline!r} takes audio input: pass --audio FILE")
        if out:
            recorder_box[0] = Recorder(out, width=video["width"], height=video["height"], fps=video["fps"],
                                       codec="raw", audio=bool(ready.get("audio_out")))
        if seconds is not None or mic is not None:
            tasks.append(asyncio.ensure_future(_stop_when(channel, mic, seconds)))
        limit = (seconds or (len(audio) / AUDIO_SAMPLE_RATE if audio is not None else 3600)) + end_timeout_s
        try:
            await asyncio.wait_for(ended.wait(), limit)
        except TimeoutError:
            tally.errors.append({"type": "error", "code": "client_timeout",
                                 "message": f"no end of session within {limit:.0f} s"})
        await asyncio.sleep(0.2)  # the last frames still in the jitter buffer
    finally:
        for task in tasks:
            task.cancel()
        await pc.close()
        receiver.flush()
        if recorder_box[0] is not None:
            recorder_box[0].close()
    tally.audio_sent = mic.sent if mic is not None else 0
    tally.audio_seqs = list(range(receiver.audio_messages))
    summary = _summary(url, pipeline, ready, tally, t_start, out, recorder_box[0],
                       server_address=urlsplit(answer["url"]).netloc, close={"code": None, "reason": ""})
    summary["transport"] = "webrtc"
    summary["codec_negotiated"] = _negotiated(pc)
    return summary


async def _stop_when(channel, mic, seconds: float | None) -> None:
    """``stop`` when the microphone has played the file (or after ``seconds``)."""
    if mic is not None:
        await mic.done.wait()
    else:
        await asyncio.sleep(seconds)
    if channel.readyState == "open":
        channel.send(json.dumps({"type": "stop"}))


def _negotiated(pc) -> str | None:
    from aiortc.sdp import SessionDescription

    if pc.remoteDescription is None:
        return None
    video = [m for m in SessionDescription.parse(pc.remoteDescription.sdp).media if m.kind == "video"]
    return video[0].rtp.codecs[0].mimeType if video and video[0].rtp.codecs else None



def run(args) -> int:
    """``framegraph client``: :func:`..client.run`, with this module's session for ``--transport webrtc``."""
    return client.run(args, webrtc_session=stream_session_webrtc)
