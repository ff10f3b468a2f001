"""``framegraph serve``: the WebSocket streaming server. The protocol is in ``apps/PROTOCOL.md``."""
from __future__ import annotations

import argparse
import os

from framegraph.apps.argtypes import add_config_argument, port
from framegraph.apps.server.config import ServerConfig

IMPLEMENTATION = "framegraph.apps.server.cli"  # its run(args) runs the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}; anything but loopback "
                                                  f"needs --token)")
    p.add_argument("--port", type=port, default=d.port, help=f"port (default {d.port}; 0 picks a free one)")
    p.add_argument("--token", default=os.environ.get("FRAMEGRAPH_TOKEN"),
                   help="shared secret clients present (Authorization: Bearer T, or ?token=T); "
                        "default $FRAMEGRAPH_TOKEN")
    add_config_argument(p, "--max-sessions", d, "max_sessions", "concurrent sessions")
    add_config_argument(p, "--max-message-bytes", d, "max_message_bytes", "largest client message")
    add_config_argument(p, "--max-messages-per-s", d, "max_messages_per_s", "per-connection message rate")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="browser origin allowed besides the server's own, e.g. https://app.example "
                        "(repeatable; '*' allows any)")
    p.add_argument("--web-root", default=d.web_root, help="folder served at / (default: the bundled page)")
    add_config_argument(p, "--stats-interval", d, "stats_interval_s", "seconds between stats messages")
    p.add_argument("--no-webrtc", action="store_true", help="answer no WebRTC offers (clients use the WebSocket)")
    p.add_argument("--batching", choices=["on", "off"], default="off",
                   help="on: the sessions of one video avatar run its generator in one batch per tick, each by its "
                        "frame's deadline (default off: each session alone)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="STUN / TURN server for WebRTC peers, e.g. stun:stun.example.org:3478 or "
                        "turn:USER:PASSWORD@turn.example.org:3478 (repeatable; default: none, host candidates "
                        "only, enough on loopback and a LAN; see docs/webrtc.md)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
