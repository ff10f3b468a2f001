"""Plain HTTP on the WebSocket port, through websockets' ``process_request`` hook.

Routes:

- ``/ws``: the WebSocket endpoint. The token, Origin and session-limit checks happen here, before the upgrade.
- ``POST /webrtc/offer``: a WebRTC session, :mod:`.webrtc`, with the same checks.
- ``/webrtc/config``: the ICE servers a browser should use.
- ``/healthz``.
- ``/metrics``: Prometheus text.
- ``/pipelines`` and ``/pipelines/NAME``: JSON.
- Static files from ``apps/web/``. ``/`` is ``index.html``.

Everything else is 404.
"""
from __future__ import annotations

import email.utils
import hmac
import http
import json
import mimetypes
import os
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers, MultipleValuesError
from websockets.http11 import Request, Response

from . import pipelines
from .config import is_loopback
from .protocol import ProtocolError

if TYPE_CHECKING:  # pragma: no cover
    from .app import StreamServer

WS_PATH = "/ws"
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPES = {".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8"}


def response(status: int, body: bytes | str, content_type: str = "text/plain; charset=utf-8",
             extra: dict | None = None) -> Response:
    """A complete HTTP response. The connection closes after it."""
    if isinstance(body, str):
        body = body.encode()
    status = http.HTTPStatus(status)
    headers = Headers([("Date", email.utils.formatdate(usegmt=True)), ("Connection", "close"),
                       ("Content-Length", str(len(body))), ("Content-Type", content_type),
                       ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")])
    for k, v in (extra or {}).items():
        headers[k] = v
    return Response(status.value, status.phrase, headers, body)


def request_token(request: Request) -> str | None:
    """The token a client presented: ``Authorization: Bearer T`` or ``?token=T``.

    Browsers cannot set headers on a WebSocket, so the query form exists.
    """
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return query_value(request, "token")


def query_value(request: Request, name: str) -> str | None:
    """The first ``?name=`` value of the request's URL, or None when absent."""
    values = parse_qs(urlsplit(request.path).query).get(name)
    return values[0] if values else None


def token_ok(expected: str | None, request: Request) -> bool:
    if not expected:
        return True
    given = request_token(request)
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def origin_ok(request: Request, allowed: tuple[str, ...]) -> bool:
    """Whether the request's Origin is allowed.

    No Origin means not a browser. That is fine: the token guards it.
    Otherwise the page must come from this server, with Origin host:port equal to Host.
    Or it must come from a configured origin. ``*`` allows any.
    """
    try:
        origin = request.headers.get("Origin")
    except MultipleValuesError:
        return False
    if origin is None:
        return True
    if "*" in allowed or origin in allowed:
        return True
    host = request.headers.get("Host", "")
    return bool(host) and urlsplit(origin).netloc.lower() == host.lower()


def host_is_loopback(request: Request) -> bool:
    """The Host header names this machine: ``localhost``, ``127.x``, ``[::1]``.

    Without a token the server only trusts such requests.
    A page whose DNS name was rebound to 127.0.0.1 sends its own name as Host.
    So it passes the same-origin check but not this one.
    """

    try:
        hostname = urlsplit("//" + request.headers.get("Host", "")).hostname or ""
    except (MultipleValuesError, ValueError):
        return False
    return is_loopback(hostname)


def process_request(server: StreamServer, connection, request: Request) -> Response | None:
    """websockets' hook: answer plain HTTP here. Return None to go on with the WebSocket handshake.

    The server's hook is :func:`.webrtc.process_request`. It answers the WebRTC routes and hands the rest here.
    """
    try:
        return _route(server, request)
    except MultipleValuesError as exc:
        return response(400, f"header {exc} given more than once\n")


def _route(server: StreamServer, request: Request) -> Response | None:
    path = urlsplit(request.path).path
    upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
    cfg = server.config
    if path == WS_PATH:
        if not upgrade:
            return response(426, "this is the WebSocket endpoint (protocol: apps/PROTOCOL.md)\n",
                            extra={"Upgrade": "websocket"})
        return admission(server, request)
    if upgrade:
        return response(404, f"no WebSocket at {path}; connect to {WS_PATH}\n")
    if path == "/healthz":
        return response(200, json.dumps({"status": "ok", "sessions": server.session_count,
                                         "max_sessions": cfg.max_sessions}), "application/json")
    if path == "/metrics":
        if not token_ok(cfg.token, request):
            return response(401, "missing or wrong token\n", extra={"WWW-Authenticate": 'Bearer realm="framegraph"'})
        return response(200, server.metrics_text(), PROMETHEUS_TYPE)
    described = pipelines_response(path)
    if described is not None:
        return described
    if path == "/place":  # a cluster's front door names a replica here; a single server places on itself
        return response(200, json.dumps({"url": None}), "application/json")
    return static_file(cfg.web_root, path)


def pipelines_response(path: str) -> Response | None:
    """The pipeline routes, or None for any other path.

    ``/pipelines`` maps name → description for the pipelines this server runs.
    ``/pipelines/NAME`` gives that one's description and its options.
    Each option has its kind, range or choices, default, meaning and whether it is live.
    """
    if path == "/pipelines":
        return response(200, json.dumps(pipelines.available()), "application/json")
    if not path.startswith("/pipelines/"):
        return None
    try:
        return response(200, json.dumps(pipelines.describe(path[len("/pipelines/"):])), "application/json")
    except ProtocolError as exc:
        return response(404, json.dumps(exc.to_message()), "application/json")


def admission(server: StreamServer, request: Request) -> Response | None:
    """The checks before a session, a WebSocket upgrade or a WebRTC offer.

    They are: draining, a cluster ticket, Host, Origin, token, a free slot.
    Returns None when admitted, else the refusal.
    """
    cfg = server.config
    if server.draining:
        server.count_rejected("draining")
        return response(503, f"{server.draining}\n", extra={"Retry-After": "1"})
    if server.redeem_ticket is not None and server.redeem_ticket(query_value(request, "ticket")):
        return _admit(server)  # placed by a cluster's front door (apps/cluster): the ticket is the proof
    if not cfg.token and not host_is_loopback(request):
        server.count_rejected("host")
        return response(403, f"Host {request.headers.get('Host')!r} is not this machine; a server "
                             f"without a token only answers localhost\n")
    if not origin_ok(request, cfg.allowed_origins):
        server.count_rejected("origin")
        return response(403, f"origin {request.headers.get('Origin')!r} is not allowed\n")
    if not token_ok(cfg.token, request):
        server.count_rejected("token")
        return response(401, "missing or wrong token (Authorization: Bearer T, or ?token=T)\n",
                        extra={"WWW-Authenticate": 'Bearer realm="framegraph"'})
    return _admit(server)


def _admit(server: StreamServer) -> Response | None:
    """None while a session slot is free, so the handshake goes on. Else 503."""
    if server.session_count >= server.config.max_sessions:
        server.count_rejected("busy")
        return busy(server)
    return None


def busy(server: StreamServer) -> Response:
    """The one answer for "every session slot is taken": 503, plain text, ``Retry-After``."""
    return response(503, f"server busy: {server.config.max_sessions} sessions already\n", extra={"Retry-After": "5"})


def static_file(root: str | None, path: str) -> Response:
    """A file directly inside ``root``, or 404. No folders, no dot files, no escaping ``root``."""
    name = "index.html" if path in ("/", "") else path.lstrip("/")
    if root is None or "/" in name or "\\" in name or name.startswith(".") or not name:
        return response(404, f"not found: {path}\n")
    full = os.path.join(root, name)
    if not os.path.isfile(full):
        return response(404, f"not found: {path}\n")
    ext = os.path.splitext(name)[1].lower()
    ctype = _TYPES.get(ext) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    with open(full, "rb") as f:
        return response(200, f.read(), ctype)
