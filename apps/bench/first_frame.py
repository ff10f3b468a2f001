"""A session's first frame after the model is loaded, against its steady per-frame latency.

The first frame is measured after preload, cold or warm, eager or compiled. The steady latency is per frame, or
per chunk.

    framegraph bench first_frame --out benchmarks/results/cpu/first_frame.json
    framegraph bench first_frame --pipelines generate --runtimes torch,compiled --out out/ff.json

Each configuration runs in a fresh Python process. A cold start is a new process: nothing imported, no kernel
called yet. It has three timed steps:

1. **preload**: build the model, with random weights at the pipeline's architecture. When ``warm``, also run
   its pipeline's ``warm()``. That sends a dummy chunk or a short stretch of silence through every stage. It
   runs at the session's shape. The server's bundle preload does the same. So do ``framegraph generate``'s model load
   and the demo's start.
2. **first frame**: a session's graph starts. This is the time until its first frame reaches the sink. It is
   what a user waits for. That is the graph's start, the audio look-ahead, and the first frame through every
   stage.
   ``graph_start_s`` is the graph's start within it: rings, worker threads, each stage's setup.
   ``first_capture_s`` is when the source captured what the first unit came from, at its end. What came
   before it went through the pipeline one frame at a time. The steady frames do the same. An avatar's audio
   look-ahead is an example.
3. **steady**: the rest of the session, frames one at a time. The source has ``max_in_flight=1``. Each frame
   is alone in the pipeline. So its latency is the pipeline's, not a queue's. The figure is the median
   end-to-end latency of frames after the first ``--warmup``. For generate it is of chunks.

Configurations are per pipeline and per runtime:

- ``generate``: random Wan at ``--config``, 4 steps, per chunk. The default is tiny at 64x96; ``1.3b`` on a
  GPU.
- ``avatar``: the shipped portrait bundle, per frame.
- ``video_avatar``: a video avatar with random weights, per frame. It has the trained bundles' architecture. It
  runs once per region of ``--video-region``.

The runtimes are ``torch`` and ``compiled``. Each runs without warm-up and with it. The compiled runtime runs a
second time with the same cache folder. That is a restart: its preload reads the compiled kernels back instead
of compiling. The cache folder, ``FRAMEGRAPH_CACHE``, is a fresh temporary one per pipeline and region. So the
first compiled run compiles from nothing.

With ``--repeat N`` the whole sequence runs N times. The compiled runtime's first run gets a new, empty cache
folder each time. Each configuration keeps the figures of its median run, by first frame / steady ratio. For an
even N that is the lower middle one. Every run's ratio is kept beside them.

Target: after preload, the first frame within 1.5x the steady latency. It is ``first_over_steady`` in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from framegraph.models.avatar import RunSettings, build_avatar_graph, load_avatar, warm_avatar
from framegraph.models.avatar.video.bundle import random_video_avatar
from framegraph.models.generate import build_generate_graph, default_dtype
from framegraph.models.runtime import default_device
from framegraph.stream.files import write_json

from ..commands.bench.first_frame import PIPELINES, RUNTIMES
from .generate import build_model
from .launches import Drain, _audio_source
from .meta import ASSETS, bench_metadata, write_result

TARGET = 1.5


# ---- one configuration, in its own process --------------------------------------------------------------------------
def _generate(args) -> dict:
    t0 = time.perf_counter()
    gm = build_model("wan", args.config, args.device, default_dtype(args.device), args.vae)
    gg = build_generate_graph(gm, size=tuple(args.size), chunks=args.frames, timesteps=(1000, 750, 500, 250),
                              denoiser_runtime=args.runtime, vae_runtime=args.runtime, source_in_flight=1,
                              device=args.device)
    gg.denoiser.set_prompt_embeds(torch.randn(gm.prompt_tokens, gm.family.text_dim(gm.transformer)), name="random")
    sink = gg.graph.add(Drain(gg.decode.outputs["video"]))
    gg.graph.connect(gg.decode, sink, "video", "video", capacity=8)
    warm_s = gg.warm() if args.warm else None
    preload = time.perf_counter() - t0
    return _session(gg.graph, sink, preload, warm_s, unit="chunk")


def _avatar(args) -> dict:
    t0 = time.perf_counter()
    if args.pipeline == "avatar":
        avatar = load_avatar(f"{ASSETS}/avatars/astronaut")
        avatar.reference_latent()
    else:
        avatar = random_video_avatar(n_frames=16, region_size=args.video_region[0],
                                     generator_channels=(24, 48, 96, 96))
    cpu = args.device == "cpu"
    settings = RunSettings(runtime=args.runtime, device=args.device, torch_threads=1 if cpu else None)
    warm_s = warm_avatar(avatar, settings) if args.warm else None
    preload = time.perf_counter() - t0
    ag = build_avatar_graph(avatar, _audio_source(args.frames / avatar.fps + 0.3), audio_sink=None, max_in_flight=1,
                            settings=settings)
    sink = ag.graph.add(Drain(ag.video.outputs["video"]))
    ag.graph.connect(ag.video, sink, "video", "video")
    return _session(ag.graph, sink, preload, warm_s, unit="frame")


def _session(graph, sink, preload_s: float, warm_s, *, unit: str) -> dict:
    """Run a session. Returns the first frame's time from the graph's start, and each unit's latency.

    A unit is what one source frame became: a chunk, or a frame. Its end-to-end latency starts at the source's
    capture time of what it came from. It ends at its first frame's arrival at the sink."""
    arrivals: dict[int, tuple[int, int]] = {}  # source seq -> (arrival ns, capture ns) of its first frame
    inner = sink.process

    def process(inputs, out):
        frame = inputs[next(iter(inputs))]
        arrivals.setdefault(frame.seq, (time.monotonic_ns(), frame.capture_ns))
        return inner(inputs, out)

    sink.process = process
    started = time.monotonic_ns()
    graph.start()
    running = time.monotonic_ns()
    graph.join()
    units = [arrivals[k] for k in sorted(arrivals)]
    return {"unit": unit, "preload_s": preload_s, "warm_s": warm_s, "first_frame_s": (units[0][0] - started) / 1e9,
            "graph_start_s": (running - started) / 1e9, "first_capture_s": (units[0][1] - started) / 1e9,
            "unit_latencies_s": [(a - c) / 1e9 for a, c in units], "units": len(units), "frames": sink.frames}


