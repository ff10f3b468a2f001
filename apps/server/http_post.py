"""A POST on the WebSocket port: websockets' connection class, taught to read one request with a body.

The server's HTTP is websockets' ``process_request`` hook, and websockets' HTTP parser takes GET only.
A second HTTP server would need another port.
Its token, Origin and session checks could drift apart from these.
So there is no second server and no proxy in front.
Instead :class:`PostConnection` reads a ``POST`` itself.
It is passed to ``serve()`` through websockets' documented ``create_connection`` hook.
It reads the request line, the headers and a body of at most ``MAX_BODY`` bytes.
The body is sized by ``Content-Length`` or sent with ``Transfer-Encoding: chunked``.
The request goes to the same ``process_request`` as a :class:`~websockets.http11.Request`.
These attributes are set on it:

- ``method``: ``"POST"``.
- ``body``: the bytes read.
- ``too_large``: the body is over ``MAX_BODY``. The rest is not read.
- ``bad_framing``: a sentence, or None.
- ``peer``: the client's address.

The answer goes out through websockets' own response path.
Then the connection closes, as for every plain-HTTP answer.
Any other request is fed to websockets unchanged.
"""
from __future__ import annotations

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request

MAX_BODY = 64 * 1024  # bytes: a bigger body is answered 413 without being read (an SDP offer is a few KiB)
MAX_HEAD = 16 * 1024  # bytes of request line and headers


class PostConnection(ServerConnection):
    """A websockets server connection that also accepts one ``POST`` request. See the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sniff = bytearray()  # the first bytes, until we know the method
        self._post: bytearray | None = None
        self._length = 0  # of a Content-Length body
        self._chunks: bytearray | None = None  # a chunked body read so far
        self._request: Request | None = None  # once its head is read
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
        elif self._done:
            return  # the request is whole, or refused unread (too large): the rest is dropped, not kept
        else:
            self._post += data
        self._parse()

    def _parse(self) -> None:
        buf = self._post
        if self._request is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self.transport.abort()
                return
            if not self._read_head(bytes(buf[:end]).decode("latin-1").split("\r\n")):
                self.transport.abort()
                return
            del buf[:end + 4]
        if self._chunks is not None:
            self._read_chunks()
        elif not self._request.too_large and len(buf) < self._length:
            return  # the rest of the body is still coming
        else:
            self._request.body = b"" if self._request.too_large else bytes(buf[:self._length])
            self._done = True
        if self._done:
            self.request = self._request
            self.request_rcvd.set_result(None)

    def _read_head(self, lines: list[str]) -> bool:
        """The request line and headers → ``self._request`` and how its body comes. False: not HTTP."""
        parts = lines[0].split(" ")
        headers = Headers()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                return False
            headers[name.strip()] = value.strip()
        request = Request(parts[1] if len(parts) == 3 else "/", headers)
        request.method, request.body, request.too_large, request.bad_framing = "POST", b"", False, None
        peer = self.transport.get_extra_info("peername")
        request.peer = peer[0] if peer else None
        self._request = request
        coding = ",".join(headers.get_all("Transfer-Encoding")).strip().lower()
        if coding == "chunked":
            self._chunks = bytearray()
            return True
        if coding:
            request.bad_framing = (f"Transfer-Encoding {coding!r} is not supported; send the body with "
                                   f"Content-Length or Transfer-Encoding: chunked")
            self._length = 0
            return True
        try:
            self._length = int(headers.get("Content-Length", "0"))
        except ValueError:
            self._length = -1
        if self._length < 0 or self._length > MAX_BODY:
            request.too_large = True  # answered 413 (or 400 for a bad length) without reading the body
        return True

    def _read_chunks(self) -> None:
        """Take the chunks that are in, counting the body as it comes.

        The framing is RFC 9112 7.1: ``SIZE[;ext]\\r\\nDATA\\r\\n``... ``0\\r\\n``, trailers, ``\\r\\n``.
        Once the body is over ``MAX_BODY`` the rest is not read.
        """
        buf, request = self._post, self._request
        while not self._done:
            eol = buf.find(b"\r\n")
            if eol < 0:
                if len(buf) > 1024:  # a chunk-size line is a few hex digits
                    request.bad_framing = "a chunk size line of the chunked body runs past 1 KiB"
                    self._done = True
                return
            try:
                size = int(bytes(buf[:eol]).split(b";")[0].strip(), 16)
            except ValueError:
                size = -1
            if size < 0:
                request.bad_framing = f"the chunked body has a bad chunk size line {bytes(buf[:eol][:40])!r}"
                self._done = True
            elif size == 0:  # the last chunk: then trailer lines (ignored) and an empty line
                trailers_end = buf.find(b"\r\n\r\n", eol) if buf[eol + 2:eol + 4] != b"\r\n" else eol
                if trailers_end < 0:
                    return
                request.body = bytes(self._chunks)
                self._done = True
            elif len(self._chunks) + size > MAX_BODY:
                request.too_large = True
                self._done = True
            elif len(buf) < eol + 2 + size + 2:
                return  # the rest of this chunk is still coming
            elif buf[eol + 2 + size:eol + 4 + size] != b"\r\n":
                request.bad_framing = "a chunk of the chunked body is longer than its size line says"
                self._done = True
            else:
                self._chunks += buf[eol + 2:eol + 2 + size]
                del buf[:eol + 4 + size]
