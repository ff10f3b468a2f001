"""Pipecat avatar benchmark: ``FramegraphAvatar`` in real Pipecat pipelines against the bare avatar graph.

    framegraph bench pipecat --runtime torch,onnx --agents 1,2 --out benchmarks/results/cpu/pipecat.json

It runs per runtime and per number of concurrent agents. All agents share one process and one event loop. That
is how a Pipecat bot server runs its sessions. Three runs:

1. N Pipecat pipelines: ``PipelineWorker`` s on one ``WorkerRunner``. Each is a feeder → ``FramegraphAvatar`` →
   a recorder, from ``pipecat_agent``. The feeder plays eSpeak NG speech as a streaming TTS pushes it. It sends
   20 ms ``TTSAudioRawFrame`` s at 24 kHz, at real time. They come between ``TTSStartedFrame`` and
   ``TTSStoppedFrame``.
2. N bare avatar graphs, fed the same speech at real time on the same runtime. They are built as the server
   builds them. That is ``PushAudioSource`` → ``build_avatar_graph`` → a sink stamping each frame's arrival.
3. Per runtime, one pipeline fed the same speech all at once: ``push: "at_once"``. That is a fast TTS sending a
   whole reply.

Measured, per agent:

- ``fps``: images a second reaching the recorder after the first second. It holds the output rate whatever
  happens. ``unique_fps`` counts pictures the models made, not repeats of the last one. The models skip frames
  when the CPU cannot keep up. The target is on these.
- ``latency_ms``: a TTS audio frame's arrival at the avatar → the image of its time at the recorder. It counts
  speech images. For the bare graph, it is the 20 ms chunk pushed → its frame at the sink. ``added_delay_ms``
  is Pipecat p50 − bare p50.
- audio to mouth, three figures. ``av_push_gap_ms`` is each audio frame's arrival at the recorder − its image's.
  ``stamp_offset_ms`` is audio pts − its image's pts. ``mouth_lag_frames`` is for portrait bundles. It is the lag
  at which the mouth's openness best follows the loudness of the audio out.
- ``audio_after_image``: the share of audio frames that reach the recorder with or after their image. Their
  image is the one of their frame period. The target is all of them. ``lead_ms`` is the most one came before it;
  ``late_ms`` the most after. ``image_gap_ms``: the longest wait between two images at the recorder, until the
  ``EndFrame``. The target is ≤ two frame periods.

The issue's target: 25 fps at the 256² output, on 2 CPU cores, with ONNX. The added delay over the bare graph
must stay ≤ 150 ms.
"""
from __future__ import annotations

import math
import os
import tempfile
import threading
import time

import numpy as np
import torch

from framegraph.apps.bundles import load_bundle_at
from framegraph.apps.pipecat import FramegraphAvatar
from framegraph.models.avatar import PortraitAvatar, RunSettings, build_avatar_graph
from framegraph.models.avatar.eval.synthetic import mouth_openness
from framegraph.models.avatar.int8 import DEFAULT_INT8, DEFAULT_MODE, quantize_export
from framegraph.models.avatar.portrait.onnx import export_avatar
from framegraph.models.runtime import RUNTIMES
from framegraph.models.synth.resample import resample
from framegraph.stream import Clock, Graph, PortSpec, Stage
from framegraph.stream.media import PushAudioSource

from . import pipecat_agent
from .measure import summary_ms
from .meta import bench_metadata, write_result
from .pipecat_agent import Agent, analyse, audio_rms_per_image, best_lag, pictures, split, utterance
from .pipecat_agent import run as run_agents
from .speech import SAMPLE_RATE, speech

TTS_RATE = 24_000
CHUNK = 320
TARGET = {"fps": 25.0, "added_delay_ms": 150.0, "runtime": "onnx", "output": [256, 256]}