def _one(args) -> dict:
    if args.device == "cpu":
        torch.set_num_threads(1)
    return _generate(args) if args.pipeline == "generate" else _avatar(args)


# ---- the bench: every configuration in a subprocess -----------------------------------------------------------------


def _configurations(pipelines, runtimes, video_regions):
    """(pipeline, runtime, warm, start, video region or None) for every run.

    The torch runtime runs without, then with, a warm-up. The compiled one runs with a warm-up on an empty
    cache, so it compiles. It runs again on the cache it left, as a restart. Then it runs without a warm-up.
    That first frame pays what the warm-up would have: tracing, and the cache read back."""
    for pipeline in pipelines:
        for region in video_regions if pipeline == "video_avatar" else [None]:
            for runtime in runtimes:
                if runtime == "compiled":
                    yield pipeline, runtime, True, "warm, empty cache", region
                    yield pipeline, runtime, True, "warm, cache on disk (a restart)", region
                    yield pipeline, runtime, False, "cold, cache on disk", region
                else:
                    yield pipeline, runtime, False, "cold", region
                    yield pipeline, runtime, True, "warm", region


def _run_configuration(args, pipeline, runtime, warm, cache, region) -> dict:
    cmd = [sys.executable, "-P", "-m", "framegraph.apps.cli", "bench", "first_frame", "--out", os.devnull, "--one",
           "--pipeline", pipeline, "--runtime", runtime, "--frames", str(args.frames), "--device", args.device,
           "--video-region", str(region or args.video_region[0]), "--config", args.config,
           "--size", "x".join(str(v) for v in args.size)] + (["--warm"] if warm else []) + (
        ["--vae", args.vae] if args.vae else [])
    env = {**os.environ, "FRAMEGRAPH_CACHE": cache}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:], "process_s": time.perf_counter() - t0}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out | {"process_s": time.perf_counter() - t0}


