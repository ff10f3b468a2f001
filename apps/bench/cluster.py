"""Cluster benchmark: framegraph on Ray Serve, run by ``framegraph bench server --cluster``.

    framegraph bench server --cluster --replicas 1,2 --out benchmarks/results/cpu/server_cluster.json

It runs one local Ray cluster in this process with ``ray.init``. Serve's HTTP proxy listens on a loopback
port. Real WebSocket clients connect through real sockets, with ``framegraph client``'s ``stream_session``.
Phases:

1. **replicas** — for each count in ``--replicas``, the cluster application with that many replicas.
   It is ``framegraph cluster``'s ``start_cluster``. Its start time is recorded: deploy until every replica
   reports, and each replica's own start. Then come **sessions at target FPS**. First 1, then 2, 3 …
   concurrent ``--pipeline`` sessions run through the front door. Each step lasts ``--ramp-seconds``. The
   ramp stops when one presents under 90 % of the target FPS, or when the cluster is full. It records the
   last count that held, and that count per replica.
2. **paths** — one session at a time, alternating, ``--rounds`` times each. It records glass-to-glass
   p50 / p95 of three paths. (a) is a plain ``framegraph serve`` in this process. (b) is the cluster path:
   front door → 307 → the replica's own WebSocket. (c) is Serve's WebSocket-capable HTTP proxy. There the
   client goes to the Serve proxy, then a Serve replica relays over loopback to its own ``framegraph serve``.
   (c) is the alternative the cluster did not take. It is measured so the choice rests on numbers.
3. **bundle** — one avatar session through the front door, and the replica's bundle load time.

On one machine the replicas share its cores. "Sessions per replica" then says what the cluster path costs,
not what more machines would add.
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import time

import numpy as np
import websockets
from ray import serve

from ..client import stream_session
from ..cluster import ClusterSettings, start_cluster
from ..server.app import ServerConfig, serve_in_thread
from .measure import summary_ms
from .meta import bench_metadata, write_result
from .speech import speech_like

TARGET_FRACTION = 0.9  # a session "holds" when it presents at least this share of the target FPS
RELAY_APP = "framegraph-bench-relay"


def _replica_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"--replicas {text!r}: expected positive counts separated by commas, e.g. 1,2")
    return counts


async def _concurrent(url: str, pipeline: str, n: int, seconds: float) -> list[dict]:
    return await asyncio.gather(*(stream_session(url, pipeline, {}, audio=speech_like(seconds, seed=i))
                                  for i in range(n)), return_exceptions=True)


def _step(n: int, results: list) -> dict:
    """One concurrency step: did every session hold the target FPS?"""
    fps, g2g, errors = [], [], []
    target = None
    for r in results:
        if isinstance(r, BaseException):
            errors.append(f"{type(r).__name__}: {r}")
            continue
        target = r["format"]["video"]["fps"]
        fps.append(r["fps"])
        g2g.append(r["glass_to_glass"].get("p50_ms"))
        errors += [str(e) for e in r["errors"]]
    held = not errors and len(fps) == n and min(fps) >= TARGET_FRACTION * target
    return {"sessions": n, "target_fps": target, "fps_min": min(fps, default=None),
            "fps_median": float(np.median(fps)) if fps else None,
            "glass_to_glass_p50_ms_median": float(np.median([v for v in g2g if v is not None] or [np.nan])),
            "held": held, "errors": errors[:5]}


def measure_replicas(replicas: int, args, base) -> dict:
    """Start the cluster with ``replicas`` replicas, time it, ramp sessions until one misses the target."""
    settings = ClusterSettings(**{**base, "replicas": replicas})
    t0 = time.perf_counter()
    cluster = start_cluster(settings)
    started_s = time.perf_counter() - t0
    try:
        replica_start = [r["start_s"] for r in cluster.live()]
        steps = []
        for n in range(1, replicas * args.capacity + 1):
            print(f"  {replicas} replica(s): {n} concurrent {args.pipeline} session(s)…", flush=True)
            steps.append(_step(n, asyncio.run(_concurrent(cluster.url, args.pipeline, n, args.ramp_seconds))))
            if not steps[-1]["held"]:
                break
        held = max((s["sessions"] for s in steps if s["held"]), default=0)
    finally:
        cluster.stop()
    return {"replicas": replicas, "deploy_to_all_reporting_s": round(started_s, 3),
            "replica_start_s": replica_start, "steps": steps, "sessions_at_target": held,
            "sessions_at_target_per_replica": held / replicas}


def _relay_deployment():
    """A Serve deployment behind Serve's HTTP proxy that relays one WebSocket to its own framegraph server.

    This is the media path framegraph's cluster does *not* take. It is built here to measure it."""
    from fastapi import FastAPI, WebSocket  # optional: framegraph[cluster] (Serve's ingress)

    api = FastAPI()

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0.5})
    @serve.ingress(api)
    class ServeProxied:
        def __init__(self):
            self.handle = serve_in_thread(ServerConfig(host="127.0.0.1", port=0, web_root=None)).start()

        async def ws(self, client) -> None:
            await client.accept()
            async with websockets.connect(self.handle.server.url, max_size=None) as inner:
                async def upstream():
                    while True:
                        m = await client.receive()
                        if m["type"] == "websocket.disconnect":
                            return await inner.close()
                        await inner.send(m["bytes"] if m.get("bytes") is not None else m["text"])

                async def downstream():
                    async for m in inner:
                        await (client.send_bytes(m) if isinstance(m, bytes) else client.send_text(m))
                    await client.close(code=inner.close_code or 1000)

                tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in tasks:
                    t.cancel()

        # FastAPI reads the parameter's type from the annotation; with postponed annotations it would see the
        # string "WebSocket", which this module's globals cannot resolve (fastapi is imported lazily)
        ws.__annotations__ = {"client": WebSocket, "return": None}
        ws = api.websocket("/ws")(ws)

    return ServeProxied.bind()


