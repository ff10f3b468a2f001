"""StreamServer: the asyncio WebSocket server behind ``framegraph serve``.

    config = ServerConfig(port=0)                 # port 0: the OS picks one
    async with StreamServer(config) as server:
        print(server.url)                         # ws://127.0.0.1:PORT/ws
        await server.serve_forever()

From synchronous code, such as tests or a Gradio app, use
``with serve_in_thread(config) as handle: handle.url``.
There is one session per connection, each with its own graph.
HTTP shares the port: ``/metrics``, ``/healthz`` and the web page.
So do WebRTC offers, on ``POST /webrtc/offer`` (:mod:`.webrtc`).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Callable

from websockets.asyncio.server import Server, serve

from framegraph.stream import prometheus_text
from framegraph.stream.telemetry import prometheus_family

from . import http, pipelines, webrtc
from .config import ServerConfig
from .http import WS_PATH
from .http_post import PostConnection
from .limits import TokenBucket
from .loop_thread import LoopThread, StartedInWith
from .protocol import ErrorCode
from .session import Session

log = logging.getLogger("framegraph.server")

class StreamServer:
    """The server: sessions by id, counters for ``/metrics``, the websockets ``Server``."""

    def __init__(self, config: ServerConfig | None = None):
        self.config = config or ServerConfig()
        self.config.validate()
        self.sessions: dict[str, Session] = {}
        self.sessions_total = 0
        self.rejected: collections.Counter = collections.Counter()
        self.errors: collections.Counter = collections.Counter()
        self.draining: str | None = None  # set: new sessions are refused with HTTP 503 and this text
        self.redeem_ticket: Callable[[str | None], bool] | None = None  # a cluster replica's ticket check
        # a cluster replica's: the ticket of a session refused ``full`` → a WebSocket URL elsewhere, or None
        self.place_elsewhere: Callable[[str | None], str | None] | None = None
        self.on_sessions_changed: Callable[[], None] | None = None  # called (on the loop) when one opens or ends
        # called (on the loop) with each new session before it runs: an embedding app may wrap its transport (the
        # Gradio demo records the WebRTC takes of its player this way)
        self.on_session_opened: Callable[[Session], None] | None = None
        self._server: Server | None = None
        self._offer_buckets: dict[str, TokenBucket] = {}  # WebRTC offers per client address
        self._background: set[asyncio.Task] = set()  # WebRTC sessions (a WebSocket one is its connection's)

    # ---- life cycle -----------------------------------------------------------------------------
    async def start(self) -> StreamServer:
        cfg = self.config
        self._server = await serve(
            self._handler, cfg.host, cfg.port,
            process_request=lambda conn, req: webrtc.process_request(self, conn, req), create_connection=PostConnection,
            compression=None,  # JPEG / H.264 / PCM do not deflate; it would only cost CPU and latency
            max_size=4 * cfg.max_message_bytes, max_queue=16, write_limit=32 * 1024,
            ping_interval=20, ping_timeout=20, close_timeout=cfg.close_timeout_s, server_header="framegraph")
        return self

    async def close(self) -> None:
        """Stop accepting and close every connection with code 1001. Sessions free their graphs.

        Clients get ``shutdown_grace_s`` to take what was sent and answer the close.
        The connections left then are cut off.
        So a client that never reads, or a WebRTC peer that never closes, cannot hold the server up.
        Returns when every connection handler has returned.
        A WebRTC session's graph gets 1 s more to stop.
        """
        if self._server is None:
            return
        self._server.close()
        await asyncio.gather(self._close_webrtc(), self._close_websockets())

    async def _close_webrtc(self) -> None:
        """The WebRTC sessions. The server closes no WebSocket connection for them."""
        if not self._background:
            return
        await self.close_sessions(1001, "server shutting down", self.config.shutdown_grace_s)
        if self._background:  # cut or closed: their graphs are stopping
            await asyncio.wait(list(self._background), timeout=1.0)

    async def _close_websockets(self) -> None:
        try:
            await asyncio.wait_for(self._server.wait_closed(), self.config.shutdown_grace_s)
        except TimeoutError:
            left = list(self._server.all_connections)
            log.info("shutdown: cutting %d connection(s) that did not close within %g s", len(left),
                     self.config.shutdown_grace_s)
            for connection in left:
                connection.transport.abort()
            await self._server.wait_closed()

    async def serve_forever(self) -> None:
        await self._server.serve_forever()

    async def __aenter__(self) -> StreamServer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def port(self) -> int:
        return next(s.getsockname()[1] for s in self._server.sockets)

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        if host in ("0.0.0.0", "[::]", ""):
            host = "127.0.0.1"
        return f"ws://{host}:{self.port}{WS_PATH}"

    @property
    def http_url(self) -> str:
        return self.url.replace("ws://", "http://", 1).removesuffix(WS_PATH) + "/"

    # ---- sessions -------------------------------------------------------------------------------
    @property
    def session_count(self) -> int:
        return len(self.sessions)

    async def _handler(self, ws) -> None:
        if self.session_count >= self.config.max_sessions:  # two handshakes raced past the HTTP check
            self.count_rejected("busy")
            await ws.close(1013, "server busy")
            return
        sock = ws.transport.get_extra_info("socket")
        if sock is not None and self.config.send_buffer_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.send_buffer_bytes)
        session = self.open_session(ws)
        try:
            await session.run()
        finally:
            self.release(session)
            log.info("session %s closed (%s)", session.id, session.end_reason)

    def open_session(self, connection) -> Session | None:
        """A new session on ``connection``, counted among ``max_sessions``.

        ``connection`` is a websockets connection or a :class:`~.transport.Transport`.
        Returns None when all sessions are taken.
        """
        if self.session_count >= self.config.max_sessions:
            self.count_rejected("busy")
            return None
        session = Session(self, connection)
        if self.on_session_opened is not None:
            self.on_session_opened(session)
        self.sessions[session.id] = session
        self.sessions_total += 1
        self._sessions_changed()
        log.info("session %s opened from %s", session.id, session.transport.remote_address)
        return session

    async def elsewhere(self, request) -> str | None:
        """Where a session this server refused ``full`` may go instead: a WebSocket URL, or None.

        Only a cluster replica knows one: :attr:`place_elsewhere`. It blocks, so it runs off the loop.
        """
        if self.place_elsewhere is None:
            return None
        return await asyncio.to_thread(self.place_elsewhere, http.query_value(request, "ticket"))

    def keep(self, task: asyncio.Task) -> None:
        """Hold a WebRTC session's task until it ends. The loop keeps only weak references."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def offer_bucket(self, address: str | None) -> TokenBucket:
        """The WebRTC offer rate limit of one client address."""
        rate = self.config.webrtc_offers_per_s
        if len(self._offer_buckets) > 4096:  # forget idle addresses (their buckets are full again anyway)
            self._offer_buckets = {a: b for a, b in self._offer_buckets.items() if b.tokens < b.burst}
        return self._offer_buckets.setdefault(address or "?", TokenBucket(rate, max(1.0, rate)))

    async def close_sessions(self, code: int, reason: str, timeout_s: float | None = None) -> None:
        """Close every session's connection with ``code`` and ``reason``.

        Their graphs stop as on a client's close.
        Returns when each has sent its close and its client answered.
        A connection whose client has not answered within ``timeout_s`` is cut.
        ``timeout_s`` defaults to the close timeout.
        """
        timeout_s = self.config.close_timeout_s if timeout_s is None else timeout_s
        sessions = list(self.sessions.values())
        for session in sessions:
            session.end_reason = reason
        closing = {asyncio.ensure_future(s.transport.close(code, reason)): s for s in sessions}
        if not closing:
            return
        _, late = await asyncio.wait(closing, timeout=timeout_s)
        if late:
            log.info("closing: cutting %d connection(s) whose client did not answer within %g s", len(late),
                     timeout_s)
        for task in late:
            closing[task].transport.abort()
        _, stuck = await asyncio.wait(closing, timeout=1.0)  # cut: their closes return at once
        for task in stuck:
            task.cancel()
        await asyncio.gather(*closing, return_exceptions=True)

    def release(self, session: Session) -> None:
        """Free ``session``'s slot once its graph has stopped. It may still be closing its connection."""
        if self.sessions.pop(session.id, None) is not None:
            self._sessions_changed()

    def _sessions_changed(self) -> None:
        if self.on_sessions_changed is not None:
            self.on_sessions_changed()

    def count_rejected(self, reason: str) -> None:
        self.rejected[reason] += 1

    def count_error(self, code: ErrorCode) -> None:
        self.errors[ErrorCode(code).value] += 1

    # ---- metrics --------------------------------------------------------------------------------
    def metrics_text(self) -> str:
        """Prometheus text: every running session's graph telemetry and the server's own counters.

        Graph telemetry has labels ``session`` and ``pipeline``.
        The server's counters have the prefix ``framegraph_server_``.
        """
        live = [s for s in list(self.sessions.values())
                if s.pipeline is not None and s.pipeline.graph.telemetry is not None]
        text = prometheus_text([s.pipeline.graph.telemetry for s in live],
                               [s.pipeline.graph.edge_report() for s in live],
                               labels=[{"session": s.id, "pipeline": s.pipeline_name} for s in live])
        lines = []

        def family(name: str, kind: str, help_: str, series: list[tuple[dict, float]]):
            lines.extend(prometheus_family(f"framegraph_server_{name}", kind, help_, series))

        sessions = list(self.sessions.values())
        family("sessions", "gauge", "Open WebSocket sessions.", [({}, len(sessions))])
        family("max_sessions", "gauge", "Session limit.", [({}, self.config.max_sessions)])
        family("sessions_total", "counter", "Sessions opened since start.", [({}, self.sessions_total)])
        family("rejected_total", "counter", "Connections refused at the handshake, by reason.",
               [({"reason": r}, n) for r, n in sorted(self.rejected.items())])
        family("errors_total", "counter", "error messages sent to clients, by code.",
               [({"code": c}, n) for c, n in sorted(self.errors.items())])
        family("messages_sent_total", "counter", "Messages sent, by session and kind.",
               [({"session": s.id, "kind": k}, n) for s in sessions for k, n in s.sent.items()])
        family("send_drops_total", "counter", "Messages dropped for a slow client, by session and kind.",
               [({"session": s.id, "kind": k}, n) for s in sessions for k, n in s.outbox.dropped.items()])
        family("outbox_depth", "gauge", "Messages waiting to be sent, by session.",
               [({"session": s.id}, s.outbox.depth) for s in sessions])
        family("session_video_fps", "gauge", "Video frames sent per second over the last 3 s, by session.",
               [({"session": s.id}, round(s.recent_fps(), 2)) for s in sessions if s.pipeline is not None])
        return text + "\n".join(lines) + "\n" + pipelines.base.batching_metrics_text()


class ServerHandle(StartedInWith, LoopThread):
    """A server running on its own event loop in a background thread. See :func:`serve_in_thread`."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.server: StreamServer | None = None
        super().__init__("server-loop")

    def _main(self) -> None:
        try:
            super()._main()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with StreamServer(self.config) as server:
            self.server = server
            self._ready.set()
            await self._stop.wait()

    def start(self) -> ServerHandle:
        self._start_thread()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def http_url(self) -> str:
        return self.server.http_url


def serve_in_thread(config: ServerConfig | None = None) -> ServerHandle:
    """A :class:`ServerHandle`, not yet started. Use it as a context manager or call ``start()``."""
    return ServerHandle(config or ServerConfig())
