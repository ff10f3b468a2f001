"""``framegraph serve``: the streaming server, WebSocket and WebRTC (protocol: ``apps/PROTOCOL.md``)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from . import pipelines
from .app import ServerConfig, StreamServer


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}; anything but loopback "
                                                  f"needs --token)")
    p.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port}; 0 picks a free one)")
    p.add_argument("--token", default=os.environ.get("FRAMEGRAPH_TOKEN"),
                   help="shared secret clients present (Authorization: Bearer T, or ?token=T); "
                        "default $FRAMEGRAPH_TOKEN")
    p.add_argument("--max-sessions", type=int, default=d.max_sessions,
                   help=f"concurrent sessions (default {d.max_sessions})")
    p.add_argument("--max-message-bytes", type=int, default=d.max_message_bytes,
                   help=f"largest client message (default {d.max_message_bytes})")
    p.add_argument("--max-messages-per-s", type=float, default=d.max_messages_per_s,
                   help=f"per-connection message rate (default {d.max_messages_per_s:g})")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="browser origin allowed besides the server's own, e.g. https://app.example "
                        "(repeatable; '*' allows any)")
    p.add_argument("--web-root", default=d.web_root, help="folder served at / (default: the bundled page)")
    p.add_argument("--stats-interval", type=float, default=d.stats_interval_s,
                   help=f"seconds between stats messages (default {d.stats_interval_s:g})")
    p.add_argument("--no-webrtc", action="store_true", help="answer no WebRTC offers (clients use the WebSocket)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="STUN / TURN server for WebRTC peers, e.g. stun:stun.example.org:3478 or "
                        "turn:USER:PASSWORD@turn.example.org:3478 (repeatable; default: none, host candidates "
                        "only, enough on loopback and a LAN; see docs/webrtc.md)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(host=args.host, port=args.port, token=args.token or None, max_sessions=args.max_sessions,
                        max_message_bytes=args.max_message_bytes, max_messages_per_s=args.max_messages_per_s,
                        allowed_origins=tuple(args.allow_origin), web_root=args.web_root or None,
                        stats_interval_s=args.stats_interval, ice_servers=tuple(args.ice_server),
                        webrtc=not args.no_webrtc)


async def serve_until_signalled(config: ServerConfig) -> None:
    """Run until SIGINT / SIGTERM, then close every session (graphs cancelled and joined)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with StreamServer(config) as server:
        print(f"framegraph serve: page {server.http_url}  WebSocket {server.url}  metrics "
              f"{server.http_url}metrics  pipelines: {', '.join(pipelines.available())}", file=sys.stderr,
              flush=True)
        await stop.wait()
        print("framegraph serve: shutting down", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)
    config.validate()  # ValueError → "framegraph serve: error: ..." (exit 2)
    asyncio.run(serve_until_signalled(config))
    return 0
