"""The cluster's front door: places each new session on a replica with room, and shows the whole cluster.

Clients connect to ``ws://HOST:PORT/ws`` exactly as to ``framegraph serve``.
The front door answers the handshake with **HTTP 307** to the chosen replica's own WebSocket.
That is ``ws://REPLICA/ws?ticket=T``, with a one-time ticket from :mod:`.tickets`.
The session runs there from ``start`` to its end. The connection itself is the affinity.
Browsers do not follow redirects on WebSockets.
So the page asks ``GET /place`` first, gets JSON ``{"url", "replica"}`` and connects there.
When every live replica is full, or none is up, the answer is **503** with ``Retry-After``.
It is never a wait.
A replica whose model has no room for the session refuses it ``full`` at ``start`` or at the offer.
It then asks :meth:`Gateway.place_elsewhere` for another replica, and sends the client there.
Only when none has room does the client get the refusal.

Placement reads the replicas' own reports, sent to :meth:`Gateway.report` every ``heartbeat_s``.
They carry capacity, sessions and draining.
A ticket handed out counts as a taken slot until the replica reports it redeemed, or it expires.
A replica not heard from for ``dead_after_s`` gets no new sessions.
Its process died, and its clients lost their connections with it.
Serve starts a replacement, which reports in.

HTTP routes:

- ``/ws`` and ``/place``.
- ``/cluster``: JSON, every replica.
- ``/metrics``: Prometheus. Every replica's series is labelled ``replica``, plus ``framegraph_cluster_*``.
- ``/healthz``.
- ``/pipelines`` and ``/pipelines/NAME``.
- The web page.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from websockets.asyncio.server import serve

from framegraph.apps.server.config import WEB_ROOT
from framegraph.apps.server.http import (
    PROMETHEUS_TYPE,
    WS_PATH,
    host_is_loopback,
    origin_ok,
    pipelines_response,
    response,
    static_file,
    token_ok,
)
from framegraph.apps.server.http_post import PostConnection
from framegraph.apps.server.loop_thread import LoopThread
from framegraph.apps.server.webrtc import offer_url

from . import metrics
from .settings import ClusterSettings
from .tickets import TICKET_TTL_S, issue

log = logging.getLogger("framegraph.cluster")


class ClusterFull(Exception):
    """No live replica has a free session slot."""


@dataclass
class ReplicaView:
    """The front door's picture of one replica: its last report, when it came, the tickets not yet used."""

    state: dict
    seen: float  # time.monotonic() of the last report
    pending: dict[str, float] = field(default_factory=dict)  # ticket nonce -> expiry (monotonic)

    def alive(self, now: float, dead_after_s: float) -> bool:
        return now - self.seen <= dead_after_s

    def reserved(self, now: float) -> int:
        """Tickets handed out and not yet used or expired."""
        self.pending = {n: e for n, e in self.pending.items() if e > now}
        return len(self.pending)

    def free(self, now: float) -> int:
        return self.state["capacity"] - self.state["sessions"] - self.reserved(now)


