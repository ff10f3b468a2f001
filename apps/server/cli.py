"""``framegraph serve``: the streaming server, WebSocket and WebRTC. The protocol is ``apps/PROTOCOL.md``."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from framegraph.apps.argtypes import check_port_free

from . import pipelines
from .app import ServerConfig, StreamServer


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(host=args.host, port=args.port, token=args.token or None, max_sessions=args.max_sessions,
                        max_message_bytes=args.max_message_bytes, max_messages_per_s=args.max_messages_per_s,
                        allowed_origins=tuple(args.allow_origin), web_root=args.web_root or None,
                        stats_interval_s=args.stats_interval, ice_servers=tuple(args.ice_server),
                        webrtc=not args.no_webrtc, batching=args.batching == "on")


async def serve_until_signalled(config: ServerConfig) -> None:
    """Run until SIGINT or SIGTERM, then close every session. Their graphs are cancelled and joined."""
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
    check_port_free(config.host, config.port)
    asyncio.run(serve_until_signalled(config))
    return 0
