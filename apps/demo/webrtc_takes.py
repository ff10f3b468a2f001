"""The demo's player over WebRTC: its offer goes through the demo's port, its media straight to the server.

The player, ``apps/web/player.html``, sends its offer to ``/fg/webrtc/offer?tab=ID`` on the demo's own origin.
:func:`forward_offer` passes it on, unchanged, to the in-process server's ``/webrtc/offer``. The tab goes in the
query. It returns the server's answer. RTP and the data channel then run between the browser and the server.
ICE uses host candidates: the demo's machine or its LAN. Across NATs the player falls back to the relayed
WebSocket.

The relay still sees the take. The server calls :meth:`WebRtcTakes.on_session_opened` with each new session.
When the session's offer named a tab, its transport is wrapped in a :class:`TappedTransport`. That hands the take
what the server sends the page: ``ready``, ``stats``, ``ended``, and video and audio for the MP4. It also lets
the relay speak for the page with ``stop``, as it does over the WebSocket.
"""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:  # pragma: no cover
    from .relay import Relay, Take


class TappedTransport:
    """A WebRTC session's transport, ``inner``, that also reports to the relay's ``take``.

    It reports every control message and media item it sends, and its end. It runs on the server's event loop.
    The relay's own state is touched on the relay's loop, ``relay_loop``."""

    def __init__(self, inner, relay: Relay, take: Take, relay_loop: asyncio.AbstractEventLoop):
        self.inner, self.relay, self.take, self.relay_loop = inner, relay, take, relay_loop
        self._injected: asyncio.Queue[str] = asyncio.Queue()
        self._pending: asyncio.Future | None = None
        self._ended = False

    def __getattr__(self, name):  # everything else is the inner transport's (start_inputs, request, ...)
        return getattr(self.inner, name)

    def inject(self, text: str, loop: asyncio.AbstractEventLoop) -> None:
        """A control message as if the page had sent it. Any thread; ``loop`` is the server's."""
        loop.call_soon_threadsafe(self._injected.put_nowait, text)

    async def recv(self) -> str | bytes:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.inner.recv())
        injected = asyncio.ensure_future(self._injected.get())
        try:
            await asyncio.wait([self._pending, injected], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not injected.done():
                injected.cancel()
        if injected.done() and not injected.cancelled():
            return injected.result()
        pending, self._pending = self._pending, None
        return pending.result()

    async def send_text(self, text: str) -> None:
        await self.inner.send_text(text)
        self.relay.on_control(self.take, text)

    async def send_media(self, item) -> int:
        n = await self.inner.send_media(item)
        self.relay.record(self.take, item.header, item.payload)
        return n

    async def close(self, code: int, reason: str) -> None:
        await self.inner.close(code, reason)

    def abort(self) -> None:
        self.inner.abort()

    async def shut(self) -> None:
        """The session is over and the take is finished. The WebRTC session's runner calls it last."""
        if self._pending is not None:
            self._pending.cancel()
        await self.inner.shut()
        if not self._ended:
            self._ended = True
            asyncio.run_coroutine_threadsafe(self.relay.finish(self.take), self.relay_loop)


class WebRtcTakes:
    """The relay's side of WebRTC takes: the server hook that taps a tab's session, and stopping one."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.relay_loop: asyncio.AbstractEventLoop | None = None  # set when the first offer passes through
        self.server_loop: asyncio.AbstractEventLoop | None = None

    def on_session_opened(self, session) -> None:
        """The server's hook, on its loop: a session whose offer names a known tab becomes that tab's take."""
        request = getattr(session.transport, "request", None)
        tab_id = parse_qs(urlsplit(getattr(request, "path", "")).query).get("tab", [None])[0]
        tab = self.relay.tab(tab_id)
        if tab is None or self.relay_loop is None or not hasattr(session.transport, "start_inputs"):
            return  # not the player's WebRTC session (the relay's own WebSocket sessions carry no tab)
        self.server_loop = session.loop
        take = self.relay.new_take(tab)
        session.transport = take.tap = TappedTransport(session.transport, self.relay, take, self.relay_loop)

    def stop(self, take: Take) -> None:
        """``stop`` for the page, into the session. Buffered audio still plays out."""
        if take.tap is not None and self.server_loop is not None:
            take.tap.inject(json.dumps({"type": "stop"}), self.server_loop)

    def cut(self, take: Take) -> None:
        if take.tap is not None and self.server_loop is not None:
            self.server_loop.call_soon_threadsafe(take.tap.abort)


def forward_offer(server_http_url: str, path: str, tab_id: str, body: bytes | None) -> tuple[int, bytes, str]:
    """POST ``body`` to, or GET, ``path`` on the server, with the tab in the query.

    ``path`` is ``webrtc/offer`` or ``webrtc/config``. Returns the status, body and content type of its answer,
    a refusal included."""
    url = f"{server_http_url}{path}?tab={tab_id}"
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, body, headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "application/json")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "text/plain")
    except OSError as exc:
        return 502, f"framegraph server unreachable: {exc}\n".encode(), "text/plain"

