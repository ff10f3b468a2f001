"""The demo's process: the framegraph server, the relay, the player files and the Gradio app, one port.

    with serve_demo_in_thread(DemoConfig(port=0)) as demo:    # tests; `framegraph demo` runs it in front
        print(demo.url)                                       # http://127.0.0.1:PORT/

Layout of the demo's port (one FastAPI app run by uvicorn):

- ``/``            the Gradio app (:mod:`.ui`);
- ``/fg/...``      the player (``apps/web/player.html`` + ``app.js`` + ``pcm-worklet.js``), shown in an
                   iframe; ``/fg/ws?tab=ID`` is its WebSocket (:class:`~.relay.Relay` → the server);
                   ``/fg/clip/ID`` serves a clip's PCM16 for the player to stream; ``/fg/idle/NAME.png``
                   the avatar's idle face, the player's picture until the first take.

The framegraph :class:`~framegraph.apps.server.StreamServer` runs in the same process on its own event
loop (``serve_in_thread``), bound to loopback on a free port: the relay and the API's headless takes
are its clients. Each session owns its graph, so tabs never share state. The avatar's bundle is loaded
while the demo starts (imports, weights, identity latent: about 2 s on a CPU), not by the first take.
"""
from __future__ import annotations

import importlib
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlencode

from fastapi import FastAPI, WebSocket
from fastapi.responses import PlainTextResponse, Response

from framegraph.apps.server import ServerConfig, serve_in_thread
from framegraph.apps.server import pipelines
from framegraph.apps.server.app import WEB_ROOT, is_loopback

from .clips import ClipStore
from .relay import Relay

log = logging.getLogger("framegraph.demo")

PLAYER_FILES = {"player.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
                "pcm-worklet.js": "text/javascript; charset=utf-8"}
PORTRAITS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "assets", "portraits")
DEFAULT_PORTRAIT = "astronaut"
# The avatar pipeline's options the demo sets: start option PORTRAIT_OPTION (a portrait's name in
# assets/portraits, sent only when it is not the default) and live option STATE_OPTION (``config``).
PORTRAIT_OPTION = "portrait"
STATE_OPTION = "state"
STATES = ("auto", "speaking", "listening", "idle")


@dataclass
class DemoConfig:
    """What ``framegraph demo`` can set.

    Attributes:
        host / port: where the demo listens (127.0.0.1 by default; port 0 picks a free one).
        pipeline: ``"auto"`` (``avatar`` when the server has it, else ``scope``) or a pipeline name.
        max_sessions: concurrent live sessions (tabs) plus headless takes.
        takes_dir: where take MP4s go (default: a fresh temporary folder).
        video: start options for the video (size, fps, codec); the pipeline's defaults otherwise.
    """

    host: str = "127.0.0.1"
    port: int = 7860
    pipeline: str = "auto"
    max_sessions: int = 8
    takes_dir: str | None = None
    video: dict = field(default_factory=dict)


@dataclass
class PipelineChoice:
    """The pipeline the demo runs, and what the page says about it."""

    name: str
    note: str
    avatar: bool  # takes a portrait and the speaking / listening / idle state

    def start_options(self, video: dict, portrait: str | None = None) -> dict:
        options = dict(video)
        if not self.avatar and "size" not in options:
            options["size"] = "320x240"  # the scope: small and cheap on a CPU
        if self.avatar and portrait and portrait != DEFAULT_PORTRAIT:
            options[PORTRAIT_OPTION] = portrait
        return options

    def warm_up(self) -> None:
        """Load what the first session would otherwise wait for: the avatar's default bundle (shared by
        every session; about 2 s on a CPU, most of a cold first frame's delay)."""
        if self.name == "avatar":
            from framegraph.apps.server.avatar_pipeline import default_avatar, load_bundle

            try:
                load_bundle(default_avatar())
            except Exception as exc:  # noqa: BLE001 - the first session reports it to the page
                log.warning("the avatar could not be loaded ahead of the first take: %s", exc)


def pipeline_available(name: str) -> tuple[bool, str]:
    """Whether the server can run ``name`` (importing its lazy module now, so the first take does not
    wait for it), and why not."""
    if name in pipelines.REGISTRY:
        return True, ""
    module = pipelines.LAZY.get(name)
    if module is None:
        return False, f"no {name!r} pipeline is registered on this server"
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - anything that stops the import means: not available
        return False, f"{module} failed to load ({type(exc).__name__}: {exc})"
    if name not in pipelines.REGISTRY:
        return False, f"{module} did not register {name!r}"
    return True, ""


def choose_pipeline(requested: str = "auto") -> PipelineChoice:
    """``auto``: the avatar when it is available, else the microphone scope, with a note saying which
    runs and why. A named pipeline must be available."""
    if requested == "auto":
        ok, why = pipeline_available("avatar")
        if ok:
            return PipelineChoice("avatar", "Pipeline **avatar**: the talking portrait, driven by the audio "
                                            "you stream.", True)
        return PipelineChoice("scope", f"Pipeline **scope** (fallback): {why}, so the live picture is the "
                                       f"audio scope (waveform + level) instead of a talking portrait. Portrait "
                                       f"and state have no effect on it.", False)
    ok, why = pipeline_available(requested)
    if not ok:
        raise ValueError(f"pipeline {requested!r} is not available: {why}; this server has "
                         f"{sorted(pipelines.available())}")
    avatar = requested == "avatar"
    return PipelineChoice(requested, f"Pipeline **{requested}** (chosen with --pipeline).", avatar)