def _summarise(r: dict, warmup: int) -> dict:
    if "error" in r:
        return r
    steady = sorted(r["unit_latencies_s"][1 + warmup:])
    median = steady[len(steady) // 2] if steady else None
    r["steady_latency_s"] = median
    r["first_unit_latency_s"] = r["unit_latencies_s"][0]  # the first unit's own latency, as the steady ones are timed
    r["first_over_steady"] = r["first_frame_s"] / median if median else None
    r["meets_target"] = r["first_over_steady"] is not None and r["first_over_steady"] <= TARGET
    return r


def _median_run(runs: list[dict]) -> dict:
    """Of a configuration's runs, the one with the median first frame / steady ratio.

    Each run is in a fresh process. If any run failed, the first failed one is returned. Every run's ratio is in
    ``first_over_steady_runs``. A first frame is one sample, and it varies from process to process."""
    failed = [r for r in runs if "error" in r or r["first_over_steady"] is None]
    if failed:
        return failed[0]
    ranked = sorted(runs, key=lambda r: r["first_over_steady"])
    return ranked[(len(ranked) - 1) // 2] | {"runs": len(runs),
                                              "first_over_steady_runs": [r["first_over_steady"] for r in runs]}


def figure(data: dict, plt):
    """Per configuration: first frame and steady latency, on a log scale. The 1.5x target is a tick."""
    rows = [c for c in data["configurations"] if "first_frame_s" in c]
    fig, ax = plt.subplots(figsize=(9, 0.38 * max(len(rows), 4) + 1))
    labels = [f"{c['pipeline']}{' ' + str(c['video_region']) if 'video_region' in c else ''} · {c['runtime']} · "
              f"{c['start']}" for c in rows]
    y = list(range(len(rows)))[::-1]
    ax.barh([v + 0.2 for v in y], [c["first_frame_s"] * 1e3 for c in rows], 0.4, label="first frame")
    ax.barh([v - 0.2 for v in y], [(c["steady_latency_s"] or 0) * 1e3 for c in rows], 0.4, label="steady latency")
    ax.scatter([TARGET * (c["steady_latency_s"] or 0) * 1e3 for c in rows], y, marker="|", s=200, color="k",
               label=f"{TARGET}x steady (target)")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("ms")
    ax.legend(fontsize=7)
    ax.set_title(f"first frame after preload on {data['device']}", fontsize=9)
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    args.device = args.device or default_device()
    if args.one:
        print(json.dumps(_one(args)))
        return 0
    pipelines = [p for p in args.pipelines.split(",") if p]
    runtimes = [r for r in args.runtimes.split(",") if r]
    bad = [p for p in pipelines if p not in PIPELINES] + [r for r in runtimes if r not in RUNTIMES]
    if bad:
        raise ValueError(f"unknown {bad}: --pipelines of {PIPELINES}, --runtimes of {RUNTIMES}")
    result = bench_metadata("first_frame") | {"target_first_over_steady": TARGET, "frames": args.frames,
                                              "warmup_units": args.warmup, "repeat": args.repeat,
                                              "render_device": args.device,
                                              "generate": {"config": args.config, "size_hw": args.size,
                                                           "vae": args.vae}, "configurations": []}
    configurations = list(_configurations(pipelines, runtimes, args.video_region))
    runs: list[list[dict]] = [[] for _ in configurations]
    for rep in range(args.repeat):  # the whole sequence again: a compiled runtime's first run finds an empty cache
        caches = {}
        for i, (pipeline, runtime, warm, start, region) in enumerate(configurations):
            name = pipeline if region is None else f"{pipeline} at {region} px"
            print(f"{name} {runtime} {start}" + (f" (run {rep + 1} of {args.repeat})" if args.repeat > 1 else "")
                  + " ...", flush=True)
            cache = caches.setdefault(name, tempfile.mkdtemp(prefix=f"framegraph-bench-cache-{pipeline}-"))
            r = _summarise(_run_configuration(args, pipeline, runtime, warm, cache, region), args.warmup)
            runs[i].append(r | {"load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()]})
            # each run on disk at once: a run cut at a deadline (a GPU lease) keeps what it measured
            write_json(args.out, result | {"partial": "cut before the last run", "runs_so_far": [
                {"pipeline": c[0], "runtime": c[1], "warm": c[2], "start": c[3], "video_region": c[4], "runs": t}
                for c, t in zip(configurations, runs) if t]})
            print(f"  failed: {r['error'][-400:]}" if "error" in r else
                  f"  preload {r['preload_s']:.2f} s, first frame {r['first_frame_s'] * 1e3:.0f} ms (graph start "
                  f"{r['graph_start_s'] * 1e3:.1f} ms), steady {(r['steady_latency_s'] or 0) * 1e3:.0f} ms per "
                  f"{r['unit']} -> {r['first_over_steady']:.2f}x ({'meets' if r['meets_target'] else 'misses'} "
                  f"{TARGET}x)", flush=True)
    for (pipeline, runtime, warm, start, region), tried in zip(configurations, runs, strict=True):
        r = _median_run(tried) | {"pipeline": pipeline, "runtime": runtime, "warm": warm, "start": start}
        if region is not None:
            r["video_region"] = region
        result["configurations"].append(r)
    png = write_result(result, args.out, figure)
    print(f"wrote {args.out} and {png}")
    return 0
