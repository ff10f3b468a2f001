"""framegraph on a Ray Serve cluster: many live sessions across GPUs and machines.

The command is ``framegraph cluster``.

- :mod:`.settings`: :class:`ClusterSettings`, everything the command sets.
  It is light, since the command's front reads it.
- :mod:`.gateway`: the front door. It places each session on a replica with room.
  It answers HTTP 307 to the replica's own WebSocket, or 503 when full.
  It shows the whole cluster on ``/cluster`` and ``/metrics``.
- :mod:`.replica`: one ``framegraph serve`` per replica.
  Media go from it to the client directly. Only control goes through Serve handles.
  It drains on scale-down.
- :mod:`.tickets`: one-time admission tickets signed by the front door.
- :mod:`.scaling`: autoscaling on live sessions, as a Serve policy.
- :mod:`.deploy`: :func:`start_cluster` and :class:`Cluster`.

It needs ``ray[serve]``: ``pip install framegraph[cluster]``.
The rest of framegraph imports nothing here.
The one exception is ``framegraph bench server --cluster``, lazily.
"""
from framegraph.apps import exports

__all__ = ["APP", "Cluster", "ClusterSettings", "start_cluster"]
__getattr__ = exports(__name__, {"APP": ".deploy", "Cluster": ".deploy", "start_cluster": ".deploy",
                                 "ClusterSettings": ".settings"})