def portraits() -> list[str]:
    """Portrait names shipped in assets/portraits (image stems), the default first."""
    try:
        names = sorted({os.path.splitext(f)[0] for f in os.listdir(PORTRAITS_DIR)
                        if f.lower().endswith((".png", ".jpg", ".jpeg"))})
    except FileNotFoundError:
        names = []
    return [DEFAULT_PORTRAIT] + [n for n in names if n != DEFAULT_PORTRAIT]


class DemoContext:
    """What the Gradio handlers and the routes share: the server, the relay, the clips, the choice."""

    def __init__(self, config: DemoConfig, server_url: str, choice: PipelineChoice):
        self.config = config
        self.server_url = server_url
        self.choice = choice
        self.takes_dir = config.takes_dir or tempfile.mkdtemp(prefix="framegraph-demo-")
        self.relay = Relay(server_url, self.takes_dir, bind_host=config.host)
        self.clips = ClipStore()
        self.tab_by_session: dict[str, str] = {}
        self.api_takes = 0
        self.idle_faces: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def tab_for(self, session_hash: str | None) -> str:
        """The relay tab of one Gradio page (its session hash), made on first use."""
        key = session_hash or "-"
        with self._lock:
            tab = self.tab_by_session.get(key)
            if tab is None or self.relay.tab(tab) is None:
                tab = self.tab_by_session[key] = self.relay.new_tab()
            return tab

    def player_src(self, tab: str, portrait: str | None = None) -> str:
        """The player iframe's URL (relative to the Gradio page) for ``tab``."""
        query = {"url": f"ws?tab={tab}", "pipeline": self.choice.name,
                 "options": json.dumps(self.choice.start_options(self.config.video, portrait))}
        if self.choice.name == "avatar":
            query["poster"] = f"idle/{portrait or DEFAULT_PORTRAIT}.png"
        return "fg/player.html?" + urlencode(query)

    def idle_face_png(self, portrait: str) -> bytes | None:
        """PNG of the avatar ``portrait`` at rest: its bundle's portrait, the picture its frames are drawn
        into. None when the server has no such avatar."""
        if self.choice.name != "avatar":
            return None
        from PIL import Image

        from framegraph.apps.server.avatar_pipeline import available_avatars, load_bundle

        if portrait not in available_avatars():
            return None
        with self._lock:
            if portrait not in self.idle_faces:
                buf = io.BytesIO()
                Image.fromarray(load_bundle(portrait).portrait.numpy()).save(buf, format="PNG")
                self.idle_faces[portrait] = buf.getvalue()
            return self.idle_faces[portrait]

    def next_api_take_path(self) -> str:
        with self._lock:
            self.api_takes += 1
            n = self.api_takes
        old = os.path.join(self.takes_dir, f"api-take-{n - 4}.mp4")  # Gradio has served it from its cache
        if os.path.exists(old):
            os.remove(old)
        return os.path.join(self.takes_dir, f"api-take-{n}.mp4")


def create_app(ctx: DemoContext):
    """The FastAPI app: player routes, relay WebSocket, clip route, and the Gradio app at ``/``."""
    import gradio as gr

    from .ui import CSS, build_blocks

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

    blocks = build_blocks(ctx)
    return gr.mount_gradio_app(app, blocks, path="/", server_name=ctx.config.host, server_port=ctx.config.port,
                               footer_links=["api"], allowed_paths=[ctx.takes_dir], css=CSS, ssr_mode=False,
                               mcp_server=False, run_history=False)


class DemoHandle:
    """The demo running: the framegraph server on its own thread, uvicorn (relay + Gradio) on another."""

    def __init__(self, config: DemoConfig):
        self.config = config
        self.server = None
        self.ctx: DemoContext | None = None
        self._uvicorn = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 60.0) -> "DemoHandle":
        import uvicorn

        cfg = self.config
        if not is_loopback(cfg.host):
            log.warning("the demo listens on %s: anyone who can reach it can use it (no login)", cfg.host)
        choice = choose_pipeline(cfg.pipeline)
        warm_up = threading.Thread(target=choice.warm_up, name="demo-warm-up", daemon=True)
        warm_up.start()  # alongside the servers' start
        self.server = serve_in_thread(ServerConfig(host="127.0.0.1", port=0, max_sessions=cfg.max_sessions,
                                                   stats_interval_s=1.0)).start()
        self.ctx = DemoContext(cfg, self.server.url, choice)
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

    def __enter__(self) -> "DemoHandle":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_demo_in_thread(config: DemoConfig | None = None) -> DemoHandle:
    """A :class:`DemoHandle` (not started; use it as a context manager or call ``start()``)."""
    return DemoHandle(config or DemoConfig())
