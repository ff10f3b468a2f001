"""``framegraph cluster``: serve sessions from many replicas on a Ray cluster (Ray Serve), one front door."""
from __future__ import annotations

import argparse
import os

from framegraph.apps.cluster.settings import ClusterSettings

IMPLEMENTATION = "framegraph.apps.cluster.cli"  # its run(args) runs the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ClusterSettings()
    p.add_argument("--address", default=None,
                   help="Ray cluster to deploy on (e.g. 'auto' after `ray start --head`, or ray://HOST:10001); "
                        "default: start a local one on this machine")
    p.add_argument("--host", default=d.host, help=f"front door address (default {d.host}; anything but loopback "
                                                  f"needs --token)")
    p.add_argument("--port", type=int, default=d.port, help=f"front door port (default {d.port}; 0 picks one)")
    p.add_argument("--token", default=os.environ.get("FRAMEGRAPH_TOKEN"),
                   help="shared secret clients present at the front door; default $FRAMEGRAPH_TOKEN")
    p.add_argument("--replicas", type=int, default=None,
                   help="replicas to run (fixed; default: one per GPU of the Ray cluster, else 1); with "
                        "--max-replicas, the starting count")
    p.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas (default 1)")
    p.add_argument("--max-replicas", type=int, default=None,
                   help="autoscaling on live sessions up to this many replicas (default: no autoscaling)")
    p.add_argument("--sessions-per-replica", type=int, default=d.sessions_per_replica,
                   help=f"session slots of one replica (default {d.sessions_per_replica})")
    p.add_argument("--target-fill", type=float, default=d.target_fill,
                   help=f"autoscaling keeps replicas about this full (default {d.target_fill})")
    p.add_argument("--cpus-per-replica", type=float, default=d.cpus_per_replica,
                   help=f"CPU cores each replica claims (default {d.cpus_per_replica:g})")
    p.add_argument("--gpus-per-replica", type=float, default=None,
                   help="GPUs each replica claims (default 1 when the Ray cluster has GPUs, else 0)")
    p.add_argument("--max-bundles", type=int, default=d.max_bundles,
                   help=f"avatar bundles a replica keeps loaded, least recently used go first "
                        f"(default {d.max_bundles})")
    p.add_argument("--drain-grace", type=float, default=d.drain_grace_s,
                   help=f"seconds a stopping replica's sessions may run on (default {d.drain_grace_s:g})")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="browser origin allowed besides the front door's own (repeatable; '*' allows any)")
