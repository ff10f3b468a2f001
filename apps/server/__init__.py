"""WebSocket streaming server: ``framegraph serve``.

Each connection is a session that owns its own stage graph, built by the pipeline registry
(:mod:`.pipelines`) from the client's ``start`` message. The protocol is specified in
``apps/PROTOCOL.md`` and implemented in :mod:`.protocol`; HTTP (``/metrics``, ``/healthz``, the web
page in ``apps/web``) shares the port.

Modules: ``protocol`` (messages, media header), ``pipelines`` (registry, built-in pipelines),
``stages`` (scope, pose input, outbox sink), ``outbox`` (bounded send buffer), ``session`` (one
connection), ``http`` (routes), ``app`` (server, config, background-thread handle), ``cli``.
"""
from .app import ServerConfig, ServerHandle, StreamServer, serve_in_thread
from .cli import add_arguments, run
from .pipelines import Options, Pipeline, add_video_out, register, video_options

__all__ = ["ServerConfig", "ServerHandle", "StreamServer", "serve_in_thread", "add_arguments", "run", "Options",
           "Pipeline", "add_video_out", "register", "video_options"]
