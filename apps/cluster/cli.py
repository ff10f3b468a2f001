"""``framegraph cluster``: serve sessions from many replicas on a Ray cluster (Ray Serve), one front door.

    framegraph cluster --replicas 2 --sessions-per-replica 3             # a local Ray cluster on this machine
    ray start --head && framegraph cluster --address auto --min-replicas 1 --max-replicas 8

Clients connect to the printed ``ws://.../ws`` exactly as to ``framegraph serve`` (apps/PROTOCOL.md).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from .settings import ClusterSettings


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
                   help=f"avatar bundles a replica keeps loaded, least recently used go first (default {d.max_bundles})")
    p.add_argument("--drain-grace", type=float, default=d.drain_grace_s,
                   help=f"seconds a stopping replica's sessions may run on (default {d.drain_grace_s:g})")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="browser origin allowed besides the front door's own (repeatable; '*' allows any)")


def settings_from_args(args: argparse.Namespace, gpus_in_cluster: float) -> ClusterSettings:
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else (1.0 if gpus_in_cluster else 0.0)
    replicas = args.replicas or (args.min_replicas or (int(gpus_in_cluster) if gpus else 1))
    return ClusterSettings(host=args.host, port=args.port, token=args.token or None, replicas=max(1, replicas),
                           min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                           sessions_per_replica=args.sessions_per_replica, target_fill=args.target_fill,
                           cpus_per_replica=args.cpus_per_replica, gpus_per_replica=gpus, max_bundles=args.max_bundles,
                           drain_grace_s=args.drain_grace, allowed_origins=tuple(args.allow_origin))


def run(args: argparse.Namespace) -> int:
    try:
        import ray
    except ImportError:
        raise SystemExit("framegraph cluster: error: it needs Ray Serve: pip install 'framegraph[cluster]'") from None
    from .deploy import describe, start_cluster

    if args.max_replicas is None and args.min_replicas is not None:
        raise ValueError("--min-replicas needs --max-replicas (autoscaling bounds)")
    if args.address:
        ray.init(address=args.address, log_to_driver=False, configure_logging=False)
    else:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    settings = settings_from_args(args, ray.cluster_resources().get("GPU", 0.0))
    settings.validate()
    scaling = f" (autoscaling up to {settings.max_replicas})" if settings.autoscaling else ""
    print(f"framegraph cluster: starting {settings.replicas} replica(s) × {settings.sessions_per_replica} sessions"
          f"{scaling} ...", file=sys.stderr, flush=True)
    cluster = start_cluster(settings)
    print(f"framegraph cluster: page {cluster.http_url}  WebSocket {cluster.url}  metrics {cluster.http_url}metrics"
          f"  replicas {cluster.http_url}cluster", file=sys.stderr, flush=True)
    print(describe(cluster.view()), file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print(f"framegraph cluster: shutting down (sessions get {settings.drain_grace_s:g} s to finish)",
          file=sys.stderr, flush=True)
    cluster.stop()
    ray.shutdown()
    print(json.dumps({"stopped": True}), file=sys.stderr)
    return 0
