"""The media side of a WebRTC session.

It sends the session's encoded media as RTP tracks.
It feeds the client's tracks into the pipeline's inputs.
It maps RTP timestamps to the session clock.

Out, server → client, the graph's own encoders are used, and aiortc only packetizes:

- **video**: the pipeline runs with ``codec: "h264"``.
  Each Annex-B access unit becomes an ``av.Packet`` whose pts is the frame's session pts, in 48 kHz ticks.
  Then aiortc converts it to the 90 kHz RTP clock.
  A picture-loss indication from the browser asks the graph's encoder for a key frame.
  A peer that offers VP8 but no H.264 gets the frames re-encoded as VP8 by aiortc.
  Then aiortc also follows the receiver's bitrate estimate.
- **audio**: each 20 ms PCM16 chunk at 16 kHz is Opus-encoded here into a packet.
  The encoder is libopus at 16 kHz mono, a valid Opus stream on the 48 kHz RTP clock.
  The packet's pts is the session pts of the sound it holds.
  That is the chunk's pts, less the encoder's 6.5 ms look-ahead.
  Opus's RTP clock runs at 48 000 ticks a second.
  So audio and video RTP timestamps are the session clock, plus each stream's random RTP origin.
  The browser lines them up through the RTCP sender reports, as the MP4 muxer does by pts.

In, client → server:

- The microphone track is resampled to 16 kHz mono PCM16 and pushed into ``Pipeline.audio_in``.
- A camera track is pushed picture by picture through ``Pipeline.video_in``.
  This is ``generate`` with ``input: "camera"``.
  Pictures are scaled to the session size, with the rate limit of camera pictures over the WebSocket.
"""
from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from .outbox import Item
from .protocol import AUDIO_SAMPLE_RATE, ProtocolError

log = logging.getLogger("framegraph.server.webrtc")

TICKS = fractions.Fraction(1, 48_000)  # the session clock: 48 000 ticks a second
RTP_VIDEO_HZ = 90_000
RTP_AUDIO_HZ = 48_000


