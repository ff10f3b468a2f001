"""A cluster replica: one ``framegraph serve``, on its own WebSocket port, inside a Ray Serve replica.

Media never cross Ray.
Clients that the front door placed here connect to this replica's own WebSocket.
A ticket admits them: :mod:`.tickets`.
Every frame goes from here to them directly.

Only control flows through Serve:

- The replica reports its state to the front door every ``heartbeat_s``: :meth:`state`.
- A session refused ``full`` here, its model having no room, is placed elsewhere by the front door:
  :meth:`_elsewhere`. The client is sent on there.
- Serve asks it for autoscaling figures, the live sessions: :meth:`record_autoscaling_stats`.
- Serve asks it for its health: :meth:`check_health`.
- On scale-down Serve calls ``__del__``, where the replica drains: :meth:`drain`.
  It takes no new sessions. The running ones get ``drain_grace_s`` to finish.
  Then they are closed with code 1001 and a reason.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time

from framegraph.apps import bundles as avatars
from framegraph.apps.server import ServerConfig, serve_in_thread
from framegraph.apps.server.http import is_loopback, query_value

from .settings import ClusterSettings
from .tickets import TicketBook, nonce_of

log = logging.getLogger("framegraph.cluster")

DRAIN_CODE = 1001


def drain_reason(why: str) -> str:
    """The close reason a drained session gets. A WebSocket close reason has at most 123 bytes."""
    return f"replica draining ({why}); connect again to continue"


class Replica:
    """The replica's body. ``deploy.py`` makes it a Serve deployment.

    Args:
        gateway: a Serve handle to the front door, :class:`~.gateway.Gateway`.
        settings: the cluster's :class:`ClusterSettings`.
    """

    def __init__(self, gateway, settings: ClusterSettings):
        self.gateway, self.settings = gateway, settings
        self.id = _replica_id()
        avatars.set_bundle_limit(settings.max_bundles)
        bind = settings.host if is_loopback(settings.host) else "0.0.0.0"
        config = ServerConfig(host=bind, port=0, token=settings.secret, max_sessions=settings.sessions_per_replica,
                              web_root=None, stats_interval_s=settings.stats_interval_s,
                              allowed_origins=settings.allowed_origins, batching=settings.batching)
        started = time.monotonic()
        self.handle = serve_in_thread(config).start()
        self.server = self.handle.server
        self.tickets = TicketBook(settings.secret, self.id)
        self.server.redeem_ticket = self.tickets.redeem
        self.server.place_elsewhere = self._elsewhere
        host = "127.0.0.1" if is_loopback(settings.host) else _node_ip()
        self.url = f"ws://{host}:{self.server.port}/ws"
        self.start_s = time.monotonic() - started
        self.drained = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a session opened or ended: report now, not at the next heartbeat
        self.server.on_sessions_changed = self._wake.set
        self._reporter = threading.Thread(target=self._report_loop, name="replica-report", daemon=True)
        self._reporter.start()
        log.info("replica %s serving %s (%d sessions)", self.id, self.url, settings.sessions_per_replica)

    # ---- control (through Serve handles) --------------------------------------------------------
    def state(self) -> dict:
        """What the front door needs to place sessions and draw ``/metrics``."""
        server = self.server
        return {"id": self.id, "url": self.url, "pid": os.getpid(), "node": _node_ip(),
                "capacity": server.config.max_sessions, "sessions": server.session_count,
                "session_ids": sorted(server.sessions), "draining": server.draining is not None,
                "redeemed": self._redeemed(), "bundles": avatars.loaded_bundles(),
                "start_s": round(self.start_s, 3), "metrics": server.metrics_text()}

    def _redeemed(self) -> list[str]:
        """Tickets the front door may stop counting.

        These are the tickets of running sessions, which count themselves in ``sessions``.
        They are also those whose handshake is long over.
        """
        running = {nonce_of(query_value(s.transport.request, "ticket")) for s in list(self.server.sessions.values())}
        return sorted((running - {None}) | set(self.tickets.settled()))

    def _elsewhere(self, ticket: str | None) -> str | None:
        """Another replica's WebSocket URL, with a ticket, for a session refused ``full`` here. None: none has room.

        The front door chooses it: :meth:`~.gateway.Gateway.place_elsewhere`.
        """
        try:
            placed = self.gateway.place_elsewhere.remote(self.id, nonce_of(ticket)).result(timeout_s=5.0)
        except Exception as exc:  # noqa: BLE001 - the front door may be restarting: the client gets the refusal
            log.info("replica %s: no other replica for a session refused full: %s", self.id, exc)
            return None
        return None if placed is None else placed["url"]

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metric: the sessions this replica runs."""
        return {"sessions": float(self.server.session_count)}

    def check_health(self) -> None:
        """Serve's health check: the replica is unhealthy once its WebSocket server has stopped."""
        if not self.handle._thread.is_alive():
            raise RuntimeError(f"replica {self.id}: its WebSocket server stopped")

    def drain(self, why: str = "scale-down", grace_s: float | None = None) -> int:
        """Drain the replica. Returns how many sessions were closed.

        It refuses new sessions with HTTP 503.
        The running ones get ``grace_s`` to end. It defaults to the settings'.
        Those left are then closed with code 1001 and :func:`drain_reason`.
        """
        grace_s = self.settings.drain_grace_s if grace_s is None else grace_s
        self.server.draining = f"replica {self.id} is draining ({why})"
        self._wake.set()  # tell the front door at once
        deadline = time.monotonic() + grace_s
        while self.server.session_count and time.monotonic() < deadline:
            time.sleep(0.05)
        closed = self.server.session_count
        if closed:
            log.info("replica %s: closing %d session(s) after the %g s drain grace", self.id, closed, grace_s)
            future = asyncio.run_coroutine_threadsafe(
                self.server.close_sessions(DRAIN_CODE, drain_reason(why)), self.handle.loop)
            future.result(timeout=self.server.config.close_timeout_s + 5)
        self.drained.set()
        return closed

    def __del__(self):
        """Serve stops this replica: drain, then stop the server.

        Serve stops it on scale-down, redeploy or shutdown.
        Serve runs this on the replica's event loop, which has nothing else to do by then.
        The heartbeats and the WebSocket server have threads of their own.
        """
        if getattr(self, "handle", None) is None:
            return
        try:
            if not self.drained.is_set():
                self.drain("scale-down")
        finally:
            self._stop.set()
            self.handle.stop()

    # ---- reporting ------------------------------------------------------------------------------
    def _report(self) -> None:
        try:
            self.gateway.report.remote(self.state()).result(timeout_s=2.0)
        except Exception as exc:  # noqa: BLE001 - the front door may be restarting; the next report retries
            log.debug("replica %s: report failed: %s", self.id, exc)

    def _report_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.settings.heartbeat_s)
            self._wake.clear()
            self._report()


def _replica_id() -> str:
    try:
        from ray import serve  # optional: framegraph[cluster]

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a Serve replica (direct use): a random id
        return secrets.token_hex(4)


def _node_ip() -> str:
    try:
        import ray  # optional: framegraph[cluster]

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001
        return "127.0.0.1"
