"""Stage-graph runtime benchmark: per-hop overhead, latency under overload, work and waits, allocations, RSS.

There are five measurements. Each runs on a real graph of trivial stages, so what is measured is the runtime.

1. **hop latency** — a paced source through ``--hops`` relay stages, with the pipeline unloaded. For every
   frame it takes the time from one stage's exit to the next stage's entry. That is the ring hand-off and
   thread wake-up, as p50/p99 in µs. It also measures the fast-mode throughput of the same chain.
2. **overload** — a realtime source at ``--fps`` and a relay costing ``--relay-ms``. The sink costs two frame
   periods, a 2× overload. The source has ``max_in_flight=1``. It records end-to-end latency percentiles
   against the bound "one frame period + sum of stage times". It records the frames dropped at the source,
   and each stage's work and waits.
3. **backpressure** — a fast-clock source, a relay costing ``--relay-ms`` and a sink costing ``--sink-ms``.
   They are joined by one-slot ``block`` rings. The sink sets the pace. The telemetry must show the source and
   the relay *waiting on output* for it: ``output_wait``. Their ``work`` must stay their own cost.
4. **allocations** — over ``--frames`` frames after a warm-up. It records the growth of live Python heap
   blocks, by tracemalloc. On CUDA it also counts caching-allocator allocations. Those should be zero: rings are
   preallocated.
5. **RSS** — resident memory sampled over the same run. It should stay flat, within 1 %.

Stage "costs" are ``time.sleep``, not CPU work. A sleep releases the GIL, as a GPU wait does.
"""
from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from typing import Literal

import numpy as np
import torch

from framegraph.models.runtime import default_device
from framegraph.stream import Clock, CountSource, Graph, PortSpec, Stage

from .measure import rss_bytes, stage_times, summary_ms
from .meta import bench_metadata, write_result


class Relay(Stage):
    def __init__(self, name: str, shape, device, cost_ms: float = 0.0):
        super().__init__(name)
        self.inputs = {"x": PortSpec(shape, torch.float32, device)}
        self.outputs = {"x": PortSpec(shape, torch.float32, device)}
        self.cost_s = cost_ms / 1000

    def process(self, inputs, out):
        if self.cost_s:
            time.sleep(self.cost_s)
        out.write("x").data.copy_(inputs["x"].data)


class ProbeSink(Stage):
    """Records each frame's hop gaps into preallocated arrays.

    A gap is from the exit of stage i to the entry of stage i+1. After ``warmup`` frames it can also sample RSS
    and start tracemalloc and CUDA allocation counting."""

    def __init__(self, n: int, n_stages: int, shape, device, cost_ms: float = 0.0, warmup: int = 0,
                 track_memory: bool = False):
        super().__init__("sink")
        self.inputs = {"x": PortSpec(shape, torch.float32, device)}
        self.cost_s = cost_ms / 1000
        self.hop_ns = np.zeros((n, n_stages - 1), np.int64)
        self.count = 0
        self.warmup, self.track_memory = warmup, track_memory
        self.rss = []
        self.cuda_allocs_at_warmup = None
        self.blocks_at_warmup = None

    def process(self, inputs, out):
        enter_ns = time.monotonic_ns()
        f = inputs["x"]
        i = self.ctx.index  # the sink is the last stage; stages 0..i-1 are upstream
        if self.count < len(self.hop_ns):
            ns = f.stage_ns
            self.hop_ns[self.count, : i - 1] = ns[1:i, 0] - ns[: i - 1, 1]
            self.hop_ns[self.count, i - 1] = enter_ns - ns[i - 1, 1]
        if self.cost_s:
            time.sleep(self.cost_s)
        self.count += 1
        if self.track_memory and self.count % 500 == 0:
            self.rss.append((self.count, rss_bytes()))
        if self.track_memory and self.count == self.warmup:
            if torch.cuda.is_available():
                self.cuda_allocs_at_warmup = torch.cuda.memory_stats()["allocation.all.allocated"]
            gc.collect()
            tracemalloc.start()
            self.blocks_at_warmup = _traced_blocks()


def _traced_blocks() -> int:
    return sum(s.count for s in tracemalloc.take_snapshot().statistics("filename"))


def _chain(n: int, hops: int, fps: float, mode: Literal["realtime", "fast"], shape, device, *, relay_ms=0.0,
           sink_ms=0.0, max_in_flight=None, warmup=0, track_memory=False, capacity=2):
    g = Graph(Clock(mode), name="bench")
    src = g.add(CountSource(n, fps=fps, shape=shape, name="source", device=device), max_in_flight=max_in_flight)
    prev = src
    for k in range(hops - 1):
        relay = g.add(Relay(f"relay{k}", shape, device, relay_ms))
        g.connect(prev, relay, capacity=capacity)
        prev = relay
    sink = g.add(ProbeSink(n, hops + 1, shape, device, sink_ms, warmup, track_memory))
    g.connect(prev, sink, capacity=capacity)
    return g, src, sink