def _path_session(url: str, pipeline: str, seconds: float, seed: int) -> list[float]:
    trace: list[tuple[int, float]] = []
    s = asyncio.run(stream_session(url, pipeline, {}, audio=speech_like(seconds, seed=seed), latency_trace=trace))
    if s["errors"] or not trace:
        raise RuntimeError(f"{url}: the session did not stream ({s['errors'] or 'no frames'})")
    return [ms for _, ms in trace[len(trace) // 10:]]  # past the first tenth: the warm-up


def measure_paths(urls: dict[str, str], args) -> dict:
    """Glass-to-glass of one session per path, the paths alternating round by round."""
    samples: dict[str, list[float]] = {name: [] for name in urls}
    for r in range(args.rounds):
        for name, url in urls.items():
            print(f"  path {name}, round {r + 1}/{args.rounds}…", flush=True)
            samples[name] += _path_session(url, args.pipeline, args.path_seconds, seed=r)
    out = {name: {k: summary_ms(ms)[k] for k in ("p50_ms", "p95_ms")} | {"frames": len(ms)}
           for name, ms in samples.items()}
    for name in urls:
        if name != "plain_serve":
            out[name]["added_p50_ms"] = out[name]["p50_ms"] - out["plain_serve"]["p50_ms"]
            out[name]["added_p95_ms"] = out[name]["p95_ms"] - out["plain_serve"]["p95_ms"]
    return out


def measure_bundle(url: str, cluster, seconds: float) -> dict:
    """One avatar session through the front door; the bundle load time the replica recorded."""
    s = asyncio.run(stream_session(url, "avatar", {}, audio=speech_like(seconds, seed=7)))
    bundles = [b for r in cluster.live() for b in r["bundles"]]
    return {"bundles": bundles, "session_fps": s["fps"], "time_to_first_frame_ms": s["time_to_first_frame_ms"],
            "errors": s["errors"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def figure(data: dict, plt):
    """Sessions held per concurrency step and replica count; glass-to-glass per path."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    for rep in data["replicas"]:
        axes[0].plot([s["sessions"] for s in rep["steps"]], [s["fps_min"] or 0 for s in rep["steps"]], marker="o",
                     label=f"{rep['replicas']} replica(s)")
    axes[0].axhline(TARGET_FRACTION * (data["replicas"][0]["steps"][0]["target_fps"] or 0), color="grey", ls=":")
    axes[0].set_xlabel("concurrent sessions")
    axes[0].set_title("slowest session's FPS")
    axes[0].legend()
    names = list(data["paths"])
    xs = np.arange(len(names))
    axes[1].bar(xs - 0.2, [data["paths"][n]["p50_ms"] for n in names], 0.4, label="p50")
    axes[1].bar(xs + 0.2, [data["paths"][n]["p95_ms"] for n in names], 0.4, label="p95")
    axes[1].set_xticks(xs, names)
    axes[1].set_title("glass-to-glass by path (ms)")
    axes[1].legend()
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    try:
        import ray  # optional: framegraph[cluster]
    except ImportError:
        raise ValueError("bench server --cluster needs Ray Serve: pip install 'framegraph[cluster]'") from None

    counts = _replica_counts(args.replicas)
    if args.capacity < 1 or args.rounds < 1 or args.ramp_seconds <= 0 or args.path_seconds <= 0:
        raise ValueError("--capacity and --rounds must be >= 1, --ramp-seconds and --path-seconds > 0")
    result = bench_metadata("server")  # drawn by server.figure, which hands a cluster result to figure() here
    result["cluster"] = True
    result["pipeline"] = args.pipeline
    # a fixed replica count per phase (no autoscaling: it would add a replica during the ramp)
    base = {"port": 0, "sessions_per_replica": args.capacity, "cpus_per_replica": 0.5, "drain_grace_s": 1.0}
    # Ray's CPUs are logical here: replicas, the front door and the relay share this machine's cores.
    ray.init(num_cpus=2 * max(counts) + 2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    proxy_port = _free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": proxy_port})
    try:
        result["replicas"] = [measure_replicas(n, args, base) for n in counts]
        serve.run(_relay_deployment(), name=RELAY_APP, route_prefix="/relay", blocking=False)
        cluster = start_cluster(ClusterSettings(**{**base, "replicas": 1}))
        try:
            with serve_in_thread(ServerConfig(host="127.0.0.1", port=0, web_root=None)) as plain:
                urls = {"plain_serve": plain.url, "cluster_front_door": cluster.url,
                        "serve_http_proxy": f"ws://127.0.0.1:{proxy_port}/relay/ws"}
                result["paths"] = measure_paths(urls, args)
            result["bundle"] = measure_bundle(cluster.url, cluster, seconds=4.0)
        finally:
            cluster.stop()
    finally:
        serve.shutdown()
        ray.shutdown()
    png = write_result(result, args.out, figure)
    for rep in result["replicas"]:
        print(f"{rep['replicas']} replica(s): up in {rep['deploy_to_all_reporting_s']:.1f} s, "
              f"{rep['sessions_at_target']} sessions at ≥ {TARGET_FRACTION:.0%} of target FPS "
              f"({rep['sessions_at_target_per_replica']:.1f} per replica)")
    for name, p in result["paths"].items():
        print(f"{name}: glass-to-glass p50 {p['p50_ms']:.1f} ms, p95 {p['p95_ms']:.1f} ms")
    print(f"bundles: {result['bundle']['bundles']}")
    print(f"wrote {args.out} and {png}")
    return 0
