"""The demo's process: the framegraph server, the relay, the player files and the Gradio app, one port.

    with serve_demo_in_thread(DemoConfig(port=0)) as demo:    # tests; `framegraph demo` runs it in front
        print(demo.url)                                       # http://127.0.0.1:PORT/

The demo's port serves one FastAPI app, run by uvicorn. Its layout:

- ``/`` is the Gradio app, :mod:`.ui`.
- ``/fg/...`` is the player, shown in an iframe. It is ``apps/web/player.html`` + ``app.js`` + ``webrtc.js`` +
  ``pcm-worklet.js``.
- ``/fg/webrtc/offer?tab=ID`` takes its WebRTC offer. The offer is forwarded to the server. The session is
  tapped for the take; see :mod:`.webrtc_takes`.
- ``/fg/ws?tab=ID`` is its WebSocket, the fallback: :class:`~.relay.Relay` → the server.
- ``/fg/clip/ID`` serves a clip's PCM16 for the player to stream.
- ``/fg/idle/NAME.png`` is the avatar's idle face, the player's picture until the first take.

The framegraph :class:`~framegraph.apps.server.StreamServer` runs in the same process on its own event loop,
with ``serve_in_thread``. It is bound to loopback on a free port. The relay and the API's headless takes are its
clients. Each session owns its graph, so tabs never share state. The avatar's bundle is loaded while the demo
starts, not by the first take. That covers imports, weights and the identity latent.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time

import gradio as gr
import uvicorn
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import PlainTextResponse, Response

from framegraph.apps.server import ServerConfig, serve_in_thread
from framegraph.apps.server.config import WEB_ROOT, is_loopback
from framegraph.apps.server.loop_thread import StartedInWith

from .context import DemoConfig, DemoContext, choose_pipeline
from .ui import CSS, build_blocks

log = logging.getLogger("framegraph.demo")

PLAYER_FILES = {"player.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
                "webrtc.js": "text/javascript; charset=utf-8", "pcm-worklet.js": "text/javascript; charset=utf-8"}


def create_app(ctx: DemoContext):
    """The FastAPI app: player routes, relay WebSocket, clip route, and the Gradio app at ``/``."""
    app = FastAPI(title="framegraph demo", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/fg/{name}")
    def player_file(name: str):
        if name not in PLAYER_FILES:
            return PlainTextResponse(f"not found: /fg/{name}\n", status_code=404)
        with open(os.path.join(WEB_ROOT, name), "rb") as f:
            return Response(f.read(), media_type=PLAYER_FILES[name], headers={"Cache-Control": "no-store"})

    @app.get("/fg/clip/{clip_id}")
    def clip(clip_id: str):
        data = ctx.clips.get(clip_id)
        if data is None:
            return PlainTextResponse(f"no clip {clip_id[:24]!r} (clips are kept for a while only)\n", status_code=404)
        return Response(data, media_type="application/octet-stream", headers={"Cache-Control": "no-store"})

    @app.get("/fg/idle/{portrait}.png")
    def idle_face(portrait: str):
        png = ctx.idle_face_png(portrait)
        if png is None:
            return PlainTextResponse(f"no idle face for {portrait[:40]!r}: the demo runs {ctx.choice.name!r} with "
                                     f"no such avatar\n", status_code=404)
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.websocket("/fg/ws")
    async def player_socket(ws: WebSocket):
        await ctx.relay.handle(ws)

    @app.post("/fg/webrtc/offer")
    async def player_offer(request: Request):
        status, body, content_type = await ctx.relay.handle_offer(request, "webrtc/offer")
        return Response(body, status_code=status, media_type=content_type, headers={"Cache-Control": "no-store"})

    @app.get("/fg/webrtc/config")
    async def player_ice_config(request: Request):
        status, body, content_type = await ctx.relay.handle_offer(request, "webrtc/config")
        return Response(body, status_code=status, media_type=content_type, headers={"Cache-Control": "no-store"})

    blocks = build_blocks(ctx)
    return gr.mount_gradio_app(app, blocks, path="/", server_name=ctx.config.host, server_port=ctx.config.port,
                               footer_links=["api"], allowed_paths=[ctx.takes_dir], css=CSS, ssr_mode=False,
                               mcp_server=False, run_history=False)


class DemoHandle(StartedInWith):
    """The demo running: the framegraph server on its own thread, and uvicorn with relay + Gradio on another."""

    def __init__(self, config: DemoConfig):
        self.config = config
        self.server = None
        self.ctx: DemoContext | None = None
        self._uvicorn = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 60.0) -> DemoHandle:
        cfg = self.config
        if not is_loopback(cfg.host):
            log.warning("the demo listens on %s: anyone who can reach it can use it (no login)", cfg.host)
        choice = choose_pipeline(cfg.pipeline)
        warm_up = threading.Thread(target=choice.warm_up, name="demo-warm-up", daemon=True)
        warm_up.start()  # alongside the servers' start
        self.server = serve_in_thread(ServerConfig(host="127.0.0.1", port=0, max_sessions=cfg.max_sessions,
                                                   stats_interval_s=1.0)).start()
        self.ctx = DemoContext(cfg, self.server.url, choice)
        self.server.server.on_session_opened = self.ctx.relay.webrtc.on_session_opened  # the player's WebRTC takes
        app = create_app(self.ctx)
        self._uvicorn = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                                      ws_max_size=1 << 20, lifespan="on",
                                                      timeout_graceful_shutdown=3))
        self._uvicorn.install_signal_handlers = lambda: None  # the caller (CLI or test) owns signals
        self._thread = threading.Thread(target=self._uvicorn.run, name="demo-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                self.server.stop()
                raise OSError(f"the demo could not listen on {cfg.host}:{cfg.port} (in use?)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the demo did not start within {timeout_s:g} s")
            time.sleep(0.05)
        warm_up.join()
        return self

    @property
    def port(self) -> int:
        return self._uvicorn.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"

    def wait(self) -> None:
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.server is not None:
            self.server.stop()
        if self.ctx is not None and self.config.takes_dir is None:  # our temporary folder: gone with us
            shutil.rmtree(self.ctx.takes_dir, ignore_errors=True)


def serve_demo_in_thread(config: DemoConfig | None = None) -> DemoHandle:
    """A :class:`DemoHandle`, not started. Use it as a context manager, or call ``start()``."""
    return DemoHandle(config or DemoConfig())
