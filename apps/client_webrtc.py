"""``framegraph client --transport webrtc``: the same session as :func:`..client.stream_session`, over WebRTC.

The offer goes to ``POST /webrtc/offer`` on the server. The same ``--url`` as for the WebSocket names it. So
``ws://HOST:PORT/ws?token=T`` → ``http://HOST:PORT/webrtc/offer?token=T``. A cluster front door answers 307 to a
replica, which is followed here.

Audio goes up as an Opus track whose packets this client stamps itself. So it can tell the server when the audio behind
each RTP timestamp was captured. It does so in ``clock`` messages. The server sends a ``frame`` message for each video
frame. It carries the frame's RTP timestamp and the media header's fields. Those are the capture time of that audio on
this client's clock, and server timings. Glass-to-glass latency is then receipt of the decoded frame − capture. It is on
one clock, as over the WebSocket. The summary has the same fields. Received frames and audio are recorded by the same
:class:`..client.Recorder`, placed by session pts.

The ``framegraph client`` command enters here, for both transports: :func:`run`. So ``client.py`` itself never
imports WebRTC.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import numpy as np

from framegraph.apps.server.protocol import AUDIO_SAMPLE_RATE, Kind, MediaHeader
from framegraph.apps.server.webrtc import offer_url

from . import client
from .client import CHUNK_SAMPLES, ClientError, Recorder, _summary, _Tally

__all__ = ["run", "offer_url", "post_offer", "stream_session_webrtc"]


def post_offer(url: str, body: dict, token: str | None, hops: int = 3) -> dict:
    """POST the offer. Returns the answer as a dict, with ``url``: where it was answered.

    A 307 from a cluster front door placing the session is followed. A refusal is a :class:`ClientError` with the
    server's code and message."""
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
    """The audio file as a live microphone, a track for aiortc. It sends 20 ms Opus packets paced in real time.

    Each packet's capture time is kept by RTP timestamp, for the ``clock`` messages."""

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
    """Pairs decoded frames with the server's ``frame`` messages by RTP timestamp.

    It feeds the tally and the recorder, as the WebSocket client's receive loop does."""

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


H264_SPS = 7  # NAL unit type of a sequence parameter set: a key frame's access unit starts with one
MAX_WAIT_MS = 100.0  # how long the frames behind a lost packet wait for its retransmission (docs/webrtc.md)
# a key frame asked for is awaited 3 × MAX_WAIT_MS (a round trip and a frame) before it is asked for again; so long
# too is a hole in a key frame waited for (dropping it means waiting for another key frame, as large and as exposed)
KEYFRAME_WAITS = 3


def starts_h264_keyframe(data: bytes) -> bool:
    """Whether a depayloaded H.264 RTP packet begins a key frame.

    The packet is Annex-B, as aiortc's depayloader gives it. It does when a NAL unit in it is a sequence parameter set.
    The unit may be a single NAL or an aggregate. It may be a fragmentation unit's first fragment. The x264 encoder puts
    one before each IDR picture. It is the server's encoder and aiortc's. The picture's slices come after it, and there
    may be several. A middle fragment has no start code, so it never begins one. Inside a NAL unit no start code occurs,
    by emulation prevention."""
    return any(nal and nal[0] & 0x1F == H264_SPS for nal in data.split(b"\x00\x00\x00\x01")[1:])


