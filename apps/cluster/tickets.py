"""One-time admission tickets: the front door signs them, a replica redeems them.

A ticket is ``REPLICA.EXPIRES_MS.NONCE.SIGNATURE``.
``SIGNATURE`` is the first 32 hex digits of HMAC-SHA256 of the rest, under the cluster's secret.
The front door issues one per placement.
It sends the client to ``ws://REPLICA/ws?ticket=...``.
The replica accepts the WebSocket only with a valid ticket.
Valid means signed, naming this replica, not expired and not used before.
No round trip between the two is needed.
A ticket is useless anywhere else, or twice.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

TICKET_TTL_S = 10.0


def _sign(secret: str, body: str) -> str:
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()[:32]


def issue(secret: str, replica: str, ttl_s: float = TICKET_TTL_S) -> tuple[str, str]:
    """A new ticket for ``replica``: ``(ticket, nonce)``. It expires ``ttl_s`` seconds from now.

    The expiry is in wall-clock time, since the front door and the replica may run on different machines.
    """
    nonce = secrets.token_hex(8)
    body = f"{replica}.{int((time.time() + ttl_s) * 1000)}.{nonce}"
    return f"{body}.{_sign(secret, body)}", nonce


def nonce_of(ticket: str | None) -> str | None:
    """The nonce part of a ticket. None for anything that is not one."""
    parts = (ticket or "").split(".")
    return parts[2] if len(parts) == 4 else None


class TicketBook:
    """The replica's side of the tickets.

    Its :meth:`redeem` takes each ticket at most once.
    Its :meth:`settled` lists the nonces of tickets whose handshake is long over.
    Those are reported to the front door, which stops counting them as reserved.
    By then the session has started and counts itself, or never will.
    """

    def __init__(self, secret: str, replica: str):
        self.secret, self.replica = secret, replica
        self._used: dict[str, tuple[float, float]] = {}  # nonce -> (expiry, redeemed at) (s, wall clock)
        self._lock = threading.Lock()

    def redeem(self, ticket: str | None) -> bool:
        """True if ``ticket`` is valid for this replica now. The ticket is then spent."""
        if not ticket:
            return False
        try:
            replica, expires_ms, nonce, signature = ticket.split(".")
            expires = int(expires_ms) / 1000
        except ValueError:
            return False
        body = f"{replica}.{expires_ms}.{nonce}"
        if replica != self.replica or not hmac.compare_digest(signature, _sign(self.secret, body)):
            return False
        now = time.time()
        with self._lock:
            self._used = {n: (e, r) for n, (e, r) in self._used.items() if e > now - TICKET_TTL_S}
            if expires < now or nonce in self._used:
                return False
            self._used[nonce] = (expires, now)
        return True

    def settled(self, after_s: float = 2.0) -> list[str]:
        """Nonces redeemed at least ``after_s`` ago."""
        now = time.time()
        with self._lock:
            return [n for n, (_, redeemed) in self._used.items() if now - redeemed >= after_s]
