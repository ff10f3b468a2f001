"""A small web server for a Pipecat bot on Pipecat's SmallWebRTC transport, with a browser page to talk to it.

    app = build_app(bot)          # bot(connection: SmallWebRTCConnection) -> awaitable, one per browser session
    Server(app, port=7860).run()  # http://127.0.0.1:7860/

``/`` is the demo page: ``web/index.html`` and ``web/app.js``.
It uses Pipecat's browser client library.
That is ``@pipecat-ai/client-js`` and ``@pipecat-ai/small-webrtc-transport``.
``web/src/build.sh`` bundles them in ``web/pipecat-client.js``.
The page has a media manager that needs no network.
The library's default one loads Daily's call bundle from c.daily.co at run time.
``/client/`` is Pipecat's prebuilt playground, ``pipecat-ai-prebuilt``.
It works when that CDN is reachable.

The routes are those both clients call:

- ``POST /api/offer``.
- ``POST /start`` → a session id.
- Then ``POST`` and ``PATCH /sessions/{id}/api/offer``, for the WebRTC offer and the ICE candidates.

They are served as Pipecat's development runner, ``pipecat.runner.run``, serves them.
Its other transports, rooms and uploads are left out.
Everything is local: host candidates only, and no STUN server is named.
A bot runs as a task of the server's loop, from its connection's offer until its pipeline ends.
"""
from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from loguru import logger

Bot = Callable[[object], Awaitable[None]]
WEB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")  # the demo page and Pipecat's bundled client


def build_app(bot: Bot):
    """The FastAPI app serving ``bot`` to browsers. See the module docstring."""
    from pipecat.transports.smallwebrtc.request_handler import (
        IceCandidate,
        SmallWebRTCPatchRequest,
        SmallWebRTCRequest,
        SmallWebRTCRequestHandler,
    )
    from pipecat_ai_prebuilt.frontend import PipecatPrebuiltUI

    handler = SmallWebRTCRequestHandler()
    sessions: set[str] = set()
    tasks: set[asyncio.Task] = set()

    @asynccontextmanager
    async def lifespan(app):
        yield
        await handler.close()
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    app = FastAPI(lifespan=lifespan)
    app.state.bot_tasks = tasks

    @app.get("/")
    async def root():
        return FileResponse(os.path.join(WEB, "index.html"))

    @app.post("/start")
    async def start():
        session = str(uuid.uuid4())
        sessions.add(session)
        return {"sessionId": session}

    async def on_connection(connection) -> None:
        task = asyncio.create_task(bot(connection), name=f"bot {connection.pc_id}")
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(_log_failure)

    async def offer(data: dict):
        try:
            request = SmallWebRTCRequest.from_dict({k: data[k] for k in data if k in (
                "sdp", "type", "pc_id", "restart_pc", "request_data", "requestData")})
        except TypeError as exc:
            raise HTTPException(400, f"not a WebRTC offer: {exc}") from None
        return await handler.handle_web_request(request=request, webrtc_connection_callback=on_connection)

    async def candidates(data: dict):
        try:
            patch = SmallWebRTCPatchRequest(pc_id=data["pc_id"],
                                            candidates=[IceCandidate(**c) for c in data.get("candidates", [])])
        except (KeyError, TypeError) as exc:
            raise HTTPException(400, f"not an ICE candidate patch: {exc}") from None
        await handler.handle_patch_request(patch)
        return {"status": "success"}

    @app.api_route("/sessions/{session}/api/offer", methods=["POST", "PATCH"])
    async def session_offer(session: str, request: Request):
        if session not in sessions:
            raise HTTPException(404, f"unknown session {session[:40]!r}: POST /start first")
        data = await request.json()
        return await (offer(data) if request.method == "POST" else candidates(data))

    @app.api_route("/api/offer", methods=["POST", "PATCH"])
    async def direct_offer(request: Request):
        data = await request.json()
        return await (offer(data) if request.method == "POST" else candidates(data))

    app.mount("/web", StaticFiles(directory=WEB))
    app.mount("/client", PipecatPrebuiltUI)
    return app


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.opt(exception=task.exception()).error(f"{task.get_name()} failed")


class Server:
    """``app`` served by uvicorn on ``host``:``port``. Port 0 picks a free port.

    Use :meth:`run` in the foreground.
    Or use :meth:`start` and :meth:`stop` on a thread of its own, as tests do.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 7860):
        import uvicorn

        self.app = app
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self._thread: threading.Thread | None = None
        self.host = host

    @property
    def url(self) -> str:
        sock = self._server.servers[0].sockets[0]
        return f"http://{self.host}:{sock.getsockname()[1]}/"

    def run(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve until Ctrl-C. ``on_ready(url)`` is called once listening."""
        async def main():
            task = asyncio.create_task(self._server.serve())
            while not self._server.started and not task.done():
                await asyncio.sleep(0.05)
            if self._server.started and on_ready is not None:
                on_ready(self.url)
            await task
        asyncio.run(main())

    def start(self, timeout_s: float = 30.0) -> str:
        ready = threading.Event()
        self._thread = threading.Thread(target=self.run, args=(lambda _: ready.set(),), daemon=True,
                                        name="framegraph-pipecat-server")
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"the Pipecat demo server did not start within {timeout_s} s")
        return self.url

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
