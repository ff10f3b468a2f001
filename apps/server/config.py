"""What ``framegraph serve`` can set, as :class:`ServerConfig`, with nothing heavy to import.

The command's front shows its defaults. The cluster and the demo reuse it.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

WEB_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "web")


@dataclass
class ServerConfig:
    """Everything ``framegraph serve`` can set.

    Attributes:
        host / port: where to listen. The host defaults to 127.0.0.1. Port 0 lets the OS pick.
        token: required on every WebSocket and on ``/metrics`` when set.
            It is mandatory when ``host`` is not a loopback address.
        max_sessions: concurrent sessions. More are refused with HTTP 503.
        max_message_bytes: a bigger client message gets a ``too_large`` error.
            A message over 4× this closes the connection with code 1009, before it is read whole.
        max_messages_per_s: per connection. A token bucket with bursts of one second's worth.
        allowed_origins: browser origins allowed besides the server's own. ``"*"`` allows any.
        web_root: folder served over HTTP, ``apps/web``. None serves no files.
        stats_interval_s: how often a session sends ``stats``.
        start_timeout_s: a connection must send ``start`` within this.
        send_buffer_bytes: kernel send buffer per connection.
            Small keeps latency low under a slow reader.
            What does not fit is dropped in the outbox, not queued in the kernel.
        outbox_video / outbox_audio / outbox_control: per-session outbox capacities, in messages.
        max_errors: protocol errors in a row before the connection is closed with code 1008.
        close_timeout_s: how long a closing connection waits for the client's side of the close handshake.
            A client that does not read is then cut off.
        shutdown_grace_s: on shutdown, how long clients get to take what is sent and answer the close.
            The close has code 1001. Every connection left after that is cut off.
        webrtc: answer WebRTC offers on ``POST /webrtc/offer``.
            False answers 501, and clients use the WebSocket.
        ice_servers: STUN and TURN URLs for WebRTC peers, as ``turn:USER:PASSWORD@HOST:PORT``.
            None means host candidates only: loopback and LAN.
        webrtc_offers_per_s: WebRTC offers a second from one client address, in bursts of one second's worth.
            More are answered 429.
        webrtc_connect_timeout_s: a WebRTC peer must connect, ICE and DTLS, within this after its offer.
        webrtc_peer_timeout_s: a connected WebRTC peer that sent nothing at all this long is gone.
            It is sent an SCTP heartbeat after a third of it.
        batching: sessions of one model share the process's model service, their calls in one batch.
            A session the model has no room for is refused ``full``.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    max_sessions: int = 4
    max_message_bytes: int = 64 * 1024
    max_messages_per_s: float = 200.0
    allowed_origins: tuple[str, ...] = ()
    web_root: str | None = WEB_ROOT
    stats_interval_s: float = 1.0
    start_timeout_s: float = 10.0
    send_buffer_bytes: int = 128 * 1024
    outbox_video: int = 4
    outbox_audio: int = 25
    outbox_control: int = 16
    max_errors: int = 32
    close_timeout_s: float = 5.0
    shutdown_grace_s: float = 0.5
    webrtc: bool = True
    ice_servers: tuple[str, ...] = ()
    webrtc_offers_per_s: float = 5.0
    webrtc_connect_timeout_s: float = 5.0
    webrtc_peer_timeout_s: float = 4.5
    batching: bool = False

    def validate(self) -> None:
        """Refuse unsafe or impossible settings with a message that says what to change."""
        if not is_loopback(self.host) and not self.token:
            raise ValueError(f"binding {self.host!r} exposes the server beyond this machine: set a token "
                             f"(--token or FRAMEGRAPH_TOKEN), or bind 127.0.0.1")
        for name in ("max_sessions", "max_message_bytes", "max_messages_per_s", "stats_interval_s",
                     "start_timeout_s", "outbox_video", "outbox_audio", "outbox_control", "max_errors",
                     "close_timeout_s", "shutdown_grace_s", "webrtc_offers_per_s", "webrtc_connect_timeout_s",
                     "webrtc_peer_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        ice_servers(self.ice_servers)  # ValueError naming a malformed --ice-server


def ice_servers(urls: tuple[str, ...]) -> list[dict]:
    """``--ice-server`` values → ``[{"urls", "username"?, "credential"?}]``, the browser's RTCIceServer.

    A URL may carry credentials as ``turn:USER:PASSWORD@HOST:PORT[?transport=udp|tcp]``.
    """
    out = []
    for url in urls:
        scheme, sep, rest = url.partition(":")
        if not sep or scheme not in ("stun", "stuns", "turn", "turns"):
            raise ValueError(f"--ice-server {url!r}: expected stun:HOST[:PORT] or turn:[USER:PASSWORD@]HOST[:PORT]")
        if "@" in rest:
            userinfo, host = rest.rsplit("@", 1)
            user, sep, password = userinfo.partition(":")
            if not sep or not user:
                raise ValueError(f"--ice-server {url!r}: credentials go as USER:PASSWORD@HOST")
            out.append({"urls": f"{scheme}:{host}", "username": user, "credential": password})
        else:
            out.append({"urls": url})
    return out


def is_loopback(host: str) -> bool:
    """True for a loopback name or address: 127.0.0.0/8, ::1, localhost."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
