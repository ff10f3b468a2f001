"""framegraph on a Ray Serve cluster: many live sessions across GPUs and machines (``framegraph cluster``).

- :mod:`.settings`: :class:`ClusterSettings`, everything the command sets (light: the command's front reads it).
- :mod:`.gateway`: the front door, places each session on a replica with room (HTTP 307 to the replica's
  own WebSocket; 503 when full) and shows the whole cluster (``/cluster``, ``/metrics``).
- :mod:`.replica`: one ``framegraph serve`` per replica; media goes from it to the client directly, only
  control through Serve handles; drains on scale-down.
- :mod:`.tickets`: one-time admission tickets signed by the front door.
- :mod:`.scaling`: autoscaling on live sessions (a Serve policy).
- :mod:`.deploy`: :func:`start_cluster` / :class:`Cluster`.

Needs ``ray[serve]`` (``pip install framegraph[cluster]``); nothing here is imported by the rest of
framegraph but `framegraph bench server --cluster` (lazily).
"""
from framegraph.apps import exports

__all__ = ["APP", "Cluster", "ClusterSettings", "start_cluster"]
__getattr__ = exports(__name__, {"APP": ".deploy", "Cluster": ".deploy", "start_cluster": ".deploy",
                                 "ClusterSettings": ".settings"})