class VideoJitterBuffer:
    """H.264 RTP packets → access units in order, as a browser's jitter buffer does.

    Each access unit is released as soon as its last packet is in. The RTP marker bit marks that packet. Where a packet
    is missing, the frames behind it wait ``max_wait_ms`` for its retransmission. The receiver NACKs it once a later
    packet shows the hole. The wait is ``KEYFRAME_WAITS`` times as long when the frame with the hole is a key frame.
    Then the incomplete frames are dropped. Nothing is released until a key frame, since H.264 frames refer to the one
    before. One is asked for, with a PLI. A complete frame that can be decoded is never dropped.

    aiortc's own 1.x buffer works otherwise. It releases a frame only when the next frame's first packet comes. It
    releases at most one frame per packet. It waits for a lost packet until 512 more have come. See docs/webrtc.md.

    Packets are kept by RTP sequence number, 16 bits, wrapping. ``_next`` is the first one not yet released or
    dropped. Times are monotonic ns, given by the caller to :meth:`add` and :meth:`expire`."""

    def __init__(self, max_wait_ms: float = MAX_WAIT_MS, capacity: int = 512):
        self.max_wait_ns = int(max_wait_ms * 1e6)
        self.capacity = capacity
        self.keyframe_requests = 0  # PLIs: a missing packet given up on with no key frame behind it, or none came
        self._packets: dict[int, object] = {}  # sequence number → RtpPacket (with aiortc's ``_data``)
        self._next: int | None = None
        self._need_keyframe = True  # the stream is joined at a key frame (the first packets may come reordered)
        self._waiting_since: int | None = None  # ns: since when a packet after the oldest hole came
        self._hole: int | None = None  # sequence number of the oldest packet missing, that later ones wait for

    @property
    def deadline_ns(self) -> int | None:
        """When the wait for the missing packet, or the asked-for key frame, ends. None while nothing waits."""
        if self._waiting_since is None:
            return None
        waits = KEYFRAME_WAITS if self._need_keyframe or self._holding_keyframe() else 1
        return self._waiting_since + self.max_wait_ns * waits

    def _holding_keyframe(self) -> bool:
        """Whether the oldest frame waiting for the hole is a key frame."""
        first = self._packets.get(self._next)
        return first is not None and starts_h264_keyframe(first._data)

    def add(self, packet, now_ns: int) -> tuple[bool, list]:
        """One packet in. Returns (ask for a key frame, the frames now complete as ``JitterFrame``, oldest first)."""
        seq = packet.sequence_number
        if self._next is None:
            self._next = (seq - 100) % 2**16  # a key frame's first packets may still come, reordered
        ahead = (seq - self._next) % 2**16
        if ahead >= 2**15:  # behind what was released or dropped: a late copy
            return False, []
        self._packets[seq] = packet
        if ahead >= self.capacity:  # the hole is far behind: the window moves on, and the hole is given up on
            self._move_to((seq - self.capacity // 2) % 2**16)
            if not self._need_keyframe:
                return self._give_up(now_ns)
        return False, self._release(now_ns)

    def _move_to(self, seq: int) -> None:
        """Release or drop nothing before ``seq`` any more. The packets before it are dropped."""
        self._next = seq
        for s in [s for s in self._packets if (s - seq) % 2**16 >= 2**15]:
            del self._packets[s]

    def expire(self, now_ns: int) -> tuple[bool, list]:
        """Past :attr:`deadline_ns`, drop the incomplete frames, or ask for the key frame again.

        Returns what :meth:`add` does. Before the deadline nothing changes."""
        deadline = self.deadline_ns
        if deadline is None or now_ns < deadline:
            return False, []
        return self._give_up(now_ns)

    def _give_up(self, now_ns: int) -> tuple[bool, list]:
        """Drop what waits before the next key frame after the hole. Ask for one when none is in."""
        if self._hole is not None:  # the frame with the hole (a key frame, too) can never be decoded
            self._move_to((self._hole + 1) % 2**16)
        self._need_keyframe = True
        frames = self._release(now_ns)
        if not self._need_keyframe:  # one was in already
            return False, frames
        self.keyframe_requests += 1
        self._waiting_since = now_ns  # asked again when it has not come by the next deadline
        return True, frames

    def _release(self, now_ns: int) -> list:
        from aiortc.jitterbuffer import JitterFrame

        if self._need_keyframe and not self._skip_to_keyframe():
            if self._waiting_since is None:
                self._waiting_since = now_ns
            return []
        frames = []
        while True:
            frame = self._complete_frame()
            if frame is None:
                break
            packets, self._next = frame
            frames.append(JitterFrame(data=b"".join(p._data for p in packets), timestamp=packets[0].timestamp))
        run = 0  # packets in from ``_next`` on without a gap; any beyond them came after a hole
        while (self._next + run) % 2**16 in self._packets:
            run += 1
        hole = (self._next + run) % 2**16 if len(self._packets) > run else None
        if hole != self._hole:  # each hole, once it is the oldest, is waited for up to max_wait_ms
            self._hole, self._waiting_since = hole, None if hole is None else now_ns
        return frames

    def _skip_to_keyframe(self) -> bool:
        """Drop the packets before the first key frame's first packet, and start there. False while none is in."""
        ahead = sorted((s - self._next) % 2**16 for s in self._packets)
        start = next((a for a in ahead if starts_h264_keyframe(self._packets[(self._next + a) % 2**16]._data)), None)
        if start is None:
            return False
        for a in ahead:
            if a < start:
                del self._packets[(self._next + a) % 2**16]
        self._next = (self._next + start) % 2**16
        self._need_keyframe, self._waiting_since, self._hole = False, None, None
        return True

    def _complete_frame(self) -> tuple[list, int] | None:
        """The packets of the frame at ``_next`` when all are in, and the sequence number after it. They are removed."""
        packets, seq = [], self._next
        while (packet := self._packets.get(seq)) is not None:
            if packets and packet.timestamp != packets[0].timestamp:
                break  # a new frame, though the last one had no marker: it ended at the packet before
            packets.append(packet)
            seq = (seq + 1) % 2**16
            if packet.marker:
                break
        else:
            return None  # a packet of this frame (or its last one) is not in yet
        for p in packets:
            del self._packets[p.sequence_number]
        return packets, seq


class _ReceiverVideoBuffer:
    """A :class:`VideoJitterBuffer` in place of an aiortc 1.x video receiver's jitter buffer.

    The frames it releases go straight into the receiver's decoder queue. The aiortc receiver takes one frame per
    packet. A
    timer gives up on a missing packet at its deadline. Each give-up sends a PLI. It reaches into the receiver's
    private state: ``__decoder_queue``, ``__timestamp_mapper``, ``__codecs``. Where that is missing it is not
    installed."""

    PRIVATE = ("decoder_queue", "timestamp_mapper", "codecs", "jitter_buffer")

    def __init__(self, receiver, max_wait_ms: float):
        self.receiver, self.buffer = receiver, VideoJitterBuffer(max_wait_ms)
        self._codec = self._ssrc = self._timer = None

    @classmethod
    def install(cls, receiver, max_wait_ms: float = MAX_WAIT_MS) -> _ReceiverVideoBuffer | None:
        if receiver is None or not all(hasattr(receiver, f"_RTCRtpReceiver__{n}") for n in cls.PRIVATE):
            return None
        receiver._RTCRtpReceiver__jitter_buffer = installed = cls(receiver, max_wait_ms)
        return installed

    def add(self, packet) -> tuple[bool, None]:
        """aiortc's call for each packet. Returns (send a PLI, no frame), since frames were queued here."""
        codec = self.receiver._RTCRtpReceiver__codecs.get(packet.payload_type)
        if codec is None or codec.name != "H264":  # only H.264 is understood here: aiortc's own buffer for others
            from aiortc.jitterbuffer import JitterBuffer

            self.receiver._RTCRtpReceiver__jitter_buffer = fallback = JitterBuffer(capacity=512, is_video=True)
            return fallback.add(packet)
        self._codec, self._ssrc = codec, packet.ssrc
        pli, frames = self.buffer.add(packet, time.monotonic_ns())
        self._decode(frames)
        return pli, None

    def _decode(self, frames: list) -> None:
        for frame in frames:
            frame.timestamp = self.receiver._RTCRtpReceiver__timestamp_mapper.map(frame.timestamp)
            self.receiver._RTCRtpReceiver__decoder_queue.put((self._codec, frame))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.buffer.deadline_ns
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, (deadline - time.monotonic_ns()) / 1e9), self._expire)

    def _expire(self) -> None:
        self._timer = None
        pli, frames = self.buffer.expire(time.monotonic_ns())
        self._decode(frames)
        if pli and self._ssrc is not None:
            asyncio.ensure_future(self.receiver._send_rtcp_pli(self._ssrc))