def run(args) -> int:
    runtimes = [r.strip() for r in args.runtime.split(",") if r.strip()]
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad or not runtimes:
        raise ValueError(f"--runtime {args.runtime!r}: expected some of {RUNTIMES}")
    agents = args.agents
    avatar = load_bundle_at(args.avatar)
    audio16, described = speech(args.seconds)
    result = {**bench_metadata("pipecat"), "settings": {"avatar": args.avatar, "runtimes": runtimes, "agents": agents,
                                                         "seconds": args.seconds, "tts_rate": TTS_RATE},
              "speech": described, "output_size": [avatar.width, avatar.height], "fps_native": avatar.fps,
              "target": TARGET, "rows": []}
    with tempfile.TemporaryDirectory(prefix="fg-bench-pipecat-") as tmp:
        exports = {}
        for runtime in runtimes:
            if runtime != "torch":
                exports[runtime], result[f"export_s_{runtime}"] = _export(avatar, args.onnx, tmp, runtime)
        for runtime in runtimes:
            for n in agents:
                print(f"[pipecat] {runtime}, {n} agent(s): bare graph …", flush=True)
                bare = measure_bare(avatar, audio16, n, runtime, exports.get(runtime))
                print(f"[pipecat] {runtime}, {n} agent(s): Pipecat pipelines …", flush=True)
                piped = measure_pipecat(args.avatar, audio16, n, runtime, exports.get(runtime))
                result["rows"].append(_row(runtime, n, bare, piped))
                _print_row(result["rows"][-1])
            print(f"[pipecat] {runtime}: Pipecat pipeline, the speech pushed at once …", flush=True)
            at_once = measure_pipecat(args.avatar, audio16, 1, runtime, exports.get(runtime), at_once=True)
            result["rows"].append(_row(runtime, 1, [], at_once, push="at_once"))
            _print_row(result["rows"][-1])
    result["target_met"] = _target_met(result)
    png = write_result(result, args.out, figure)
    print(f"wrote {args.out} and {png}; target (onnx, 1 agent: >= 25 fps, <= 150 ms added): {result['target_met']}")
    return 0


def _export(avatar, given: str | None, tmp: str, runtime: str) -> tuple[str, float | None]:
    if given:
        return given, None
    out = os.path.join(tmp, "onnx")
    started = time.perf_counter()
    if not os.path.isfile(os.path.join(out, "manifest.json")):
        export_avatar(avatar, out)
    if runtime == "onnx-int8":
        quantize_export(avatar, out, DEFAULT_MODE, models=DEFAULT_INT8)
    return out, round(time.perf_counter() - started, 1)


