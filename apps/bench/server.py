"""Streaming-server benchmark: RSS over many sessions, and latency / FPS over a long soak.

    framegraph bench server --out benchmarks/results/cpu/server.json            # 100 sessions + 10-min soak
    framegraph bench server --out /tmp/server.json --quick                       # small, a smoke test
    framegraph bench server --cluster --replicas 1,2 --out FILE.json             # on Ray Serve: see cluster.py
    framegraph bench server --transport websocket,webrtc --out FILE.json         # transports: see transport.py

A real server runs in this process on a loopback port, with ``serve_in_thread``. A real WebSocket client talks
to it: ``framegraph client``'s ``stream_session``. So the RSS figures cover both. Two phases:

1. **sessions** — ``--sessions`` sessions one after another. Each streams ``--session-seconds`` of
   speech-like audio in real time through ``--pipeline``. The default pipeline is ``scope``. RSS is taken
   after each session, after a garbage collection. Its growth is taken from the end of the warm-up to the end.
   The warm-up is the first 10 %.
2. **soak** — one session streaming ``--soak-seconds`` of audio. It records glass-to-glass latency p50/p95
   per minute. Flat means no drift or queue growth. It records frames presented as a fraction of the target
   FPS.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import threading
import time

import numpy as np

from ..client import stream_session
from ..server.app import ServerConfig, serve_in_thread
from . import transport
from .measure import rss_bytes, summary_ms
from .meta import bench_metadata, write_result
from .speech import speech_like


def _framegraph_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("framegraph:"))


def run_sessions(url: str, pipeline: str, n: int, seconds: float) -> dict:
    audio = speech_like(seconds)
    rss, fps, g2g = [], [], []
    for i in range(n):
        s = asyncio.run(stream_session(url, pipeline, {}, audio=audio))
        gc.collect()
        rss.append(rss_bytes())
        fps.append(s["fps"])
        g2g.append(s["glass_to_glass"].get("p50_ms"))
    warm = max(1, n // 10)
    base, last = rss[warm - 1], rss[-1]
    time.sleep(0.5)
    return {"sessions": n, "session_seconds": seconds, "pipeline": pipeline,
            "rss_mib": [round(b / 2**20, 2) for b in rss],
            "rss_growth_percent_after_warmup": 100.0 * (last - base) / base,
            "fps_per_session_median": float(np.median(fps)),
            "glass_to_glass_p50_ms_median": float(np.median([v for v in g2g if v is not None] or [np.nan])),
            "framegraph_threads_left": _framegraph_threads()}


def run_soak(url: str, pipeline: str, seconds: float, bin_s: float) -> dict:
    trace: list[tuple[int, float]] = []
    s = asyncio.run(stream_session(url, pipeline, {}, audio=speech_like(seconds, seed=1), latency_trace=trace))
    if not trace:
        return {"seconds": seconds, "error": "no frames with latency came back", "summary": s}
    t0 = trace[0][0]
    bins: dict[int, list[float]] = {}
    last_full = max(0, int(seconds // bin_s) - 1)  # frames after the last whole bin (the tail) join it
    for ns, ms in trace:
        bins.setdefault(min(int((ns - t0) / 1e9 // bin_s), last_full), []).append(ms)
    per_bin = []
    for k, ms in sorted(bins.items()):
        latency = summary_ms(ms)
        per_bin.append({"from_s": k * bin_s, "frames": len(ms), "p50_ms": latency["p50_ms"],
                        "p95_ms": latency["p95_ms"]})
    target = s["format"]["video"]["fps"]
    return {"seconds": seconds, "pipeline": pipeline, "bin_seconds": bin_s, "per_bin": per_bin,
            "first_bin_p50_ms": per_bin[0]["p50_ms"], "last_bin_p50_ms": per_bin[-1]["p50_ms"],
            "target_fps": target, "fps": s["fps"], "fraction_of_target_fps": s["fps"] / target if target else None,
            "time_to_first_frame_ms": s["time_to_first_frame_ms"], "glass_to_glass": s["glass_to_glass"],
            "video_gaps": s["gaps"]["video"], "errors": s["errors"]}


def figure(data: dict, plt):
    """RSS after each session, and glass-to-glass latency p50 / p95 over the soak.

    A ``--cluster`` result is drawn by :func:`cluster.figure`. A ``--transport`` one is drawn by
    :func:`transport.figure`."""
    if data.get("cluster"):
        from . import cluster  # Ray Serve, an extra: imported only for --cluster
        return cluster.figure(data, plt)
    if data.get("transport_comparison"):
        return transport.figure(data, plt)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    axes[0].plot(data["sessions"]["rss_mib"], marker=".")
    axes[0].set_title(f"RSS after each of {data['sessions']['sessions']} sessions (MiB)")
    axes[0].ticklabel_format(useOffset=False)
    soak = data["soak"]
    if "per_bin" in soak:
        xs = [b["from_s"] for b in soak["per_bin"]]
        axes[1].plot(xs, [b["p50_ms"] for b in soak["per_bin"]], label="p50")
        axes[1].plot(xs, [b["p95_ms"] for b in soak["per_bin"]], label="p95")
        axes[1].legend()
    axes[1].set_title("glass-to-glass latency over the soak (ms)")
    axes[1].set_xlabel("seconds")
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        from . import cluster
        return cluster.run(args)
    if args.transport:
        return transport.run(args)
    sessions, soak = (10, 6.0) if args.quick else (args.sessions, args.soak_seconds)
    if sessions < 2 or soak <= 0:
        raise ValueError("--sessions must be >= 2 and --soak-seconds > 0")
    result = bench_metadata("server")
    with serve_in_thread(ServerConfig(host="127.0.0.1", port=0, web_root=None)) as server:
        result["sessions"] = run_sessions(server.url, args.pipeline, sessions, args.session_seconds)
        result["soak"] = run_soak(server.url, args.pipeline, soak, bin_s=1.0 if soak < 120 else 60.0)
    png = write_result(result, args.out, figure)
    s, k = result["sessions"], result["soak"]
    print(f"{s['sessions']} sessions: RSS growth after warm-up {s['rss_growth_percent_after_warmup']:.2f} %, "
          f"{s['framegraph_threads_left']} runtime threads left")
    if "per_bin" in k:
        print(f"soak {k['seconds']:.0f} s: g2g p50 first {k['first_bin_p50_ms']:.1f} ms → last "
              f"{k['last_bin_p50_ms']:.1f} ms; {k['fps']:.1f} fps = "
              f"{100 * k['fraction_of_target_fps']:.0f} % of target")
    print(f"wrote {args.out} and {png}")
    return 0