async def _drain(track, handle) -> None:
    from framegraph.apps.server.webrtc_media import track_frames

    async for frame in track_frames(track):
        handle(frame)


def _control_handler(receiver: _Receiver, tally: _Tally, ready_box: list[dict], got_ready: asyncio.Event,
                     ended: asyncio.Event):
    """The data channel's message handler.

    ``frame`` timings and the ``rtp`` anchor go to the receiver. ``ready`` goes into ``ready_box``. The rest goes
    to the tally. ``close`` and ``ended`` set ``ended``, as does an error before ``ready``."""
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


def _track_handler(pc, receiver: _Receiver, tasks: list, frames_ns: list | None, video_buffer: bool):
    """The peer connection's ``track`` handler.

    A task added to ``tasks`` drains each of the server's tracks into the receiver. When ``frames_ns`` is given,
    each video frame's receipt time is also appended to it."""
    def on_track(track):
        rtp_receiver = next((r for r in pc.getReceivers() if r.track is track), None)
        setattr(receiver, f"{track.kind}_receiver", rtp_receiver)
        if track.kind == "video" and video_buffer:
            _ReceiverVideoBuffer.install(rtp_receiver)
        def on_video(frame):
            now = time.monotonic_ns()
            if frames_ns is not None:
                frames_ns.append(now)
            receiver.on_video(frame, now)

        handle = on_video if track.kind == "video" else receiver.on_audio
        tasks.append(asyncio.ensure_future(_drain(track, handle)))

    return on_track


def _add_media(pc, channel, audio: np.ndarray | None, seconds: float | None) -> _Microphone | None:
    """Receive video. Send ``audio`` as a live microphone, or receive audio when there is none to send.

    The microphone's ``clock`` messages go on ``channel``. Returns the microphone, None without audio."""
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
    """The server's ``ready`` message, waited for 30 s at most.

    Raises :class:`ClientError` when none comes, or when the session failed before it."""
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
                                frames_ns: list | None = None, video_buffer: bool = True) -> dict:
    """One session over WebRTC. Returns the summary of :func:`..client.stream_session`, with ``transport``
    ``"webrtc"``.

    ``url`` is the server's WebSocket URL; the offer endpoint is found from it. It appends the receipt time of each
    decoded video frame to ``frames_ns``, when given, in monotonic ns. ``video_buffer`` picks the video's
    jitter buffer. True is :class:`VideoJitterBuffer`: each frame is decoded once its last packet is in. A lost
    packet is waited for ``MAX_WAIT_MS``. False is aiortc's own. It releases a frame a frame period later. It
    waits for a lost packet until 512 more came."""
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
    pc.on("track", _track_handler(pc, receiver, tasks, frames_ns, video_buffer))
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
    """``stop`` when the microphone has played the file, or after ``seconds``."""
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
