"""A POST on the WebSocket port: websockets' connection class, taught to read one request with a body.

Why this design: the server's HTTP is websockets' ``process_request`` hook, and websockets' HTTP parser takes
GET only. Rather than a second HTTP server (another port, another place for the token, Origin and session
checks to drift apart) or a proxy in front, :class:`PostConnection` — passed to ``serve()`` through
websockets' documented ``create_connection`` hook — reads a ``POST`` itself (request line, headers, a
``Content-Length`` body of at most ``MAX_BODY`` bytes) and hands it to the same ``process_request`` as a
:class:`~websockets.http11.Request` with ``method = "POST"``, ``body`` and ``peer`` (the client's address)
set. The answer goes out through websockets' own response path and the connection closes, as for every
plain-HTTP answer. Any other request is fed to websockets unchanged.
"""
from __future__ import annotations

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request

MAX_BODY = 64 * 1024  # bytes: a bigger body is answered 413 without being read (an SDP offer is a few KiB)
MAX_HEAD = 16 * 1024  # bytes of request line and headers


class PostConnection(ServerConnection):
    """A websockets server connection that also accepts one ``POST`` request (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sniff = bytearray()  # the first bytes, until we know the method
        self._post: bytearray | None = None
        self._done = False

    def data_received(self, data: bytes) -> None:
        if self._post is None and self._sniff is not None:
            self._sniff += data
            if len(self._sniff) < 5:
                return
            head, self._sniff = bytes(self._sniff), None
            if not head.startswith(b"POST "):
                super().data_received(head)
                return
            self._post = bytearray(head)
        elif self._post is None:
            super().data_received(data)
            return
        else:
            self._post += data
        if not self._done:
            self._parse()

    def _parse(self) -> None:
        buf = self._post
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self.transport.abort()
            return
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        headers = Headers()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self.transport.abort()
                return
            headers[name.strip()] = value.strip()
        try:
            length = int(headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        request = Request(parts[1] if len(parts) == 3 else "/", headers)
        request.method, request.body, request.too_large = "POST", b"", False
        peer = self.transport.get_extra_info("peername")
        request.peer = peer[0] if peer else None
        if length < 0 or length > MAX_BODY:
            request.too_large = True  # answered 413 (or 400 for a bad length) without reading the body
        elif len(buf) - end - 4 < length:
            return  # the rest of the body is still coming
        else:
            request.body = bytes(buf[end + 4:end + 4 + length])
        self._done = True
        self.request = request
        self.request_rcvd.set_result(None)