def _summary_us(values_us) -> dict:
    """``{"p50", "p95", "p99", "mean", "max"}`` of times in µs. ``{}`` when empty."""
    return {k.removesuffix("_ms"): v for k, v in summary_ms(values_us).items() if k != "count"}


def measure_hops(frames: int, hops: int, fps: float, shape, device) -> dict:
    g, _, sink = _chain(frames, hops, fps, "realtime", shape, device)
    g.run()
    gaps_us = sink.hop_ns[: sink.count].reshape(-1) / 1000.0
    g2, _, sink2 = _chain(frames, hops, fps, "fast", shape, device)
    t0 = time.perf_counter()
    g2.run()
    fast_fps = sink2.count / (time.perf_counter() - t0)
    return {"hops": hops, "frames": sink.count, "source_fps": fps, "payload_shape": list(shape),
            "hop_latency_us": _summary_us(gaps_us), "fast_mode_fps": fast_fps,
            "fast_mode_us_per_frame": 1e6 / fast_fps}


def measure_overload(seconds: float, fps: float, relay_ms: float, device, shape) -> dict:
    period_ms = 1000.0 / fps
    sink_ms = 2 * period_ms
    n = int(seconds * fps)
    g, _, sink = _chain(n, 2, fps, "realtime", shape, device, relay_ms=relay_ms, sink_ms=sink_ms,
                        max_in_flight=1)
    report = g.run()
    bound_ms = period_ms + relay_ms + sink_ms
    e2e = report["end_to_end"]
    e2e_ms = list(g.telemetry.end_to_end.recent())
    return {"source_fps": fps, "frame_period_ms": period_ms, "stage_ms": {"relay0": relay_ms, "sink": sink_ms},
            "bound_ms": bound_ms, "end_to_end_ms": {k: e2e[k] for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")},
            "p99_within_bound": e2e["p99_ms"] <= bound_ms,
            "frames_generated": n, "frames_delivered": report["sink_frames"],
            "dropped_at_source": report["sources"]["source"]["dropped_in_flight_limit"],
            "edge_drops": sum(e["drops"] for e in report["edges"]),
            "latency_first_quarter_p50_ms": float(np.median(e2e_ms[: len(e2e_ms) // 4])) if e2e_ms else None,
            "latency_last_quarter_p50_ms": float(np.median(e2e_ms[-len(e2e_ms) // 4:])) if e2e_ms else None,
            "stages": stage_times(report)}


def measure_backpressure(frames: int, relay_ms: float, sink_ms: float, device, shape) -> dict:
    """Fast source → relay (``relay_ms``) → sink (``sink_ms``) through one-slot block rings.

    Per stage it returns its work and its waits. The source's and the relay's waits on output are the sink's
    pace, not their work."""
    g, _, _ = _chain(frames, 2, 1000.0, "fast", shape, device, relay_ms=relay_ms, sink_ms=sink_ms, capacity=1)
    report = g.run()
    return {"frames": frames, "stage_ms": {"source": 0.0, "relay0": relay_ms, "sink": sink_ms},
            "sink_fps": report["fps"], "stages": stage_times(report)}


def measure_memory(frames: int, hops: int, shape, device, warmup: int) -> dict:
    g, _, sink = _chain(frames, hops, 1000.0, "fast", shape, device, warmup=warmup, track_memory=True)
    slot_ptrs = None
    g.start()
    slot_ptrs = sorted(f.data.data_ptr() for n in g._nodes for rs in n.out_rings.values() for r in rs
                       for f in r.slots)
    g.join()
    blocks_end = _traced_blocks() if tracemalloc.is_tracing() else None
    tracemalloc.stop()
    growth = None if blocks_end is None else blocks_end - sink.blocks_at_warmup
    after = sorted(f.data.data_ptr() for n in g._nodes for rs in n.out_rings.values() for r in rs
                   for f in r.slots)
    cuda_allocs = None
    if sink.cuda_allocs_at_warmup is not None:
        cuda_allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - sink.cuda_allocs_at_warmup
    rss = sink.rss
    first, last = rss[0][1], rss[-1][1]
    return {"frames": frames, "warmup_frames": warmup,
            "ring_slots_reallocated": slot_ptrs != after,
            "python_live_blocks_growth_after_warmup": growth,
            "python_live_blocks_growth_per_frame": None if growth is None else growth / (frames - warmup),
            "cuda_allocations_after_warmup": cuda_allocs,
            "rss_mib_samples": [(n, round(b / 2**20, 2)) for n, b in rss],
            "rss_growth_percent": 100.0 * (last - first) / first}


def figure(data: dict, plt):
    """Hand-off latency per hop, end-to-end latency under overload against its bound, RSS over the frames."""
    fig, axes = plt.subplots(1, 4 if "backpressure" in data else 3, figsize=(18, 4))
    h = data["hop_overhead"]["hop_latency_us"]
    axes[0].bar(["p50", "p95", "p99"], [h["p50"], h["p95"], h["p99"]], color="#4477aa")
    axes[0].set_title(f"hand-off latency per hop (µs), {data['device']}")
    o = data["overload"]
    vals = [o["end_to_end_ms"][k] for k in ("p50_ms", "p95_ms", "p99_ms")]
    axes[1].bar(["p50", "p95", "p99"], vals, color="#ee6677")
    axes[1].axhline(o["bound_ms"], color="k", ls="--", label=f"bound {o['bound_ms']:.0f} ms")
    axes[1].set_title("end-to-end latency under 2× overload (ms)")
    axes[1].legend()
    m = data["memory"]
    xs, ys = zip(*m["rss_mib_samples"])
    axes[2].plot(xs, ys, marker=".")
    axes[2].ticklabel_format(useOffset=False)
    axes[2].set_title(f"RSS over {m['frames']} frames (MiB)")
    axes[2].set_xlabel("frame")
    if "backpressure" in data:  # older results, without work and waits told apart, have no such run
        b = data["backpressure"]
        names = list(b["stages"])
        left = np.zeros(len(names))
        for key, label, color in (("p50_ms", "work", "#4477aa"), ("output_wait_p50_ms", "output wait", "#ccbb44"),
                                  ("input_wait_p50_ms", "input wait", "#bbbbbb")):
            vals = np.array([b["stages"][n][key] or 0.0 for n in names])
            axes[3].barh(names, vals, left=left, color=color, label=label)
            left += vals
        axes[3].invert_yaxis()
        axes[3].set_xlabel("ms per frame (p50)")
        axes[3].set_title(f"backpressure: work and waits per stage (sink {b['stage_ms']['sink']:g} ms)")
        axes[3].legend(fontsize=8)
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    if args.hops < 1:
        raise ValueError(f"--hops must be >= 1, got {args.hops}")
    if args.sink_ms <= 0:
        raise ValueError(f"--sink-ms must be > 0 (the backpressure run's pace), got {args.sink_ms}")
    args.device = args.device or default_device()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    shape = (1024,)
    hop_frames = 300 if args.quick else 2000
    frames = 2000 if args.quick else args.frames
    seconds = 1.0 if args.quick else args.seconds
    result = bench_metadata("runtime")
    result["stage_device"] = args.device
    result["hop_overhead"] = measure_hops(hop_frames, args.hops, 500.0, shape, args.device)
    result["overload"] = measure_overload(seconds, args.fps, args.relay_ms, args.device, shape)
    result["backpressure"] = measure_backpressure(30 if args.quick else 200, args.relay_ms, args.sink_ms, args.device,
                                                  shape)
    result["memory"] = measure_memory(frames, args.hops, shape, args.device, warmup=min(1000, frames // 4))
    png = write_result(result, args.out, figure)
    h, o, m, b = result["hop_overhead"], result["overload"], result["memory"], result["backpressure"]
    print(f"hop latency p50 {h['hop_latency_us']['p50']:.0f} µs, p99 {h['hop_latency_us']['p99']:.0f} µs; "
          f"fast mode {h['fast_mode_fps']:.0f} frames/s through {args.hops} hops")
    print(f"2x overload: e2e p95 {o['end_to_end_ms']['p95_ms']:.1f} ms (bound {o['bound_ms']:.1f} ms), "
          f"{o['dropped_at_source']} dropped at the source, {o['edge_drops']} on edges")
    print("backpressure (work / output wait / input wait, p50 ms): " + "; ".join(
        f"{n} {s['p50_ms']:.1f} / " + " / ".join("-" if s[k] is None else f"{s[k]:.1f}"
                                                 for k in ("output_wait_p50_ms", "input_wait_p50_ms"))
        for n, s in b["stages"].items()))
    print(f"memory: live-block growth {m['python_live_blocks_growth_after_warmup']}, cuda allocations "
          f"{m['cuda_allocations_after_warmup']}, RSS growth {m['rss_growth_percent']:.2f} %")
    print(f"wrote {args.out} and {png}")
    return 0
