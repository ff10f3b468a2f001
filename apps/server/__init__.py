"""WebSocket streaming server: ``framegraph serve``.

Each connection is a session. It owns its own stage graph.
The pipeline registry in :mod:`.pipelines` builds that graph from the client's ``start`` message.
``apps/PROTOCOL.md`` specifies the protocol, and :mod:`.protocol` implements it.
HTTP shares the port: ``/metrics``, ``/healthz`` and the web page in ``apps/web``.

Modules:

- ``protocol``: messages, media header.
- ``pipelines``: registry, built-in pipelines.
- ``stages``: scope, pose input, outbox sink.
- ``outbox``: bounded send buffer.
- ``session``: one connection.
- ``http``: routes.
- ``config``: ``ServerConfig``.
- ``app``: server, background-thread handle.
- ``cli``: ``framegraph serve``'s implementation. Its options live in ``apps/commands/serve.py``.

The names below load from their modules on first use. So ``config`` imports alone.
"""
from framegraph.apps import exports

__all__ = ["ServerConfig", "ServerHandle", "StreamServer", "serve_in_thread", "Pipeline", "add_video_out", "register",
           "Options", "VideoOptions", "option"]
__getattr__ = exports(__name__, {"ServerConfig": ".config", "ServerHandle": ".app", "StreamServer": ".app",
                                 "serve_in_thread": ".app", "Pipeline": ".pipelines", "add_video_out": ".pipelines",
                                 "register": ".pipelines", "Options": ".pipelines", "VideoOptions": ".pipelines",
                                 "option": ".pipelines"})
