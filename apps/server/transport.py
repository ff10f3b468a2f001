"""What a :class:`~.session.Session` needs from a connection: the transport-neutral seam.

A session is one pipeline graph, from ``start`` to ``ended``.
It talks to its client through a **transport**.
A transport carries text control messages both ways, binary messages in, media items out, and a close.
Two adapters exist:

- :class:`WebSocketTransport` here, the protocol of ``apps/PROTOCOL.md``.
  Media are binary messages with the 48-byte header.
- ``webrtc.WebRtcTransport``: control over a data channel, media on RTP tracks.

The session never sees which one it has.
A transport raises :class:`TransportClosed` once its connection is gone.
"""
from __future__ import annotations

from typing import Any, Protocol

from websockets.exceptions import ConnectionClosed

from .outbox import Item


class TransportClosed(Exception):
    """The client's connection is gone: closed, lost, or cut."""


class Transport(Protocol):
    """A session's connection to its client.

    Attributes:
        close_timeout: seconds a closing connection waits for the client's side of the close.
        request: the HTTP request that opened the connection. Its query carries a cluster ticket.
        remote_address: the client's address, for logs.
    """

    close_timeout: float
    request: Any
    remote_address: Any

    async def recv(self) -> str | bytes:
        """The client's next message: ``str`` for control JSON, ``bytes`` for media."""

    async def send_text(self, text: str) -> None:
        """One control message, as JSON text."""

    async def send_media(self, item: Item) -> int:
        """One encoded video frame or audio chunk from the outbox. Returns the bytes it put on the wire."""

    async def close(self, code: int, reason: str) -> None:
        """The close handshake. ``code`` is a WebSocket close code: 1000 normal, 1001 going away."""

    def abort(self) -> None:
        """Cut the connection at once, without a handshake."""


class WebSocketTransport:
    """A ``websockets`` server connection as a :class:`Transport`.

    Media go out as binary messages, with the 48-byte :class:`~.protocol.MediaHeader` packed in front of the payload.
    """

    def __init__(self, ws):
        self.ws = ws

    @property
    def close_timeout(self) -> float:
        return self.ws.close_timeout

    @property
    def request(self):
        return self.ws.request

    @property
    def remote_address(self):
        return self.ws.remote_address

    async def recv(self) -> str | bytes:
        try:
            return await self.ws.recv()
        except ConnectionClosed as exc:
            raise TransportClosed(str(exc)) from None

    async def send_text(self, text: str) -> None:
        try:
            await self.ws.send(text)
        except ConnectionClosed as exc:
            raise TransportClosed(str(exc)) from None

    async def send_media(self, item: Item) -> int:
        data = item.header.pack() + item.payload
        try:
            await self.ws.send(data)
        except ConnectionClosed as exc:
            raise TransportClosed(str(exc)) from None
        return len(data)

    async def close(self, code: int, reason: str) -> None:
        try:
            await self.ws.close(code, reason)
        except ConnectionClosed:
            pass

    def abort(self) -> None:
        self.ws.transport.abort()
