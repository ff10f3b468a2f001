"""The demo's relay: the embedded player ↔ the framegraph server, on the demo's own port.

WebRTC is the player's default. Over it, the relay forwards the player's offer and taps the session it opens;
see :mod:`.webrtc_takes`. The WebSocket is the fallback. Over it, the relay passes every message, as below.

The Gradio page and its player come from one origin, the demo's host:port. The player's WebSocket goes to
``/fg/ws?tab=ID`` here. :class:`Relay` passes every message through, unchanged, to a session on the in-process
:class:`~framegraph.apps.server.StreamServer`. That server listens on loopback, on a port of its own. So the
server's protocol, limits, slow-reader drops and glass-to-glass stamps all apply as they are. The relay adds
three things:

- **recording**: what the server sends the player, video + returned audio, is also written to an MP4. The
  writer is :class:`~framegraph.apps.client.Recorder`, on its own thread with a bounded queue. The MP4 is the
  take the user saw and heard. It can be downloaded when the session ends.
- **per-tab state**: each page load has a tab id. The Gradio handlers of that tab look up its current take and
  its finished takes. The current take has live stats from the server's ``stats`` messages.
- **browser checks** before the upgrade: the page must come from this origin. A demo bound to loopback only
  answers a loopback ``Host``, against DNS rebinding.

The relay holds no queue of its own. It awaits each send before reading the next message. So a slow browser
backs up into the server's bounded outbox. That drops and counts as it does for any client.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from framegraph.apps.client import Recorder
from framegraph.apps.server.config import is_loopback
from framegraph.apps.server.protocol import Kind, parse_media

log = logging.getLogger("framegraph.demo")

MAX_TAKES_PER_TAB = 3  # finished MP4s kept per tab (older ones are deleted)


@dataclass
class Take:
    """One player session: from the WebSocket opening to its close."""

    tab: str
    number: int
    path: str
    opened: float = field(default_factory=time.monotonic)
    session: str | None = None
    pipeline: str | None = None
    ready: dict | None = None
    stats: dict | None = None
    ended: str | None = None
    errors: list = field(default_factory=list)
    recorder: object = None
    frames: int = 0
    audio_messages: int = 0
    saved: str | None = None  # the finished MP4 (None: nothing recorded, or still running)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    upstream: object = None  # the relay's WebSocket to the server (a WebSocket take)
    tap: object = None  # the session's tapped transport (a WebRTC take: webrtc_takes.TappedTransport)
    stopping: bool = False  # the demo sent ``stop`` on the page's behalf

    @property
    def live(self) -> bool:
        return not self.closed.is_set()

    def summary(self) -> dict:
        s = self.stats or {}
        return {"take": self.number, "session": self.session, "pipeline": self.pipeline, "live": self.live,
                "seconds": round(time.monotonic() - self.opened, 1), "frames_relayed": self.frames,
                "audio_messages_relayed": self.audio_messages, "server_fps": s.get("fps"),
                "end_to_end_ms": s.get("end_to_end_ms"), "dropped": s.get("dropped"),
                "time_to_first_frame_ms": s.get("time_to_first_frame_ms"), "ended": self.ended,
                "errors": [f"{e.get('code')}: {e.get('message')}" for e in self.errors][-3:], "mp4": self.saved}


@dataclass
class Tab:
    id: str
    live: Take | None = None
    finished: list[Take] = field(default_factory=list)
    count: int = 0


class Relay:
    """Player connections → server sessions, one per connection, recorded per tab.

    Args:
        upstream_url: the server's WebSocket URL, ``ws://127.0.0.1:PORT/ws``.
        takes_dir: where take MP4s are written.
        bind_host: the demo's listening address. On loopback, only loopback ``Host`` headers are served.
    """

    def __init__(self, upstream_url: str, takes_dir: str, bind_host: str = "127.0.0.1"):
        from .webrtc_takes import WebRtcTakes

        self.upstream_url = upstream_url
        self.takes_dir = takes_dir
        self.bind_host = bind_host
        self.tabs: dict[str, Tab] = {}
        self.webrtc = WebRtcTakes(self)  # the server's on_session_opened hook: webrtc.on_session_opened
        os.makedirs(takes_dir, exist_ok=True)

    # ---- tabs ---------------------------------------------------------------------------------------
    def new_tab(self) -> str:
        tab = secrets.token_hex(8)
        self.tabs[tab] = Tab(tab)
        return tab

    def tab(self, tab_id: str | None) -> Tab | None:
        return self.tabs.get(tab_id or "")

    def forget_tab(self, tab_id: str) -> None:
        """The page went away: its finished MP4s are deleted. A live take ends with its socket."""
        tab = self.tabs.pop(tab_id, None)
        if tab is None:
            return
        for take in tab.finished:
            _remove(take.saved)

    def live_sessions(self) -> int:
        return sum(1 for t in self.tabs.values() if t.live is not None)

    # ---- the WebSocket endpoint ---------------------------------------------------------------------
    def refusal(self, headers, tab_id: str | None) -> str | None:
        """Why this browser connection is refused, or None. ``headers``: the upgrade request's."""
        host = headers.get("host", "")
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
            return f"origin {origin!r} is not this demo ({host!r})"
        if is_loopback(self.bind_host) and not is_loopback(urlsplit("//" + host).hostname or ""):
            return f"Host {host!r} is not this machine; the demo only answers localhost"
        if self.tab(tab_id) is None:
            return f"unknown tab {str(tab_id)[:20]!r}: reload the demo page"
        return None

    async def handle(self, ws) -> None:
        """Serve one player connection, a Starlette ``WebSocket`` not yet accepted."""
        tab_id = ws.query_params.get("tab")
        why = self.refusal(ws.headers, tab_id)
        if why is not None:
            log.warning("player connection refused: %s", why)
            await ws.close(code=1008, reason=why[:120])
            return
        tab = self.tabs[tab_id]
        if tab.live is not None and tab.live.live:  # one take per tab: a new player replaces the old
            await self._close_upstream(tab.live)
        await ws.accept()
        try:
            upstream = await connect(self.upstream_url, compression=None, max_size=2**24, open_timeout=10)
        except (InvalidStatus, OSError, TimeoutError) as exc:
            reason = (exc.response.body.decode(errors="replace").strip() if isinstance(exc, InvalidStatus)
                      else f"framegraph server unreachable: {exc}")
            await ws.close(code=1013, reason=reason[:120])
            return
        take = self.new_take(tab)
        take.upstream = upstream

        async def browser_to_server() -> None:
            try:
                while True:
                    msg = await ws.receive()
                    if msg["type"] == "websocket.disconnect":
                        return
                    data = msg.get("bytes")
                    if data is not None and take.stopping:
                        continue  # stop was sent for the page: its audio would only be refused
                    await upstream.send(data if data is not None else msg.get("text", ""))
            except (WebSocketDisconnect, ConnectionClosed, RuntimeError):
                return

        async def server_to_browser() -> None:
            try:
                async for message in upstream:
                    if isinstance(message, str):
                        self.on_control(take, message)
                        await ws.send_text(message)
                    else:
                        self._on_media(take, message)
                        await ws.send_bytes(message)
            except (WebSocketDisconnect, ConnectionClosed, RuntimeError):
                return

        tasks = [asyncio.create_task(browser_to_server()), asyncio.create_task(server_to_browser())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            code, reason = upstream.close_code or 1000, upstream.close_reason or ""
            await upstream.close()
            try:
                await ws.close(code=code if code in (1000, 1008, 1011, 1013) else 1000, reason=reason[:120])
            except (RuntimeError, WebSocketDisconnect):
                pass  # the browser already went
            await self._finish(tab, take)

    # ---- WebRTC: the offer passes through -----------------------------------------------------------
    async def handle_offer(self, request, path: str) -> tuple[int, bytes, str]:
        """``POST /fg/webrtc/offer?tab=ID`` or ``GET /fg/webrtc/config``, forwarded to the server.

        For the offer, ``path`` is ``webrtc/offer``. The request is checked as a player connection first. Then
        :func:`.webrtc_takes.forward_offer` forwards it."""
        from .webrtc_takes import forward_offer

        tab_id = request.query_params.get("tab")
        why = self.refusal(request.headers, tab_id)
        if why is not None:
            log.warning("player offer refused: %s", why)
            return 403, json.dumps({"type": "error", "code": "forbidden", "message": why}).encode(), "application/json"
        body = await request.body() if request.method == "POST" else None
        if body is not None:
            self.webrtc.relay_loop = asyncio.get_running_loop()
            live = self.tabs[tab_id].live
            if live is not None and live.live:  # one take per tab: a new player replaces the old
                await self._close_upstream(live)
        http_url = self.upstream_url.replace("ws://", "http://", 1).rsplit("/", 1)[0] + "/"
        return await asyncio.to_thread(forward_offer, http_url, path, tab_id, body)

    def new_take(self, tab: Tab) -> Take:
        """The tab's next take, its live one from now on."""
        tab.count += 1
        take = Take(tab.id, tab.count, os.path.join(self.takes_dir, f"take-{tab.id[:8]}-{tab.count}.mp4"))
        tab.live = take
        return take

    async def finish(self, take: Take) -> None:
        """A WebRTC take's session ended. Runs on the relay's loop."""
        await self._finish(self.tabs.get(take.tab) or Tab(take.tab), take)

    # ---- what passes through ------------------------------------------------------------------------
    def on_control(self, take: Take, text: str) -> None:
        try:
            msg = json.loads(text)
        except ValueError:
            return
        kind = msg.get("type")
        if kind == "ready":
            take.ready, take.session, take.pipeline = msg, msg.get("session"), msg.get("pipeline")
            video = msg.get("video") or {}
            if video.get("width"):
                take.recorder = Recorder(take.path, width=video["width"], height=video["height"],
                                         fps=video.get("fps", 25), codec=video.get("codec", "jpeg"),
                                         audio=bool(msg.get("audio_out")))
        elif kind == "stats":
            take.stats = msg
        elif kind == "ended":
            take.ended = msg.get("reason")
        elif kind == "error":
            take.errors.append(msg)

    def _on_media(self, take: Take, data: bytes) -> None:
        try:
            header, payload = parse_media(data)
        except Exception:  # noqa: BLE001 - passed on as it is; the player reports it
            return
        self.record(take, header, payload)

    def record(self, take: Take, header, payload) -> None:
        """One frame or audio chunk the page was sent, counted and recorded."""
        if header.kind == Kind.PCM16:
            take.audio_messages += 1
        else:
            take.frames += 1
        if take.recorder is not None:
            take.recorder.put(header, bytes(payload))

    # ---- ending -------------------------------------------------------------------------------------
    async def _close_upstream(self, take: Take) -> None:
        if take.upstream is not None:
            await take.upstream.close()
        elif take.tap is not None:
            self.webrtc.cut(take)

    async def _finish(self, tab: Tab, take: Take) -> None:
        rec, take.recorder = take.recorder, None
        if rec is not None:
            try:
                await asyncio.to_thread(rec.close)
            except Exception as exc:  # noqa: BLE001 - a failed recording must not break the demo
                if rec.frames:
                    log.error("take %s of tab %s: recording failed: %s", take.number, tab.id, exc)
                _remove(rec.partial)
            else:
                if rec.frames:
                    take.saved = take.path
                else:
                    _remove(take.path)
        take.closed.set()
        if tab.live is take:
            tab.live = None
        if take.saved and self.tabs.get(tab.id) is not tab:  # the page went away meanwhile
            _remove(take.saved)
            take.saved = None
        if take.saved:
            tab.finished.append(take)
            for old in tab.finished[:-MAX_TAKES_PER_TAB]:
                _remove(old.saved)
            del tab.finished[:-MAX_TAKES_PER_TAB]

    async def finish_take(self, tab_id: str, timeout_s: float = 15.0) -> Take | None:
        """Stop the tab's live take and wait until its MP4 is written.

        ``stop`` lets buffered audio play out. Returns the newest finished take, or None when there is none."""
        tab = self.tab(tab_id)
        if tab is None:
            return None
        take = tab.live
        if take is not None and take.live:
            take.stopping = True
            try:
                if take.tap is not None:
                    self.webrtc.stop(take)
                else:
                    await take.upstream.send(json.dumps({"type": "stop"}))
            except Exception:  # noqa: BLE001 - the connection is going anyway
                pass
            try:
                await asyncio.wait_for(take.closed.wait(), timeout_s)
            except TimeoutError:
                await self._close_upstream(take)
                await asyncio.wait_for(take.closed.wait(), timeout_s)
        return tab.finished[-1] if tab.finished else None


def _remove(path: str | None) -> None:
    if path:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