# ---- the bare avatar graph -------------------------------------------------------------------------------
def measure_bare(avatar, audio16: np.ndarray, n: int, runtime: str, onnx_dir: str | None) -> list[dict]:
    """N server-like avatar graphs, each fed ``audio16`` at real time by its own thread.

    Per graph it returns its frames' arrival against the push of their audio."""
    class Arrivals(Stage):
        def __init__(self, h, w):
            super().__init__("arrivals")
            self.inputs = {"video": PortSpec((h, w, 3), torch.uint8)}
            self.got: list[tuple[int, int]] = []

        def process(self, inputs, out):
            self.got.append((inputs["video"].pts, time.monotonic_ns()))

    runs = []
    for i in range(n):
        g = Graph(Clock("realtime"), name=f"bare{i}")
        src = g.add(PushAudioSource(max_buffer_ms=500, name="mic"), max_in_flight=8)
        sink = Arrivals(avatar.height, avatar.width)
        settings = RunSettings(runtime=runtime, device="cpu", live=True, torch_threads=1, onnx_dir=onnx_dir)
        build_avatar_graph(avatar, src, sink=sink, audio_sink=None, graph=g, settings=settings,
                           video_policy="drop_oldest")
        g.start()
        runs.append({"graph": g, "src": src, "sink": sink,
                     "pushed": np.zeros(math.ceil(len(audio16) / CHUNK), np.int64)})

    def feed(r):
        t0 = time.monotonic()
        for k in range(len(r["pushed"])):
            delay = t0 + k * CHUNK / SAMPLE_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            r["pushed"][k] = time.monotonic_ns()
            r["src"].push(audio16[k * CHUNK:(k + 1) * CHUNK])
        r["src"].close()

    threads = [threading.Thread(target=feed, args=(r,), name="bench-pipecat-feed") for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = []
    for r in runs:
        r["graph"].join(30)
        out.append(_bare_summary(r, avatar.fps))
    return out


def _bare_summary(r: dict, fps: float) -> dict:
    got = r["sink"].got
    if len(got) < 2:
        return {"frames": len(got)}
    pts = np.array([p for p, _ in got])
    t = np.array([a for _, a in got], np.int64)
    k = np.clip(pts * SAMPLE_RATE // 48_000 // CHUNK, 0, len(r["pushed"]) - 1)
    latency = (t - r["pushed"][k]) / 1e6
    keep = t >= t[0] + 1e9
    span = (t[keep][-1] - t[keep][0]) / 1e9 if keep.sum() > 1 else 0
    return {"frames": len(got), "fps": (keep.sum() - 1) / span if span > 0 else None,
            "latency_ms": summary_ms(latency.tolist())}


# ---- Pipecat pipelines -----------------------------------------------------------------------------------
def measure_pipecat(bundle: str, audio16: np.ndarray, n: int, runtime: str, onnx_dir: str | None,
                    at_once: bool = False) -> list[dict]:
    """N Pipecat pipelines at once, each fed ``audio16`` at 24 kHz as a streaming TTS pushes it.

    With ``at_once``, all of it is queued at once, then it waits the time it lasts."""
    from pipecat.frames.frames import EndFrame

    tts = resample(audio16, SAMPLE_RATE, TTS_RATE)
    agents = [Agent(FramegraphAvatar(bundle, runtime=runtime, onnx_dir=onnx_dir)) for _ in range(n)]
    speech_frames = [utterance(tts, TTS_RATE, f"speech-{i}") for i in range(n)]
    scripts = [["pictures", 1.0, *frames, len(tts) / TTS_RATE, 1.0, EndFrame()] if at_once else
               ["pictures", 1.0, ("realtime", frames), 1.0, EndFrame()] for frames in speech_frames]
    run_agents(agents, scripts, timeout_s=len(tts) / TTS_RATE + 120)
    return [_pipecat_summary(a) for a in agents]


def _pipecat_summary(agent) -> dict:
    rec = split(agent.sink.got)
    m = analyse(rec)
    end = agent.fed[-1][0]  # the EndFrame queued: after it the queued speech drains, the live stream is over
    live = split([(t, f) for t, f in agent.sink.got if t < end])
    m["audio_after_image"], m["image_gap_ms"] = pipecat_agent.audio_after_image(live), pipecat_agent.image_gap_ms(live)
    session = agent.avatar.session
    a = session.avatar
    if isinstance(a, PortraitAvatar) and rec.images:
        opening = mouth_openness(torch.from_numpy(pictures(rec)), a.mouth_box, a.portrait)
        lag, corr = best_lag(opening, audio_rms_per_image(rec))
        m["mouth_lag_frames"], m["mouth_loudness_corr"] = lag, round(max(corr), 3)
    m["session"] = session.stats()
    return m


# ---- the table -------------------------------------------------------------------------------------------
def _row(runtime: str, n: int, bare: list[dict], piped: list[dict], push: str = "realtime") -> dict:
    def p50(ms):
        return ms["latency_ms"].get("p50_ms") if ms.get("latency_ms") else None

    b = [p50(x) for x in bare if p50(x) is not None]
    p = [p50(x) for x in piped if p50(x) is not None]
    order = [x["audio_after_image"] for x in piped]
    return {"runtime": runtime, "agents": n, "push": push, "bare": bare, "pipecat": piped,
            "audio_after_image_min": min((o["share"] or 0.0) for o in order),
            "audio_lead_ms_max": max((o["lead_ms"] or 0.0) for o in order),
            "image_gap_ms_max": max((x["image_gap_ms"] or 0.0) for x in piped),
            "fps_min": min((x.get("fps") or 0.0) for x in piped),
            "unique_fps_min": min((x.get("unique_fps") or 0.0) for x in piped),
            "bare_fps_min": min((x.get("fps") or 0.0) for x in bare) if bare else None,
            "latency_p50_ms": float(np.mean(p)) if p else None, "bare_latency_p50_ms": float(np.mean(b)) if b else None,
            "added_delay_ms": float(np.mean(p) - np.mean(b)) if p and b else None}


def _print_row(r: dict) -> None:
    sync = (f"audio after its image {100 * r['audio_after_image_min']:.1f} % (lead ≤ {r['audio_lead_ms_max']:.0f} ms), "
            f"longest image gap {r['image_gap_ms_max']:.0f} ms")
    if r["push"] == "at_once":
        print(f"  {r['runtime']:>9} × 1, speech at once: Pipecat {r['fps_min']:.1f} fps delivered, "
              f"{r['unique_fps_min']:.1f} generated; {sync}", flush=True)
        return
    print(f"  {r['runtime']:>9} × {r['agents']}: Pipecat {r['fps_min']:.1f} fps delivered, {r['unique_fps_min']:.1f} "
          f"generated (slowest agent), latency p50 "
          f"{r['latency_p50_ms'] or 0:.0f} ms; bare graph {r['bare_fps_min']:.1f} fps, p50 "
          f"{r['bare_latency_p50_ms'] or 0:.0f} ms; added {r['added_delay_ms'] or 0:.0f} ms; {sync}", flush=True)


def _target_met(result: dict) -> bool | None:
    rows = [r for r in result["rows"] if r["runtime"] == TARGET["runtime"] and r["agents"] == 1
            and r["push"] == "realtime"]
    if not rows or result["output_size"] != TARGET["output"]:
        return None
    r = rows[0]
    return bool(r["unique_fps_min"] >= 0.95 * TARGET["fps"] and r["added_delay_ms"] is not None
                and r["added_delay_ms"] <= TARGET["added_delay_ms"])


def figure(result: dict, plt):
    rows = [r for r in result["rows"] if r["push"] == "realtime"]
    names = [f"{r['runtime']}\n×{r['agents']}" for r in rows]
    xs = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    ax.bar(xs - 0.27, [r["fps_min"] for r in rows], 0.27, label="Pipecat, delivered (slowest agent)", color="#88aadd")
    ax.bar(xs, [r["unique_fps_min"] for r in rows], 0.27, label="Pipecat, generated (not repeats)", color="#4477aa")
    ax.bar(xs + 0.27, [r["bare_fps_min"] for r in rows], 0.27, label="bare graph (slowest)", color="#bbbbbb")
    ax.axhline(TARGET["fps"], color="k", ls="--", lw=0.8, label=f"target {TARGET['fps']:g} fps")
    ax.set_xticks(xs, names)
    ax.set_ylabel("images / s delivered")
    ax.set_title(f"frame rate — {result['device']}", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.bar(xs - 0.2, [r["latency_p50_ms"] or 0 for r in rows], 0.4, label="Pipecat: TTS frame → its image",
           color="#ee6677")
    ax.bar(xs + 0.2, [r["bare_latency_p50_ms"] or 0 for r in rows], 0.4, label="bare: audio pushed → its frame",
           color="#bbbbbb")
    for i, r in enumerate(rows):
        if r["added_delay_ms"] is not None:
            ax.text(i, max(r["latency_p50_ms"] or 0, r["bare_latency_p50_ms"] or 0), f"+{r['added_delay_ms']:.0f} ms",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, names)
    ax.set_ylabel("latency p50 (ms)")
    ax.set_title(f"added delay (target ≤ {TARGET['added_delay_ms']:g} ms, onnx, 1 agent)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
