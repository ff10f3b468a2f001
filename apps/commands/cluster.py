"""``framegraph cluster``: serve sessions from many replicas on a Ray cluster. It runs on Ray Serve, behind one front
door."""
from __future__ import annotations

import argparse
import os

from framegraph.apps.argtypes import add_config_argument
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
    add_config_argument(p, "--sessions-per-replica", d, "sessions_per_replica", "session slots of one replica")
    add_config_argument(p, "--target-fill", d, "target_fill", "autoscaling keeps replicas about this full")
    add_config_argument(p, "--cpus-per-replica", d, "cpus_per_replica", "CPU cores each replica claims")
    p.add_argument("--gpus-per-replica", type=float, default=None,
                   help="GPUs each replica claims (default 1 when the Ray cluster has GPUs, else 0)")
    add_config_argument(p, "--max-bundles", d, "max_bundles",
                        "avatar bundles a replica keeps loaded, least recently used go first")
    add_config_argument(p, "--drain-grace", d, "drain_grace_s", "seconds a stopping replica's sessions may run on")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="browser origin allowed besides the front door's own (repeatable; '*' allows any)")
    p.add_argument("--batching", choices=["on", "off"], default="off",
                   help="on: as framegraph serve --batching on, per replica; a replica whose model is full sends "
                        "the session on to another (default off)")