class Gateway:
    """The front door. ``deploy.py`` makes it a one-replica Serve deployment.

    The replicas' reports come in through :meth:`report`, a Serve handle call.
    Clients come to its own HTTP and WebSocket port.
    """

    def __init__(self, settings: ClusterSettings):
        self.settings = settings
        self.replicas: dict[str, ReplicaView] = {}
        self.placed: collections.Counter = collections.Counter()
        self.rejected: collections.Counter = collections.Counter()
        self.moved = 0  # sessions a full replica refused and the front door placed on another
        self._refused: dict[str, tuple[float, frozenset[str]]] = {}  # ticket nonce -> (expiry, replicas that refused)
        self._lock = threading.Lock()
        self._listener = _Listener(self)
        self.url = self._listener.start()
        log.info("cluster front door at %s", self.url)

    # ---- control: reports from the replicas -----------------------------------------------------
    def report(self, state: dict) -> None:
        """A replica's heartbeat: :meth:`~.replica.Replica.state`."""
        with self._lock:
            view = self.replicas.get(state["id"])
            if view is None:
                view = self.replicas[state["id"]] = ReplicaView(state, time.monotonic())
                log.info("replica %s joined at %s", state["id"], state["url"])
            view.state, view.seen = state, time.monotonic()
            for nonce in state["redeemed"]:
                view.pending.pop(nonce, None)

    # ---- placement ------------------------------------------------------------------------------
    def place(self, exclude: frozenset[str] = frozenset()) -> dict:
        """Choose a replica and reserve a slot on it with a ticket.

        It picks the live, non-draining replica with the most free slots, of those not in ``exclude``.
        Ties go to fewer sessions, then to the id.
        Returns ``{"url": ws URL with the ticket, "replica": id}``.
        Raises :class:`ClusterFull`.
        """
        now = time.monotonic()
        with self._lock:
            live = [v for v in self.replicas.values()
                    if v.alive(now, self.settings.dead_after_s) and not v.state["draining"]]
            free = {v.state["id"]: v.free(now) for v in live}
            ranked = sorted((v for v in live if free[v.state["id"]] > 0 and v.state["id"] not in exclude),
                            key=lambda v: (-free[v.state["id"]], v.state["sessions"], v.state["id"]))
            if not ranked:
                self.rejected["full" if live else "no_replica"] += 1
                raise ClusterFull(f"cluster full: {len(live)} live replica(s), each with "
                                  f"{self.settings.sessions_per_replica} session slots, all in use" if live else
                                  "no replica is up yet (starting, or all stopped); retry shortly")
            chosen = next((v for v in ranked if self._answers(v, now)), None)
            if chosen is None:
                self.rejected["no_replica"] += 1
                raise ClusterFull("no replica answers (they stopped); retry shortly")
            ticket, nonce = issue(self.settings.secret, chosen.state["id"])
            chosen.pending[nonce] = now + TICKET_TTL_S
            if exclude:
                self._refused[nonce] = (now + TICKET_TTL_S, exclude)
            self.placed[chosen.state["id"]] += 1
            return {"url": f"{chosen.state['url']}?ticket={ticket}", "replica": chosen.state["id"]}

    def place_elsewhere(self, replica: str, nonce: str | None) -> dict | None:
        """Place again a session that ``replica`` refused ``full``: its model has no room there.

        ``nonce`` is that of the ticket the session came with.
        The replicas that refused the session before on its way are left out too, so it never goes round.
        Returns :meth:`place`'s answer, or None when no other replica has a slot.
        """
        now = time.monotonic()
        with self._lock:
            self._refused = {n: (e, r) for n, (e, r) in self._refused.items() if e > now}
            refused = self._refused.pop(nonce, (0.0, frozenset()))[1] | {replica}
        try:
            placed = self.place(exclude=refused)
        except ClusterFull:
            return None
        with self._lock:
            self.moved += 1
        log.info("replica %s is full for a session: placed on replica %s", replica, placed["replica"])
        return placed

    def _answers(self, view: ReplicaView, now: float) -> bool:
        """Whether a replica answers. A replica whose reports are late is probed.

        Reports come late from a busy machine or a dead process.
        A dead process's port refuses at once.
        The replica is then out until it reports again.
        """
        if now - view.seen <= 2 * self.settings.heartbeat_s:
            return True
        parts = urlsplit(view.state["url"])
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=0.25).close()
            return True
        except OSError:
            view.seen = -float("inf")
            log.info("replica %s does not answer at %s: no new sessions for it", view.state["id"], view.state["url"])
            return False

    # ---- views ----------------------------------------------------------------------------------
    def view(self) -> dict:
        """The cluster as JSON: the front door's URL and one entry per replica heard from."""
        now = time.monotonic()
        with self._lock:
            replicas = [{**{k: v for k, v in r.state.items() if k not in ("metrics", "redeemed")},
                         "alive": r.alive(now, self.settings.dead_after_s), "pending": r.reserved(now),
                         "last_report_s": round(now - r.seen, 3), "placed": self.placed[r.state["id"]]}
                        for r in self.replicas.values()]
        return {"url": self.url, "sessions_per_replica": self.settings.sessions_per_replica,
                "replicas": sorted(replicas, key=lambda r: r["id"]), "rejected": dict(self.rejected),
                "moved": self.moved}

    def metrics_text(self) -> str:
        now = time.monotonic()
        with self._lock:
            views = list(self.replicas.values())
        live = [v for v in views if v.alive(now, self.settings.dead_after_s)]
        text = metrics.merge([({"replica": v.state["id"]}, v.state["metrics"]) for v in live])
        per = [({"replica": v.state["id"]}, v.state["sessions"]) for v in live]
        return (text
                + metrics.family("replicas", "gauge", "Replicas reporting in.", [({}, len(live))])
                + metrics.family("replica_sessions", "gauge", "Sessions per replica.", per)
                + metrics.family("replica_capacity", "gauge", "Session slots per replica.",
                                 [({"replica": v.state["id"]}, v.state["capacity"]) for v in live])
                + metrics.family("replica_draining", "gauge", "1 while a replica drains.",
                                 [({"replica": v.state["id"]}, int(v.state["draining"])) for v in live])
                + metrics.family("placed_total", "counter", "Sessions placed, by replica.",
                                 [({"replica": r}, n) for r, n in sorted(self.placed.items())])
                + metrics.family("rejected_total", "counter", "Placements refused, by reason.",
                                 [({"reason": r}, n) for r, n in sorted(self.rejected.items())])
                + metrics.family("moved_total", "counter", "Sessions a full replica refused, placed on another.",
                                 [({}, self.moved)]))

    def __del__(self):
        if getattr(self, "_listener", None) is not None:
            self._listener.stop()

    # ---- HTTP -----------------------------------------------------------------------------------
    def route(self, request):
        """Every request is answered here. The front door never upgrades a connection itself."""
        path = urlsplit(request.path).path
        upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
        s = self.settings
        if getattr(request, "method", "GET") == "POST":  # a WebRTC offer: 307 to the chosen replica's own endpoint
            if path != "/webrtc/offer":
                return response(404, f"nothing to POST at {path}; WebRTC offers go to /webrtc/offer\n")
            placed, refused = self._admit(request)
            if refused is not None:
                return refused
            return response(307, f"placed on replica {placed['replica']}\n",
                            extra={"Location": offer_url(placed["url"])})
        if path in (WS_PATH, "/place"):
            if path == WS_PATH and not upgrade:
                return response(426, "this is the WebSocket endpoint (protocol: apps/PROTOCOL.md)\n",
                                extra={"Upgrade": "websocket"})
            placed, refused = self._admit(request)
            if refused is not None:
                return refused
            if path == "/place":
                return response(200, json.dumps(placed), "application/json")
            return response(307, f"placed on replica {placed['replica']}\n", extra={"Location": placed["url"]})
        if upgrade:
            return response(404, f"no WebSocket at {path}; connect to {WS_PATH}\n")
        if path == "/healthz":
            v = self.view()
            up = [r for r in v["replicas"] if r["alive"]]
            return response(200, json.dumps({"status": "ok" if up else "no_replica", "replicas": len(up),
                                             "sessions": sum(r["sessions"] for r in up),
                                             "capacity": sum(r["capacity"] for r in up)}), "application/json")
        if path in ("/metrics", "/cluster"):
            if not token_ok(s.token, request):
                return response(401, "missing or wrong token\n",
                                extra={"WWW-Authenticate": 'Bearer realm="framegraph"'})
            if path == "/cluster":
                return response(200, json.dumps(self.view()), "application/json")
            return response(200, self.metrics_text(), PROMETHEUS_TYPE)
        return pipelines_response(path) or static_file(WEB_ROOT, path)

    def _admit(self, request) -> tuple[dict | None, object]:
        """The placement of a request, or its refusal.

        Returns ``(placed, None)`` for a session placed on a replica by :meth:`place`.
        Returns ``(None, response)`` when the front door's checks refuse the request, in :meth:`_refuse`.
        It does so too when no replica has room, with 503.
        """
        refused = self._refuse(request)
        if refused is not None:
            return None, refused
        try:
            return self.place(), None
        except ClusterFull as exc:
            return None, response(503, f"{exc}\n", extra={"Retry-After": "5"})

    def _refuse(self, request):
        """The single server's checks at the front door: Host, Origin, token. None when they pass."""
        s = self.settings
        if not s.token and not host_is_loopback(request):
            self.rejected["host"] += 1
            return response(403, f"Host {request.headers.get('Host')!r} is not this machine; a cluster without a "
                                 f"token only answers localhost\n")
        if not origin_ok(request, s.allowed_origins):
            self.rejected["origin"] += 1
            return response(403, f"origin {request.headers.get('Origin')!r} is not allowed\n")
        if not token_ok(s.token, request):
            self.rejected["token"] += 1
            return response(401, "missing or wrong token (Authorization: Bearer T, or ?token=T)\n",
                            extra={"WWW-Authenticate": 'Bearer realm="framegraph"'})
        return None


class _Listener(LoopThread):
    """The front door's HTTP port: websockets' server on its own event loop thread.

    Every request is answered by :meth:`Gateway.route`.
    """

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.url = ""
        super().__init__("cluster-front-door")

    def start(self) -> str:
        self._start_thread()
        return self.url

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(5)

    async def _serve(self) -> None:
        s = self.gateway.settings
        self._stop = asyncio.Event()

        async def never(ws):  # every request is answered in process_request
            await ws.close(1011, "the front door does not hold sessions")

        async with serve(never, s.host, s.port, process_request=lambda _c, req: self.gateway.route(req),
                         server_header="framegraph-cluster", create_connection=PostConnection) as server:
            port = next(sock.getsockname()[1] for sock in server.sockets)
            host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host
            self.url = f"ws://{host}:{port}{WS_PATH}"
            self._ready.set()
            await self._stop.wait()
