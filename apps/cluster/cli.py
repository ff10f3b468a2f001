"""``framegraph cluster``: serve sessions from many replicas on a Ray cluster, with one front door.

It runs on Ray Serve. For example::

    framegraph cluster --replicas 2 --sessions-per-replica 3             # a local Ray cluster on this machine
    ray start --head && framegraph cluster --address auto --min-replicas 1 --max-replicas 8

Clients connect to the printed ``ws://.../ws`` exactly as to ``framegraph serve``. See apps/PROTOCOL.md.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from .deploy import describe, start_cluster
from .settings import ClusterSettings


def settings_from_args(args: argparse.Namespace, gpus_in_cluster: float) -> ClusterSettings:
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else (1.0 if gpus_in_cluster else 0.0)
    replicas = args.replicas or (args.min_replicas or (int(gpus_in_cluster) if gpus else 1))
    return ClusterSettings(host=args.host, port=args.port, token=args.token or None, replicas=max(1, replicas),
                           min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                           sessions_per_replica=args.sessions_per_replica, target_fill=args.target_fill,
                           cpus_per_replica=args.cpus_per_replica, gpus_per_replica=gpus, max_bundles=args.max_bundles,
                           drain_grace_s=args.drain_grace, allowed_origins=tuple(args.allow_origin),
                           batching=args.batching == "on")


def run(args: argparse.Namespace) -> int:
    try:
        import ray  # optional: framegraph[cluster]
    except ImportError:
        raise SystemExit("framegraph cluster: error: it needs Ray Serve: pip install 'framegraph[cluster]'") from None

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