def to_rtp(ticks: int, hz: int) -> int:
    """Session ticks at 48 kHz → units of an RTP clock of ``hz``, as aiortc converts them."""
    return int(ticks * hz // 48_000)


def rtp_origin(sender, last_timestamp: int | None) -> int | None:
    """The random origin aiortc added to ``sender``'s RTP timestamps. None until a packet went out.

    It comes from the timestamp of the last packet sent and ``last_timestamp``, what we gave it in RTP units.
    It is private in aiortc: ``_RTCRtpSender__rtp_timestamp``, aiortc 1.x.
    Without it no ``frame`` timing messages are sent. Nothing else changes.
    """
    sent = getattr(sender, "_RTCRtpSender__rtp_timestamp", None)
    if sender is None or sent is None or last_timestamp is None:
        return None
    return (sent - last_timestamp) % 2**32


SCTP_RTO_INITIAL_S = 1.0  # RFC 9260's RTO.Initial; aiortc keeps RFC 4960's 3 s


def survive_loss(pc) -> None:
    """Two things aiortc 1.x lacks on a lossy link.

    It is called once the peer connection's descriptions are set.
    Its DTLS role and SCTP transport are then known, and the handshake has not begun.
    Both fixes reach into aiortc's private state.
    That is ``RTCSctpTransport._rto`` and ``RTCIceTransport._send`` / ``_recv``.
    Where that is missing, nothing changes.

    - The data channel's SCTP retransmits a lost packet after 1 s, per RFC 9260, instead of 3 s.
      This holds until it has measured the round trip.
      A lost INIT or COOKIE-ECHO would otherwise hold the session's ``ready``, and so all its media.
    - As the DTLS server, it sends the last handshake flight again whenever the peer's last flight comes again.
      This is RFC 6347 4.2.4. OpenSSL does not do it.
      Without it, a lost last flight means the peer's handshake never finishes.
    """
    sctp = getattr(pc, "sctp", None)
    if sctp is not None and getattr(sctp, "_rto", 0) > SCTP_RTO_INITIAL_S:
        sctp._rto = SCTP_RTO_INITIAL_S
    transports = {t.receiver.transport for t in pc.getTransceivers()} | ({sctp.transport} if sctp else set())
    for dtls in transports:
        if getattr(dtls, "_role", None) == "server" and hasattr(dtls.transport, "_send"):
            _resend_last_flight(dtls)


def _resend_last_flight(dtls) -> None:
    ice = dtls.transport
    send, recv = ice._send, ice._recv
    flight: list[bytes] = []  # what we sent since the peer's last handshake datagram
    state = {"peer_spoke": True}

    async def sending(data: bytes) -> None:
        if dtls.state != "connected":
            if state["peer_spoke"]:
                flight.clear()
                state["peer_spoke"] = False
            flight.append(bytes(data))
        await send(data)

    async def receiving() -> bytes:
        data = await recv()
        if dtls.state != "connected":
            state["peer_spoke"] = True
        elif data[:1] == b"\x16" and flight:  # a handshake record once we are done: the peer lost our last flight
            for datagram in flight:
                await send(datagram)
        return data

    ice._send, ice._recv = sending, receiving


def watch_datagrams(pc, heard: Callable[[], None]) -> bool:
    """Call ``heard()`` for each datagram the peer of ``pc`` sends, as it comes off the socket.

    Any datagram counts: STUN, DTLS, RTP, RTCP, SCTP.
    That is what a live peer sends, whether or not the server's own media flow.
    It reaches into aioice's connection: ``RTCIceTransport._connection``, aiortc 1.x.
    It wraps that connection's ``data_received`` and ``request_received``.
    Returns False where they are missing. Nothing is then watched.
    """
    sctp = getattr(pc, "sctp", None)
    transports = {t.receiver.transport for t in pc.getTransceivers()} | ({sctp.transport} if sctp else set())
    connections = {getattr(dtls.transport, "_connection", None) for dtls in transports} - {None}
    names = ("data_received", "request_received")
    if not connections or not all(hasattr(c, name) for c in connections for name in names):
        return False
    for connection in connections:
        for name in names:
            setattr(connection, name, _stamping(getattr(connection, name), heard))
    return True


def _stamping(original: Callable, heard: Callable[[], None]) -> Callable:
    def received(*args):
        heard()
        return original(*args)
    return received


async def ask_peer(pc) -> None:
    """Send the peer an SCTP HEARTBEAT, RFC 9260 8.3. A live peer must answer it.

    So a quiet peer then says something.
    It uses aiortc 1.x's private ``RTCSctpTransport._send_chunk``. Where missing, nothing is sent.
    A connection that is going away is not an error here. The watchdog sees it.
    """
    from aiortc.rtcsctptransport import HeartbeatChunk

    sctp = getattr(pc, "sctp", None)
    established = sctp is not None and getattr(sctp, "_association_state", None) == sctp.State.ESTABLISHED
    if not established or not hasattr(sctp, "_send_chunk"):
        return
    chunk = HeartbeatChunk()
    chunk.params = [(1, time.monotonic_ns().to_bytes(8, "big"))]  # Heartbeat Info, echoed back
    try:
        await sctp._send_chunk(chunk)
    except (ConnectionError, OSError) as exc:
        log.debug("webrtc: heartbeat not sent (%s)", exc)


class OpusJitterBuffer:
    """The client's microphone packets, for aiortc's receiver.

    The receiver calls ``add(packet) → (pli, frame)``, with one frame per packet.
    Each Opus packet is a frame of its own.
    While packets come in order, each is released as it arrives.
    A jittery link may reorder, so a packet comes after a later one.
    From then on one packet is held back, so a packet overtaken by the next still fits in.
    A packet later than that is lost. So is a gap that does not fill.
    The pipeline's input goes on without it.
    """

    def __init__(self, capacity: int = 16):
        self.capacity = capacity
        self.hold = 0  # packets held back: 0 until one arrives out of order, then 1
        self._next: int | None = None  # the sequence number due next
        self._held: dict[int, object] = {}

    def add(self, packet):
        from aiortc.jitterbuffer import JitterFrame

        seq = packet.sequence_number
        if self._next is None:
            self._next = seq
        if 0 < (self._next - seq) % 2**16 < 2**15:  # behind what was released: too late
            self.hold = 1
            return False, None
        self._held[seq] = packet
        if len(self._held) <= self.hold and len(self._held) < self.capacity:
            return False, None
        if self._next not in self._held:  # a gap that did not fill in time: lost
            self._next = min(self._held, key=lambda s: (s - self._next) % 2**16)
        out = self._held.pop(self._next)
        self._next = (self._next + 1) % 2**16
        return False, JitterFrame(data=out._data, timestamp=out.timestamp)


def received_rtp(receiver, pts: int) -> int | None:
    """The RTP timestamp of a frame an aiortc ``receiver`` decoded with ``pts``. None when not known.

    The receiver counts received timestamps from the first one it saw.
    That origin is private: ``TimestampMapper._origin``, aiortc 1.x.
    """
    mapper = getattr(receiver, "_RTCRtpReceiver__timestamp_mapper", None)
    origin = getattr(mapper, "_origin", None)
    return None if origin is None or pts is None else (pts + origin) % 2**32


class _Handoff(MediaStreamTrack):
    """A track fed one item at a time by the session's sender.

    ``await put(item)`` returns once aiortc took the previous one.
    The outbox in front of it does the bounding and dropping.
    """

    def __init__(self):
        super().__init__()
        self._queue: asyncio.Queue[Item] = asyncio.Queue(maxsize=1)
        self.sender = None  # the RTCRtpSender, set once the answer is made

    async def put(self, item: Item) -> None:
        await self._queue.put(item)

    async def next_item(self) -> Item:
        if self.readyState != "live":
            raise MediaStreamError
        return await self._queue.get()


class VideoOut(_Handoff):
    """The session's H.264 frames as RTP.

    With ``passthrough``, packets go as they are: the peer takes H.264.
    Otherwise they are decoded to pictures for aiortc's VP8 encoder.
    ``on_frame(item, rtp_timestamp)`` is called for each frame once its RTP timestamp is known.
    It sends the ``frame`` timing message.
    """

    kind = "video"

    def __init__(self, on_frame: Callable[[Item, int], None], request_keyframe: Callable[[], None] | None = None):
        super().__init__()
        self.passthrough = True
        self.on_frame = on_frame
        self.request_keyframe = request_keyframe
        self._keyed = False  # a key frame went out: later frames can be decoded
        self._decoder = None
        self._origin: int | None = None
        self._last: tuple[Item, int] | None = None  # the last frame handed out, before its origin was known

    async def recv(self):
        if self._origin is None and self._last is not None:
            self._origin = rtp_origin(self.sender, self._last[1])
            if self._origin is not None:
                self.on_frame(self._last[0], (self._origin + self._last[1]) % 2**32)
        item = await self.next_item()
        while not self._keyed and not item.keyframe:
            # the graph started at the answer, before the peer connected: its first key frame may be gone, and the
            # frames that refer to it cannot be decoded (for up to a GOP). They are skipped until a new one comes.
            if self.request_keyframe is not None:
                self.request_keyframe()
                self.request_keyframe = None  # asked once
            item = await self.next_item()
        self._keyed = True
        ts = to_rtp(item.header.pts, RTP_VIDEO_HZ)
        if self._origin is not None:
            self.on_frame(item, (self._origin + ts) % 2**32)
        else:
            self._last = (item, ts)
        if self.passthrough:
            packet = av.Packet(item.payload)
            packet.pts = packet.dts = item.header.pts
            packet.time_base = TICKS
            return packet
        if self._decoder is None:
            self._decoder = av.CodecContext.create("h264", "r")
        frames = self._decoder.decode(av.Packet(item.payload))
        if not frames:  # waiting for a key frame: nothing to show yet
            return await self.recv()
        frame = frames[-1]
        frame.pts, frame.time_base = item.header.pts, TICKS
        return frame


class OpusPackets:
    """PCM16 chunks → Opus packets stamped with the pts of the sound they hold.

    The chunks are 16 kHz mono, 20 ms each.
    The encoder is libopus at 16 kHz mono, a valid stream on Opus's 48 kHz RTP clock.
    The pts is in 48 kHz ticks. The caller gives each chunk's pts.
    A packet holds sound from the encoder's look-ahead before its chunk on.
    Then aiortc only packetizes the packets.
    So the RTP timestamps are those pts, plus the stream's random origin.
    """

    def __init__(self, bitrate: int = 32_000):
        self._codec = av.CodecContext.create("libopus", "w")
        self._codec.sample_rate = AUDIO_SAMPLE_RATE
        self._codec.layout = "mono"
        self._codec.format = "s16"
        self._codec.bit_rate = bitrate
        self._codec.time_base = fractions.Fraction(1, AUDIO_SAMPLE_RATE)
        self._codec.options = {"application": "voip", "frame_duration": "20"}
        self._samples = 0

    def encode(self, pcm: bytes, pts: int):
        """One 20 ms chunk at session pts ``pts`` → its packet.

        The chunk is 640 bytes of ``<i2``.
        Returns None while the encoder fills up.
        """
        samples = np.frombuffer(pcm, "<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate, frame.pts = AUDIO_SAMPLE_RATE, self._samples
        self._samples += samples.shape[1]
        packets = self._codec.encode(frame)
        if not packets:
            return None
        packet = packets[-1]  # one 20 ms chunk in, one packet out
        # it holds the sound from Opus's look-ahead (6.5 ms) before this chunk on: stamped with that sound's pts
        lookahead_ticks = (frame.pts - packet.pts) * (48_000 // AUDIO_SAMPLE_RATE)
        packet.pts = packet.dts = pts - lookahead_ticks
        packet.time_base = TICKS
        return packet


class AudioOut(_Handoff):
    """The session's PCM16 chunks, 16 kHz mono, as Opus packets stamped with their session pts.

    ``on_anchor(pts, rtp_timestamp)`` is called once the RTP timestamp of a packet is known.
    It is called again until it returns True, meaning sent.
    """

    kind = "audio"

    def __init__(self, on_anchor: Callable[[int, int], bool]):
        super().__init__()
        self.on_anchor = on_anchor
        self._opus = OpusPackets()
        self._last_pts: int | None = None

    async def recv(self):
        if self.on_anchor is not None and self._last_pts is not None:
            origin = rtp_origin(self.sender, self._last_pts)
            if origin is not None and self.on_anchor(self._last_pts, (origin + self._last_pts) % 2**32):
                self.on_anchor = None  # sent (the data channel was open)
        while True:
            item = await self.next_item()
            packet = self._opus.encode(item.payload, item.header.pts)
            if packet is not None:
                self._last_pts = packet.pts
                return packet


class ClientClock:
    """Capture times of the client's microphone, from its ``clock`` messages.

    ``{"rtp_timestamp": R, "capture_ns": C}`` says when one sample was captured.
    It is the sample the client's audio track stamped ``R``, captured at ``C`` ns on the client's clock.
    ``R`` is in 48 kHz RTP units, its random origin included.
    Later samples are placed at the sample rate from the newest such anchor.
    This works within ±2³¹ units, since RTP timestamps wrap.
    """

    def __init__(self):
        self.anchor: tuple[int, int] | None = None

    def update(self, rtp_timestamp, capture_ns) -> None:
        if isinstance(rtp_timestamp, int) and isinstance(capture_ns, int) and not isinstance(capture_ns, bool):
            self.anchor = (rtp_timestamp % 2**32, capture_ns)

    def capture_ns(self, rtp_timestamp: int) -> int:
        """Client capture ns of the sample stamped ``rtp_timestamp``. 0 when no anchor came: unknown."""
        if self.anchor is None:
            return 0
        r, c = self.anchor
        delta = (rtp_timestamp - r + 2**31) % 2**32 - 2**31
        return int(c + delta * 1e9 / RTP_AUDIO_HZ)


async def track_frames(track):
    """The frames an aiortc ``track`` receives, until it ends.

    It ends on ``MediaStreamError``: the peer stopped the track or went away.
    """
    while True:
        try:
            yield await track.recv()
        except MediaStreamError:
            return


async def pump_microphone(track, receiver, pipeline, capture_times, clock: ClientClock, counters: dict) -> None:
    """The client's audio track → ``pipeline.audio_in`` as 16 kHz mono PCM16.

    Each block's client capture time is recorded, when the client sends ``clock``.
    Returns when the track ends.
    """
    resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_SAMPLE_RATE)
    async for frame in track_frames(track):
        rtp = received_rtp(receiver, frame.pts)
        captured = 0 if rtp is None else clock.capture_ns(rtp + frame.samples * RTP_AUDIO_HZ // frame.sample_rate - 1)
        for out in resampler.resample(frame):
            pcm = out.to_ndarray().astype("<i2", copy=False).tobytes()
            n = pipeline.audio_in.push(pcm)
            capture_times.add(n, captured)
            counters["audio_samples_in"] += n


async def pump_camera(track, pipeline, counters: dict) -> None:
    """The client's camera track → ``pipeline.video_in`` as pictures.

    At most ``max_fps`` pictures go in. The rest are skipped here, not refused.
    They are scaled to the session size, as camera pictures over the WebSocket are.
    """
    video_in, last = pipeline.video_in, 0.0
    async for frame in track_frames(track):
        now = time.monotonic()
        if now - last < 0.97 / video_in.max_fps:  # a little over max_fps: frames arrive with jitter
            continue
        last = now
        try:
            pushed = video_in.push_picture(frame.to_ndarray(format="rgb24"))
        except ProtocolError as exc:
            log.debug("camera picture refused: %s", exc)
            pushed = False
        counters["video_in" if pushed else "video_dropped"] += 1
