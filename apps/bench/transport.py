"""Transport benchmark: the WebSocket and WebRTC side by side, run by ``framegraph bench server --transport``.

    framegraph bench server --transport websocket,webrtc --out benchmarks/results/cpu/server_transport.json
    framegraph bench server --transport websocket,webrtc --transport-seconds 4 --pipelines scope --out /tmp/t.json

``framegraph serve`` runs as its own process in a network namespace; see apps/bench/network.py. It runs once
behind a clean veth pair. That is the kernel's own path, as loopback. It runs once behind the impairment,
``--impairment``. The default is 2 % loss and 30 ± 30 ms each way.

Real clients stream each pipeline for ``--transport-seconds``. They are ``framegraph client``'s sessions,
WebSocket and WebRTC. One session runs at a time, and the transports take turns. First comes a short untimed
session of each pipeline on each transport. It covers imports, model loads and codec set-up. Per session:

- **glass-to-glass** p50 / p95, for pipelines with audio input: ``scope`` and ``avatar``. It starts at the client's
  capture of the audio behind a frame. It ends when the frame is decoded (WebRTC) or received. The WebSocket client does
  not decode, so its figure leaves out a decode. The ``testcard`` takes no audio. Its figure starts at the frame's
  source, on the server's monotonic clock. It ends at receipt. Client and server share this host's clock.
- **first frame**: offer or connect → the first frame.
- **server CPU**: the server process's CPU time over the session's wall time. It is in % of one core.
- **bytes per second** on the wire, each way. These are the link's counters: IP packets, headers included.

With ``--repeat N`` each cell is N sessions, and each figure is their median. See :func:`combine`. The
transports still take turns, session by session. The sessions are kept in the JSON. A single session's impaired
p95 varies from run to run.

Targets are from issue #31. On the clean link, WebRTC's glass-to-glass p50 is within the WebSocket's + 30 ms.
Under impairment, its p95 is below the WebSocket's. The JSON says, per pipeline, whether each was met.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from framegraph.apps.commands.bench.server import PIPELINES

from ..client import stream_session
from ..client_webrtc import stream_session_webrtc
from .meta import bench_metadata, write_result
from .network import Impairment, namespace_link, server_process
from .speech import speech_like

TRANSPORTS = ("websocket", "webrtc")
LOOPBACK_MARGIN_MS = 30.0


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise ValueError(f"{what} {text!r}: expected a comma-separated list of {', '.join(allowed)}")
    return names


def _impairment(text: str) -> Impairment | None:
    if text == "none":
        return None
    try:
        loss, delay, jitter = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--impairment {text!r}: expected LOSS,DELAY,JITTER (e.g. 2,30,30) or 'none'") from None
    return Impairment(loss, delay, jitter)


def _session(url: str, transport: str, pipeline: str, seconds: float) -> dict:
    audio = speech_like(seconds, seed=3) if pipeline in ("scope", "avatar") else None
    options = {"seconds": seconds, "size": "320x240"} if pipeline == "testcard" else {}
    if transport == "websocket":
        options["codec"] = "h264"  # as on WebRTC, where H.264 is negotiated
        return asyncio.run(stream_session(url, pipeline, options, audio=audio, end_timeout_s=30))
    return asyncio.run(stream_session_webrtc(url, pipeline, options, audio=audio, end_timeout_s=30))


def measure(server, link, transport: str, pipeline: str, seconds: float) -> dict:
    """One session: its latency, first frame, frames, stalls, the server's CPU and the wire's bytes."""
    cpu0, wire0, t0 = server.cpu_seconds(), link.wire_bytes(), time.monotonic()
    s = _session(server.url, transport, pipeline, seconds)
    cpu1, wire1, wall = server.cpu_seconds(), link.wire_bytes(), time.monotonic() - t0
    g2g, source = s["glass_to_glass"], s["source_to_glass_same_host"]
    latency = g2g if g2g.get("count") else source
    return {
        "latency_kind": "glass_to_glass" if g2g.get("count") else "source_to_glass_same_host",
        "latency_p50_ms": latency.get("p50_ms"), "latency_p95_ms": latency.get("p95_ms"),
        "latency_count": latency.get("count", 0),
        "first_frame_ms": s["time_to_first_frame_ms"], "frames": s["video_frames"], "fps": s["fps"],
        "target_fps": s["format"]["video"]["fps"], "longest_stall_ms": s["longest_stall_ms"],
        "server_cpu_percent": round(100 * (cpu1 - cpu0) / wall, 1), "wall_s": round(wall, 2),
        "bytes_per_s": {k: round((wire1[k] - wire0[k]) / wall) for k in wire0},
        "ended": s["ended"], "errors": s["errors"][:3],
    }


# the per-session figures a cell of several sessions reports as their median
MEDIAN_FIELDS = ("latency_p50_ms", "latency_p95_ms", "first_frame_ms", "frames", "fps", "longest_stall_ms",
                 "server_cpu_percent", "wall_s")


def combine(sessions: list[dict]) -> dict:
    """One cell of ``repeat`` sessions. One session is returned as it is.

    It holds the median of each of :data:`MEDIAN_FIELDS` over them. It holds the median bytes per second. The sessions
    themselves go under ``"sessions"``. ``"failed_sessions"`` counts those that showed no frame or reported an
    error. A median would hide them."""
    if len(sessions) == 1:
        return sessions[0]
    cell = dict(sessions[-1])
    cell["failed_sessions"] = sum(1 for m in sessions if not m["frames"] or m["errors"])
    for key in MEDIAN_FIELDS:
        values = [m[key] for m in sessions if m[key] is not None]
        cell[key] = statistics.median(values) if values else None
    cell["bytes_per_s"] = {k: round(statistics.median(m["bytes_per_s"][k] for m in sessions))
                           for k in sessions[0]["bytes_per_s"]}
    cell["errors"] = [e for m in sessions for e in m["errors"]][:3]
    cell["ended"] = next((m["ended"] for m in sessions if m["ended"] != "finished"), "finished")
    return cell | {"repeat": len(sessions), "sessions": sessions}


def run_condition(impairment: Impairment | None, transports: list[str], pipelines: list[str],
                  seconds: float, repeat: int = 1) -> dict:
    """Every pipeline over every transport behind one link, ``repeat`` sessions each.

    A cell is their :func:`combine`. The transports take turns per pipeline, session by session."""
    runs: dict[str, dict] = {}
    with namespace_link(impairment) as link, server_process(link) as server:
        for pipeline in pipelines:
            for transport in transports:  # warm-up: not measured
                _session(server.url, transport, pipeline, 2.0)
            sessions: dict[str, list] = {t: [] for t in transports}
            for _ in range(repeat):
                for transport in transports:
                    sessions[transport].append(m := measure(server, link, transport, pipeline, seconds))
                    print(f"  {link.describe()[:40]:40} {pipeline:8} {transport:9} {m['latency_kind'][:6]} "
                          f"p50 {m['latency_p50_ms']} p95 {m['latency_p95_ms']} ms, first frame "
                          f"{m['first_frame_ms']} ms, {m['frames']} frames, CPU {m['server_cpu_percent']} %, "
                          f"{m['bytes_per_s']['server_to_client'] / 1000:.0f} kB/s down", flush=True)
            runs[pipeline] = {t: combine(sessions[t]) for t in transports}
        return {"link": link.describe(), "method": link.method, "runs": runs}


def targets(result: dict) -> dict:
    """Per pipeline: WebRTC p50 ≤ WebSocket p50 + 30 ms on the clean link. WebRTC p95 < WebSocket p95 impaired."""
    out = {}
    for pipeline, runs in result["conditions"]["clean"]["runs"].items():
        ws, rtc = runs.get("websocket"), runs.get("webrtc")
        if not (ws and rtc and ws["latency_p50_ms"] is not None and rtc["latency_p50_ms"] is not None):
            continue
        entry = {"clean_p50_gap_ms": round(rtc["latency_p50_ms"] - ws["latency_p50_ms"], 1)}
        entry["clean_p50_within_30_ms"] = entry["clean_p50_gap_ms"] <= LOOPBACK_MARGIN_MS
        impaired = result["conditions"].get("impaired", {}).get("runs", {}).get(pipeline, {})
        if impaired.get("websocket", {}).get("latency_p95_ms") is not None and \
                impaired.get("webrtc", {}).get("latency_p95_ms") is not None:
            entry["impaired_p95_ms"] = {t: impaired[t]["latency_p95_ms"] for t in ("websocket", "webrtc")}
            entry["impaired_webrtc_p95_better"] = impaired["webrtc"]["latency_p95_ms"] < impaired["websocket"][
                "latency_p95_ms"]
        failed = {f"{name} {t}": m["failed_sessions"] for name, c in result["conditions"].items()
                  for t, m in c["runs"].get(pipeline, {}).items() if m.get("failed_sessions")}
        if failed:
            entry["failed_sessions"] = failed
        out[pipeline] = entry
    return out


def figure(data: dict, plt):
    """Latency p50 (bar) and p95 (tick) per pipeline and transport, one panel per link."""
    conditions = list(data["conditions"])
    fig, axes = plt.subplots(1, len(conditions), figsize=(5.5 * len(conditions), 3.6), squeeze=False)
    for ax, name in zip(axes[0], conditions):
        runs = data["conditions"][name]["runs"]
        labels, p50, p95 = [], [], []
        for pipeline, by_transport in runs.items():
            for transport, m in by_transport.items():
                labels.append(f"{pipeline}\n{transport}")
                p50.append(m["latency_p50_ms"] or 0)
                p95.append(m["latency_p95_ms"] or 0)
        xs = range(len(labels))
        ax.bar(xs, p50, label="p50")
        ax.scatter(xs, p95, color="k", marker="_", s=200, label="p95")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_title(f"{name}: {data['conditions'][name]['link'][:50]}", fontsize=8)
        ax.set_ylabel("latency (ms)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    transports = _names(args.transport, TRANSPORTS, "--transport")
    pipelines = _names(args.pipelines, PIPELINES, "--pipelines")
    impairment = _impairment(args.impairment)
    if args.transport_seconds < 2:
        raise ValueError(f"--transport-seconds {args.transport_seconds:g}: expected at least 2")
    result = bench_metadata("server")
    result |= {"transport_comparison": True, "transports": transports, "pipelines": pipelines,
               "session_seconds": args.transport_seconds, "repeat": args.repeat, "conditions": {}}
    result["conditions"]["clean"] = run_condition(None, transports, pipelines, args.transport_seconds, args.repeat)
    if impairment is not None:
        result["conditions"]["impaired"] = run_condition(impairment, transports, pipelines, args.transport_seconds,
                                                         args.repeat)
    result["targets"] = targets(result)
    result["load_average_after_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]
    png = write_result(result, args.out, figure)
    for pipeline, t in result["targets"].items():
        print(f"{pipeline}: WebRTC p50 − WebSocket p50 on the clean link {t['clean_p50_gap_ms']} ms "
              f"(≤ 30: {t['clean_p50_within_30_ms']}); impaired p95 {t.get('impaired_p95_ms')} "
              f"(WebRTC better: {t.get('impaired_webrtc_p95_better')})"
              + (f"; sessions that failed: {t['failed_sessions']}" if t.get("failed_sessions") else ""))
    print(f"wrote {args.out} and {png}")
    return 0

