"""``POST /webrtc/offer``: a session over WebRTC with aiortc, beside the WebSocket one.

The client posts JSON ``{"sdp": OFFER, "type": "offer", "pipeline": NAME, "options": {...}}``.
It gets ``{"sdp": ANSWER, "type": "answer", "session": ID}``.

Before anything is built, the request passes the checks of a WebSocket start.
They are the token, Origin, Host, ``--max-sessions`` and a cluster ticket: :func:`.http.admission`.
Then the offer is checked. It needs a data channel and a video section that can receive.
The pipeline is built with the same validation as ``start``.
Refusals are HTTP errors. Their JSON body is the protocol's ``error`` message,
``{"type": "error", "code", "message"}``:

- 400: ``bad_offer``, ``bad_option``, ``bad_json``, ``bad_message``.
- 404: ``unknown_pipeline``.
- 413: ``too_large``.
- 429: ``rate_limited``.
- 401, 403 and 503: as for a WebSocket.

Then the session is an ordinary :class:`~.session.Session` over a :class:`WebRtcTransport`.
Its control messages go over the data channel unchanged: ``ready`` first, ``stats``, ``config``, ``ended``, errors.
Its media go over RTP tracks, :mod:`.webrtc_media`.
Some messages exist only here:

- The server sends ``{"type": "frame", ...}`` for each video frame.
  It holds the frame's RTP timestamp and the media header's timings.
  So a client can measure glass-to-glass as over the WebSocket.
- The server sends ``{"type": "close", "code", "reason"}`` before it closes the peer connection.
- A client may send ``{"type": "clock", "rtp_timestamp", "capture_ns"}``.
  It gives its microphone's capture times.

A peer is gone when it does not connect within ``webrtc_connect_timeout_s``.
It is also gone when, once connected, it sends nothing at all for ``webrtc_peer_timeout_s``.
Nothing means no datagram of any kind. A quiet peer is sent an SCTP heartbeat.
The session then ends as on a WebSocket disconnect.
A slow session, with its frames late, is not gone.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from websockets.datastructures import MultipleValuesError

from . import http, pipelines
from .config import ice_servers
from .http import admission, busy, response, token_ok
from .outbox import VIDEO, Item
from .protocol import ErrorCode, ProtocolError
from .session import Session
from .transport import TransportClosed

if TYPE_CHECKING:  # pragma: no cover
    from .app import StreamServer

log = logging.getLogger("framegraph.server.webrtc")

OFFER_PATH = "/webrtc/offer"
CONFIG_PATH = "/webrtc/config"
MAX_OFFER_BYTES = 64 * 1024  # an offer with every codec and a few hundred candidates is under 16 KiB
INBOX = 64  # data-channel messages waiting for the session's receiver; more are dropped (counted)
_STATUS = {ErrorCode.UNKNOWN_PIPELINE: 404, ErrorCode.TOO_LARGE: 413, ErrorCode.RATE_LIMITED: 429,
           ErrorCode.INTERNAL: 500, ErrorCode.PIPELINE_FAILED: 500, ErrorCode.FULL: 503}


def offer_url(ws_url: str) -> str:
    """The offer endpoint of the server at ``ws_url``. Its query, such as a token or a cluster ticket, is kept."""
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, OFFER_PATH, parts.query, ""))


def process_request(server: StreamServer, connection, request):
    """The server's HTTP hook.

    It answers ``POST /webrtc/offer`` with a coroutine, :func:`handle_offer`, and ``GET /webrtc/config``.
    Everything else is :func:`.http.process_request`'s.
    """
    path = urlsplit(request.path).path
    if getattr(request, "method", "GET") == "POST":
        if path != OFFER_PATH:
            return response(404, f"nothing to POST at {path}; WebRTC offers go to {OFFER_PATH}\n")
        return _offer_or_400(server, request)
    if path == CONFIG_PATH and "websocket" not in request.headers.get("Upgrade", "").lower():
        try:
            if not token_ok(server.config.token, request):
                return response(401, "missing or wrong token\n",
                                extra={"WWW-Authenticate": 'Bearer realm="framegraph"'})
        except MultipleValuesError as exc:
            return response(400, f"header {exc} given more than once\n")
        return response(200, json.dumps({"ice_servers": ice_servers(server.config.ice_servers)}), "application/json")
    return http.process_request(server, connection, request)


async def _offer_or_400(server: StreamServer, request):
    try:
        return await handle_offer(server, request)
    except MultipleValuesError as exc:
        return response(400, f"header {exc} given more than once\n")


def refusal(code: ErrorCode | str, message: str, status: int | None = None, retry_after_s: float | None = None):
    """An HTTP refusal whose body is the protocol's ``error`` message.

    With ``retry_after_s`` the body has that field, and the response a ``Retry-After`` header.
    """
    status = status or _STATUS.get(code, 400)
    body = ProtocolError(code, message, retry_after_s).to_message()
    extra = None if retry_after_s is None else {"Retry-After": str(max(1, round(retry_after_s)))}
    return response(status, json.dumps(body), "application/json", extra=extra)


def check_offer(body: dict) -> tuple[str, set[str]]:
    """The SDP of a posted offer, checked.

    It must parse and have a data channel, ``m=application``.
    It must have a video section the client can receive on.
    Each section must have what JSEP requires to connect.
    That is ICE credentials, a DTLS role and a fingerprint aiortc can check.
    Returns the SDP and the kinds the client can receive, ``{"video", "audio"}``.
    Raises ``ProtocolError`` with ``bad_offer``, naming what is wrong.
    """
    from aiortc.rtcdtlstransport import X509_DIGEST_ALGORITHMS
    from aiortc.sdp import SessionDescription

    sdp = body.get("sdp")
    if body.get("type", "offer") != "offer" or not isinstance(sdp, str) or not sdp.strip():
        raise ProtocolError(ErrorCode.BAD_OFFER, f'expected {{"type": "offer", "sdp": "v=0..."}}; got type '
                                         f"{body.get('type')!r} and sdp {str(sdp)[:40]!r}")
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the offer's fault
        raise ProtocolError(ErrorCode.BAD_OFFER, f"the offer's SDP does not parse ({type(exc).__name__}: "
                                         f"{str(exc)[:120]})") from None
    kinds = [m.kind for m in parsed.media]
    for m in parsed.media:
        if m.ice is None or not m.ice.usernameFragment or not m.ice.password:
            raise ProtocolError(ErrorCode.BAD_OFFER, f"the offer's {m.kind} section has no ICE credentials "
                                                     f"(a=ice-ufrag and a=ice-pwd)")
        if m.dtls is None:  # aiortc drops the DTLS parameters of a section without a=setup
            raise ProtocolError(ErrorCode.BAD_OFFER, f"the offer's {m.kind} section has no DTLS role (a=setup)")
        algorithms = [f.algorithm.lower() for f in m.dtls.fingerprints]
        if not set(algorithms) & set(X509_DIGEST_ALGORITHMS):
            raise ProtocolError(ErrorCode.BAD_OFFER, f"the offer's {m.kind} section has no DTLS fingerprint "
                                                     f"(a=fingerprint) of {', '.join(X509_DIGEST_ALGORITHMS)}; got "
                                                     f"{algorithms or 'none'}: JSEP requires one")
    if "application" not in kinds:
        raise ProtocolError(ErrorCode.BAD_OFFER, f"the offer has no data channel (m=application; it has {kinds}): "
                                         f"control messages travel on one")
    receives = {m.kind for m in parsed.media if m.direction in ("recvonly", "sendrecv")}
    if "video" not in receives:
        raise ProtocolError(ErrorCode.BAD_OFFER, f"the offer has no video section to receive on (m=video, recvonly or "
                                         f"sendrecv; it has {kinds})")
    return sdp, receives


async def handle_offer(server: StreamServer, request) -> object:
    """``POST /webrtc/offer`` → the answer. See the module docstring. Every refusal is an HTTP error."""
    refused = admission(server, request)
    if refused is not None:
        return refused
    if not server.config.webrtc:
        return refusal(ErrorCode.UNSUPPORTED, "WebRTC is off on this server (framegraph serve --no-webrtc); use the "
                                              "WebSocket", 501)
    try:
        import aiortc  # noqa: F401
    except ImportError:
        return refusal(ErrorCode.UNSUPPORTED, "this server has no WebRTC: pip install 'framegraph[webrtc]' (aiortc); "
                                              "use the WebSocket", 501)
    if getattr(request, "too_large", False) or len(request.body) > MAX_OFFER_BYTES:
        server.count_rejected("webrtc_offer")
        return refusal(ErrorCode.TOO_LARGE, f"offer body over {MAX_OFFER_BYTES} bytes")
    if getattr(request, "bad_framing", None):
        server.count_rejected("webrtc_offer")
        return refusal(ErrorCode.BAD_MESSAGE, request.bad_framing)
    if not server.offer_bucket(getattr(request, "peer", None)).take():
        server.count_rejected("webrtc_rate")
        return refusal(ErrorCode.RATE_LIMITED, f"more than {server.config.webrtc_offers_per_s:g} offers a second; "
                                               f"retry shortly")
    try:
        body = json.loads(request.body)
        if not isinstance(body, dict):
            raise ProtocolError(ErrorCode.BAD_JSON, f"the offer body is JSON but not an object: got "
                                                    f"{type(body).__name__} {request.body[:40]!r}")
        name = body.get("pipeline")
        if not isinstance(name, str) or not isinstance(body.get("options", {}), dict):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f'the offer needs "pipeline" (a string) and "options" (an '
                                                       f"object, optional); got pipeline {name!r}")
        sdp, receives = check_offer(body)
        options = dict(body.get("options") or {})
        if options.setdefault("codec", "h264") != "h264":
            raise ProtocolError(ErrorCode.BAD_OPTION, f"option 'codec' = {options['codec']!r}; over WebRTC the "
                                                      f"video codec is negotiated in the SDP (H.264 or VP8)")
        pipeline = pipelines.build(name, options, server.config.batching)
    except ValueError as exc:  # json
        server.count_rejected("webrtc_offer")
        return refusal(ErrorCode.BAD_JSON, f"the offer body is not JSON ({exc})")
    except ProtocolError as exc:
        server.count_rejected("full" if exc.code == ErrorCode.FULL else "webrtc_offer")
        url = await server.elsewhere(request) if exc.code == ErrorCode.FULL else None
        if url is not None:  # a cluster's other replica has room: the client posts the offer there
            return response(307, "full here; placed on another replica\n", extra={"Location": offer_url(url)})
        return refusal(exc.code, exc.message, retry_after_s=exc.retry_after_s)
    return await _answer(server, request, name, pipeline, sdp, "audio" in receives)


async def _answer(server: StreamServer, request, name: str, pipeline, sdp: str, audio_out: bool):
    """The peer connection for a built pipeline.

    It adds tracks by what the pipeline sends and takes, makes the answer and starts the session.
    The session's slot is taken now and freed when it ends.
    """
    from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

    from .webrtc_media import survive_loss, watch_datagrams

    ice = [RTCIceServer(**s) for s in ice_servers(server.config.ice_servers)]
    pc = RTCPeerConnection(RTCConfiguration(iceServers=ice or None))
    transport = WebRtcTransport(server, pc, request)
    try:
        transport.add_tracks(pipeline, audio_out)  # before the offer: its sections then take our tracks and codec order
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        survive_loss(pc)
        transport.watched = watch_datagrams(pc, transport.heard)
    except Exception as exc:  # noqa: BLE001 - aiortc refuses offers it cannot answer with ValueError and others
        await pc.close()
        pipeline.graph.cancel()
        pipeline.closed()  # never started
        server.count_rejected("webrtc_offer")
        return refusal(ErrorCode.BAD_OFFER, f"cannot answer this offer ({type(exc).__name__}: {str(exc)[:160]})")
    transport.pick_codec()
    session = server.open_session(transport)
    if session is None:  # the slot went to another offer or connection meanwhile: full, as at admission
        await pc.close()
        pipeline.graph.cancel()
        pipeline.closed()  # never started
        return busy(server)
    transport.session = session
    server.keep(asyncio.create_task(_run(server, session, name, pipeline), name=f"webrtc session {session.id}"))
    return response(200, json.dumps({"type": "answer", "sdp": pc.localDescription.sdp, "session": session.id}),
                    "application/json")


async def _run(server: StreamServer, session: Session, name: str, pipeline) -> None:
    try:
        await session.launch(name, pipeline)
        session.transport.start_inputs(pipeline, session)
        await session.run()
    finally:
        server.release(session)
        await session.transport.shut()
        log.info("webrtc session %s closed (%s)", session.id, session.end_reason)


class WebRtcTransport:
    """A peer connection as a session's :class:`~.transport.Transport`.

    Control goes on the data channel and media on RTP tracks.
    The peer's liveness is watched: ICE that does not connect, a peer gone silent.
    """

    def __init__(self, server: StreamServer, pc, request):
        from .webrtc_media import ClientClock

        self.server, self.pc, self.request = server, pc, request
        self.config = server.config
        self.close_timeout = server.config.close_timeout_s
        self.remote_address = request.headers.get("X-Forwarded-For") or "webrtc"
        self.session: Session | None = None
        self.channel = None
        self.video = self.audio = None
        self.clock = ClientClock()
        self.codec = None
        self.dropped_in = 0  # data-channel messages dropped: the session's inbox was full
        self._inbox: collections.deque = collections.deque()
        self._arrived = asyncio.Event()
        self._open = asyncio.Event()
        self._closed = asyncio.Event()
        self._heard = time.monotonic()
        self.watched = False  # every datagram from the peer is seen (else its silence is not judged)
        self._tasks: list[asyncio.Task] = []
        self._closing: asyncio.Future | None = None
        self._remote: list = []  # the client's tracks (its microphone, its camera)
        pc.on("datachannel", self._on_channel)
        pc.on("connectionstatechange", self._on_state)

    # ---- set-up ---------------------------------------------------------------------------------
    def add_tracks(self, pipeline, audio_out: bool) -> None:
        """Add the tracks.

        Video goes out always.
        Audio goes out when the pipeline sends audio and the offer can receive it.
        The client's audio and camera tracks are received when it sends them and the pipeline takes them.
        """
        from aiortc import RTCRtpSender

        from .webrtc_media import AudioOut, VideoOut

        self.pipeline = pipeline
        encoder = pipeline.encoder
        request_keyframe = getattr(encoder, "request_keyframe", None)
        self.video = VideoOut(self._frame_timing, request_keyframe)
        video_sender = self.pc.addTrack(self.video)
        codecs = RTCRtpSender.getCapabilities("video").codecs  # H.264 first: passed through, not re-encoded
        transceiver = next(t for t in self.pc.getTransceivers() if t.sender == video_sender)
        transceiver.setCodecPreferences(sorted(codecs, key=lambda c: c.mimeType.lower() != "video/h264"))
        self.video.sender = video_sender
        if request_keyframe is not None:
            video_sender._send_keyframe = request_keyframe  # PLI from the peer → a key frame now
        if audio_out and pipeline.format.get("audio_out"):
            self.audio = AudioOut(self._audio_anchor)
            self.audio.sender = self.pc.addTrack(self.audio)
        self.pc.on("track", self._on_track)

    def pick_codec(self) -> None:
        """Read the negotiated video codec from the answer. H.264 is passed through, VP8 is re-encoded."""
        from aiortc.sdp import SessionDescription

        answer = SessionDescription.parse(self.pc.localDescription.sdp)
        video = next(m for m in answer.media if m.kind == "video")
        self.codec = video.rtp.codecs[0].mimeType.lower() if video.rtp.codecs else None
        self.video.passthrough = self.codec == "video/h264"

    def start_inputs(self, pipeline, session: Session) -> None:
        """Once the graph runs: read the client's tracks into the pipeline's inputs, and watch the peer."""
        from .webrtc_media import pump_camera, pump_microphone

        self._tasks.append(asyncio.create_task(self._watch(), name=f"webrtc {session.id} watchdog"))
        for track in self._remote:
            if track.kind == "audio" and pipeline.audio_in is not None:
                receiver = next((r for r in self.pc.getReceivers() if r.track is track), None)
                coro = pump_microphone(track, receiver, pipeline, session.capture_times, self.clock, session.counters)
            elif track.kind == "video" and pipeline.video_in is not None:
                coro = pump_camera(track, pipeline, session.counters)
            else:
                continue  # a track this pipeline does not take: not read (aiortc drops its packets)
            self._tasks.append(asyncio.create_task(coro, name=f"webrtc {session.id} {track.kind} in"))

    def _on_track(self, track) -> None:
        from .webrtc_media import OpusJitterBuffer

        self._remote.append(track)
        receiver = next((r for r in self.pc.getReceivers() if r.track is track), None)
        if track.kind == "audio" and hasattr(receiver, "_RTCRtpReceiver__jitter_buffer"):
            # aiortc holds 4 packets (80 ms) before it decodes any, and each until the next comes; the pipeline's
            # own input buffer smooths arrival, so each is decoded as it comes (aiortc 1.x: private)
            receiver._RTCRtpReceiver__jitter_buffer = OpusJitterBuffer()

    def _on_channel(self, channel) -> None:
        if self.channel is not None:
            return  # one data channel per session: the first one
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", self._closed.set)
        if channel.readyState == "open":  # aiortc hands a negotiated channel over open
            self._open.set()
        else:
            channel.on("open", self._open.set)

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self._heard = time.monotonic()
        if self.pc.connectionState in ("failed", "closed"):
            self._closed.set()
            self._arrived.set()

    def heard(self) -> None:
        """The peer sent something: any datagram."""
        self._heard = time.monotonic()

    def _on_message(self, message) -> None:
        self.heard()
        limit = self.config.max_message_bytes
        if len(message) > 4 * limit:  # as the WebSocket closes with 1009: nothing this big is read
            log.warning("webrtc session: %d-byte data channel message; closing", len(message))
            self.abort()
            return
        if isinstance(message, str) and '"clock"' in message[:32]:  # WebRTC only: not a session message
            try:
                m = json.loads(message)
            except ValueError:
                m = None
            if isinstance(m, dict) and m.get("type") == "clock":
                self.clock.update(m.get("rtp_timestamp"), m.get("capture_ns"))
                return
        if len(self._inbox) >= INBOX:
            self.dropped_in += 1
            return
        self._inbox.append(message)
        self._arrived.set()

    # ---- the Transport ----------------------------------------------------------------------------
    async def recv(self) -> str | bytes:
        while not self._inbox:
            if self._closed.is_set():
                raise TransportClosed("peer connection closed")
            self._arrived.clear()
            await self._arrived.wait()
        return self._inbox.popleft()

    async def _until_open(self) -> None:
        if self._open.is_set() and self.channel is not None and self.channel.readyState == "open":
            return
        if self._closed.is_set():
            raise TransportClosed("peer connection closed")
        waiters = [asyncio.ensure_future(self._open.wait()), asyncio.ensure_future(self._closed.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if self._closed.is_set() or self.channel is None or self.channel.readyState != "open":
            raise TransportClosed("peer connection closed")

    async def send_text(self, text: str) -> None:
        await self._until_open()
        self.channel.send(text)

    async def send_media(self, item: Item) -> int:
        track = self.video if item.kind == VIDEO else self.audio
        if track is None:
            return 0
        put = asyncio.ensure_future(track.put(item))
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait([put, closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not put.done():
            put.cancel()
            raise TransportClosed("peer connection closed")
        return len(item.payload)

    async def close(self, code: int, reason: str) -> None:
        """The ``close`` message, then the client's side of the close.

        The client closes its peer connection once it has everything before it.
        Over a lossy link the last messages may still be on their way. Closing at once would lose them.
        The session's close timeout bounds the wait, as for a WebSocket's close frame.
        """
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(json.dumps({"type": "close", "code": code, "reason": reason}))
            await self._closed.wait()
        await self.shut()

    def abort(self) -> None:
        self._closed.set()
        self._arrived.set()
        asyncio.ensure_future(self.shut())

    async def shut(self) -> None:
        """Close the peer connection and stop the input and watchdog tasks. Idempotent.

        The close runs as its own task and is never cancelled half-way.
        A second aiortc close would then wait for ever.
        """
        self._closed.set()
        self._arrived.set()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.pc.close())
        await asyncio.shield(self._closing)

    # ---- timing and liveness ----------------------------------------------------------------------
    def _frame_timing(self, item: Item, rtp_timestamp: int) -> None:
        """The ``frame`` message: what the WebSocket's media header says about this video frame.

        It is keyed by the RTP timestamp the client sees on the frame.
        """
        if self.channel is None or self.channel.readyState != "open":
            return
        h = item.header
        self.channel.send(json.dumps({
            "type": "frame", "seq": h.seq, "pts": h.pts, "rtp_timestamp": rtp_timestamp, "flags": int(h.flags),
            "capture_ns": h.capture_ns, "graph_us": h.graph_us, "compute_us": h.compute_us,
            "encode_us": h.encode_us, "send_wait_us": h.send_wait_us, "bytes": len(item.payload)}))

    def _audio_anchor(self, pts: int, rtp_timestamp: int) -> bool:
        """The ``rtp`` message: the audio packet stamped ``rtp_timestamp`` carries session pts ``pts``.

        Both are on the 48 kHz clock, so later packets follow from it.
        Returns False while the data channel is not open.
        """
        if self.channel is None or self.channel.readyState != "open":
            return False
        self.channel.send(json.dumps({"type": "rtp", "kind": "audio", "pts": pts, "rtp_timestamp": rtp_timestamp}))
        return True

    async def _watch(self) -> None:
        """End the session when ICE has not connected in time, or the connected peer fell silent.

        Silent means it sent nothing at all, no datagram of any kind, for the peer timeout.
        A live peer is never that quiet. It sends RTCP and ICE checks.
        It also acknowledges the server's data-channel messages.
        Once it has been quiet for a third of the timeout, the watchdog sends it an SCTP heartbeat.
        The peer must answer that.
        How late the server's own frames are does not count. A slow session is slow, not gone.
        """
        from .webrtc_media import ask_peer

        cfg = self.config
        deadline = time.monotonic() + cfg.webrtc_connect_timeout_s
        asked = 0.0
        while not self._closed.is_set():
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if self.pc.connectionState != "connected":
                if now > deadline:
                    log.info("webrtc: peer did not connect within %g s", cfg.webrtc_connect_timeout_s)
                    break
                continue
            silent = now - self._heard if self.watched else 0.0  # unwatched: only a failed connection ends it
            if silent > cfg.webrtc_peer_timeout_s:
                log.info("webrtc: peer silent for %.1f s (sent nothing at all); gone", silent)
                break
            if silent > cfg.webrtc_peer_timeout_s / 3 and now - asked > cfg.webrtc_peer_timeout_s / 3:
                await ask_peer(self.pc)
                asked = now
        if self.session is not None and self.session.end_reason is None:
            self.session.end_reason = "disconnected"
        self._closed.set()
        self._arrived.set()
