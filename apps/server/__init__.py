"""WebSocket streaming server: ``framegraph serve``.

Each connection is a session that owns its own stage graph, built by the pipeline registry
(:mod:`.pipelines`) from the client's ``start`` message. The protocol is specified in
``apps/PROTOCOL.md`` and implemented in :mod:`.protocol`; HTTP (``/metrics``, ``/healthz``, the web
page in ``apps/web``) shares the port.

Modules: ``protocol`` (messages, media header), ``pipelines`` (registry, built-in pipelines),
``stages`` (scope, pose input, outbox sink), ``outbox`` (bounded send buffer), ``session`` (one
connection), ``http`` (routes), ``config`` (``ServerConfig``), ``app`` (server, background-thread handle),
``cli`` (``framegraph serve``'s implementation; its options: ``apps/commands/serve.py``). The names below load
from their modules on first use, so ``config`` imports alone.
"""
from framegraph.apps import exports

__all__ = ["ServerConfig", "ServerHandle", "StreamServer", "serve_in_thread", "Pipeline", "add_video_out", "register",
           "Options", "VideoOptions", "option"]
__getattr__ = exports(__name__, {"ServerConfig": ".config", "ServerHandle": ".app", "StreamServer": ".app",
                                 "serve_in_thread": ".app", "Pipeline": ".pipelines", "add_video_out": ".pipelines",
                                 "register": ".pipelines", "Options": ".pipelines", "VideoOptions": ".pipelines",
                                 "option": ".pipelines"})
