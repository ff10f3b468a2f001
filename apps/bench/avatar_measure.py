"""What ``framegraph bench avatar`` measures on one avatar.

It measures time to first frame, live and burst, cold and warm. It measures steady FPS with per-stage times,
and concurrent server-like sessions. Each run is the real avatar graph, ``models.avatar.build_avatar_graph``.
A ``PushAudioSource`` feeds it. It ends in a sink that stamps arrivals."""
from __future__ import annotations

import math
import threading
import time
from typing import Literal

import numpy as np
import torch

from framegraph.models.audio.features import FrameTiming
from framegraph.models.avatar import RunSettings, build_avatar_graph
from framegraph.stream import PortSpec, Stage
from framegraph.stream.media import PushAudioSource

from .measure import stage_times, summary_ms
from .speech import SAMPLE_RATE

CHUNK = 320  # 20 ms of 16 kHz audio: what PushAudioSource emits and a client sends
SESSION_FPS_TOLERANCE = 0.95  # presentation is paced by the audio: a session that keeps up shows fps ± jitter


def _params(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))



def _collect_sink(height: int, width: int, device: str, capacity: int):
    class Collect(Stage):
        """Stamps each composited frame's arrival. On CUDA, after its producer's work has finished."""

        def __init__(self):
            super().__init__("collect")
            self.inputs = {"video": PortSpec((height, width, 3), torch.uint8, device)}
            self.arrival_ns = np.zeros(capacity, np.int64)
            self.count = 0
            self.first_event = threading.Event()

        def process(self, inputs, out):
            if self.ctx.stream is not None:
                self.ctx.stream.synchronize()  # this stage's stream only: it waited on the frame's ready event
            now = time.monotonic_ns()
            if self.count < len(self.arrival_ns):
                self.arrival_ns[self.count] = now
            self.count += 1
            self.first_event.set()

    return Collect()


class _GpuStageTimer:
    """CUDA events around each stage's ``process()`` on the stage's own stream.

    The events are preallocated and resolved after the run. They give the GPU time of each call, which
    host-side telemetry cannot see."""

    def __init__(self, stages, capacity: int):
        self.events = {}
        for s in stages:
            pool = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                    for _ in range(capacity)]
            used = [0]
            self.events[s.name] = (pool, used)
            orig = s.process

            def timed(inputs, out, _orig=orig, _pool=pool, _used=used):
                i = _used[0]
                if i >= len(_pool):
                    return _orig(inputs, out)
                _pool[i][0].record()  # the current stream is the stage's own (the graph's worker sets it)
                _orig(inputs, out)
                _pool[i][1].record()
                _used[0] = i + 1

            s.process = timed

    def summary(self) -> dict:
        out = {}
        for name, (pool, used) in self.events.items():
            ms = []
            for a, b in pool[:used[0]]:
                b.synchronize()  # after the run: off the hot path
                ms.append(a.elapsed_time(b))
            out[name] = _calls(summary_ms(ms))
        return out


def _calls(summary: dict) -> dict:
    """A latency summary (:func:`~.measure.summary_ms`, or a graph report's) with its ``count`` named ``calls``."""
    return {"calls": summary["count"], **{k: v for k, v in summary.items() if k != "count"}}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()  # between runs only, never while a graph is running


def _pusher(src, audio: np.ndarray, t0_s: float, live: bool, done: threading.Event | None = None):
    """Feed ``audio`` into ``src``, then close it.

    Live: 20 ms chunks, each due at ``t0 + k·20 ms``. Otherwise all at once."""
    def feed():
        try:
            if not live:
                src.push(audio)
                return
            for k in range(0, math.ceil(len(audio) / CHUNK)):
                delay = t0_s + k * CHUNK / SAMPLE_RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                src.push(audio[k * CHUNK:(k + 1) * CHUNK])
        except ValueError:  # the graph stopped (push after close): nothing left to feed
            pass
        finally:
            src.close()
            if done is not None:
                done.set()

    return threading.Thread(target=feed, daemon=True, name="bench-avatar-pusher")


AVATAR_STAGES = ("audio_features", "state", "denoiser", "vae_decode", "composite")


def _graph(avatar, device: str, *, clock: Literal["realtime", "fast"], frames: int, buffer_ms: int, server_like: bool,
           torch_threads: int | None, gpu_timing: bool = False, graph_kw: dict | None = None):
    src = PushAudioSource(max_buffer_ms=buffer_ms, name="mic", device="cpu")
    sink = _collect_sink(avatar.height, avatar.width, device, frames + 16)

    settings = RunSettings(device=device, live=server_like, torch_threads=torch_threads, **(graph_kw or {}))
    ag = build_avatar_graph(avatar, src, sink=sink, audio_sink=None, clock=clock, settings=settings, max_in_flight=8,
                            video_policy="drop_oldest" if server_like else "block", name="avatar")
    timer = None
    if gpu_timing and device.startswith("cuda"):
        timer = _GpuStageTimer([ag.features, ag.state, *ag.stages.values()],
                               capacity=3 * frames + 64)
    return ag, src, sink, timer


def _frames_for(avatar, samples: int) -> int:
    """Video frames a stream of ``samples`` makes, for ``chunk_frames = 1``. Larger chunks round up."""
    k = math.ceil(samples * avatar.fps / SAMPLE_RATE)
    c = getattr(avatar, "chunk_frames", 1)  # a video avatar: one frame at a time
    return math.ceil(k / c) * c


# ---- measurements ------------------------------------------------------------------------------------

def measure_ttff(avatar, audio: np.ndarray, device: str, live: bool, torch_threads: int | None,
                 graph_kw: dict | None = None) -> dict:
    """One session: build, start, push ``audio`` live or at once, wait for the end. Times in ms."""
    t = time.monotonic_ns()
    ag, src, sink, _ = _graph(avatar, device, clock="realtime" if live else "fast",
                              frames=_frames_for(avatar, len(audio)), buffer_ms=500 if live else 2000,
                              server_like=False, torch_threads=torch_threads, graph_kw=graph_kw)
    built = time.monotonic_ns()
    ag.graph.start()
    _sync(device)
    started = time.monotonic_ns()
    t0 = time.monotonic()
    t0_ns = time.monotonic_ns()
    feeder = _pusher(src, audio, t0, live)
    feeder.start()
    ag.graph.join()
    feeder.join()
    if sink.count == 0:
        raise RuntimeError("avatar bench: the graph produced no frame")
    return {"build_graph_ms": (built - t) / 1e6, "start_ms": (started - built) / 1e6,
            "ttff_ms": (int(sink.arrival_ns[0]) - t0_ns) / 1e6, "frames": int(sink.count)}


def measure_steady(avatar, audio: np.ndarray, device: str, torch_threads: int | None, warmup_frames: int,
                   graph_kw: dict | None = None) -> dict:
    expected = _frames_for(avatar, len(audio))
    ag, src, sink, timer = _graph(avatar, device, clock="fast", frames=expected,
                                  buffer_ms=int(1000 * len(audio) / SAMPLE_RATE) + 100, server_like=False,
                                  torch_threads=torch_threads, gpu_timing=True, graph_kw=graph_kw)
    src.push(audio)
    src.close()
    ag.graph.start()
    _sync(device)
    t0 = time.monotonic_ns()
    report = ag.graph.join()
    n = int(sink.count)
    if n == 0:
        raise RuntimeError("avatar bench: the steady run produced no frame")
    arr = sink.arrival_ns[:min(n, len(sink.arrival_ns))]
    w = min(warmup_frames, max(0, n - 2))
    fps = float((len(arr) - 1 - w) / ((arr[-1] - arr[w]) / 1e9)) if len(arr) - w > 1 and arr[-1] > arr[w] else None
    gaps_ms = np.diff(arr[w:]) / 1e6
    out = {"frames": n, "expected_frames": expected, "audio_seconds": len(audio) / SAMPLE_RATE,
           "warmup_frames": w, "wall_s": (int(arr[-1]) - t0) / 1e9 if n else None,
           "fps": fps, "fps_including_warmup": n / ((int(arr[-1]) - t0) / 1e9) if n else None,
           "realtime_factor": None if fps is None else fps / avatar.fps,
           "frame_interval_ms": _calls(summary_ms(gaps_ms)),
           "stages_host_ms": stage_times(report, AVATAR_STAGES),
           "stages_gpu_ms": timer.summary() if timer is not None else None,
           "denoiser_steps_used": {str(k): v for k, v in ag.stages["denoiser"].steps_used.items()},
           "edge_drops": sum(e["drops"] for e in report["edges"])}
    return out


def measure_sessions(avatar, n: int, seconds: float, device: str, torch_threads: int | None, audio: np.ndarray,
                     graph_kw: dict | None = None) -> dict:
    """``n`` server-like graphs at once, of a portrait or a video avatar.

    Each is fed in real time by its own thread from a common start. Each kind has its own figures beside the
    common ones. ``cpu_ms_per_frame`` is the process's CPU time over the frames all sessions presented.
    ``fps_spread`` is (fastest − slowest) / fastest presented fps. It says how fair the shares were."""
    samples = len(audio)
    expected = _frames_for(avatar, samples)
    graphs = []
    for i in range(n):
        ag, src, sink, _ = _graph(avatar, device, clock="realtime", frames=expected, buffer_ms=500,
                                  server_like=True, torch_threads=torch_threads, graph_kw=graph_kw)
        graphs.append((ag, src, sink, np.roll(audio, -int(i * 1.3 * SAMPLE_RATE) % samples)))
    for ag, *_ in graphs:
        ag.graph.start()
    _sync(device)
    t0 = time.monotonic() + 0.05
    t0_ns = time.monotonic_ns() + 50_000_000
    feeders = [_pusher(src, a, t0, live=True) for _, src, _, a in graphs]
    cpu0 = time.process_time()
    for f in feeders:
        f.start()
    reports = [ag.graph.join() for ag, *_ in graphs]
    for f in feeders:
        f.join()
    cpu_s = time.process_time() - cpu0
    end_of_audio_ns = t0_ns + int(1e9 * samples / SAMPLE_RATE)
    per = []
    for (ag, src, sink, _), rep in zip(graphs, reports):
        m = min(int(sink.count), len(sink.arrival_ns))
        arr = sink.arrival_ns[:m]
        fps = float((m - 1) / ((arr[-1] - arr[0]) / 1e9)) if m > 1 and arr[-1] > arr[0] else 0.0
        e2e = rep["end_to_end"]
        row = {"frames": int(sink.count), "expected_frames": expected, "presented_fps": fps,
               "fraction_of_target": fps / avatar.fps,
               "ttff_ms": (int(arr[0]) - t0_ns) / 1e6 if m else None,
               "end_lag_ms": (int(arr[-1]) - end_of_audio_ns) / 1e6 if m else None,
               "end_to_end_ms": {k: e2e.get(k) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")},
               "dropped_at_source": rep["sources"]["mic"]["dropped_in_flight_limit"],
               "audio_overflow_samples": int(src.overflow_samples),
               "edge_drops": sum(e["drops"] for e in rep["edges"])}
        if "denoiser" in ag.stages:  # a portrait
            row.update({"denoiser_steps_used": {str(k): v for k, v in ag.stages["denoiser"].steps_used.items()},
                        "frames_skipped_late": int(ag.stages["denoiser"].frames_skipped),
                        "denoiser_p50_ms": rep["stages"]["denoiser"]["work"].get("p50_ms")})
        else:  # a video avatar
            row.update({"frames_skipped_late": int(ag.stages["mouth_region"].frames_skipped),
                        "mouth_region_p50_ms": rep["stages"]["mouth_region"]["work"].get("p50_ms")})
        per.append(row)
    fps_all = [p["presented_fps"] for p in per]
    presented = sum(p["frames"] for p in per)
    return {"sessions": n, "audio_seconds": samples / SAMPLE_RATE, "target_fps": avatar.fps,
            "per_session": per, "fps_min": min(fps_all), "fps_median": float(np.median(fps_all)),
            "fps_spread": (max(fps_all) - min(fps_all)) / max(fps_all) if max(fps_all) > 0 else None,
            "aggregate_fps": float(sum(fps_all)),
            "cpu_ms_per_frame": 1000.0 * cpu_s / presented if presented else None,
            "all_keep_up": all(f >= SESSION_FPS_TOLERANCE * avatar.fps for f in fps_all)}


def measure_size(name: str, avatar, *, weights: str, device: str, ttff_audio: np.ndarray,
                 steady_audio: np.ndarray, repeats: int, torch_threads: int | None, warmup_frames: int, log,
                 graph_kw: dict | None = None) -> dict:
    """One row: TTFF (cold, warm live, warm burst) and the steady run.

    ``graph_kw``: more :class:`~framegraph.models.avatar.RunSettings` fields, ``runtime`` or ``onnx_dir``."""
    timing = FrameTiming.of(avatar.audio, avatar.fps)
    need = timing.required_samples(0)
    wait_ms = 1000.0 * (math.ceil(need / CHUNK) - 1) * CHUNK / SAMPLE_RATE
    row = {"name": name, "weights": weights, "region_size": avatar.region_size,
           "latent_size": avatar.latent_size, "frame_size": [avatar.width, avatar.height],
           "crop_box": list(avatar.crop_box),
           "parameters": {"vae": _params(avatar.vae), "dit": _params(avatar.dit), "audio": _params(avatar.audio)}}
    log(f"[{name}] region {avatar.region_size}², frame {avatar.width}x{avatar.height}: cold session")
    cold = measure_ttff(avatar, ttff_audio, device, live=True, torch_threads=torch_threads, graph_kw=graph_kw)
    live = [measure_ttff(avatar, ttff_audio, device, live=True, torch_threads=torch_threads,
                         graph_kw=graph_kw)["ttff_ms"] for _ in range(repeats)]
    burst = [measure_ttff(avatar, ttff_audio, device, live=False, torch_threads=torch_threads,
                          graph_kw=graph_kw)["ttff_ms"] for _ in range(repeats)]
    row["ttff"] = {
        "audio_needed_for_first_frame_ms": 1000.0 * need / SAMPLE_RATE,
        "audio_wait_ms": wait_ms,
        "frames_per_session": cold["frames"],
        "cold": {"build_graph_ms": cold["build_graph_ms"], "start_ms": cold["start_ms"], "live_ms": cold["ttff_ms"],
                 "live_compute_ms": cold["ttff_ms"] - wait_ms},
        "warm_live_ms": {"runs": live, "median": summary_ms(live)["p50_ms"]},
        "warm_live_compute_ms": summary_ms(live)["p50_ms"] - wait_ms,
        "warm_burst_ms": {"runs": burst, "median": summary_ms(burst)["p50_ms"]},
    }
    log(f"[{name}] TTFF cold {cold['ttff_ms']:.0f} ms, warm live {row['ttff']['warm_live_ms']['median']:.0f} ms, "
        f"warm burst {row['ttff']['warm_burst_ms']['median']:.0f} ms; "
        f"steady run of {len(steady_audio) / SAMPLE_RATE:g} s")
    row["steady"] = measure_steady(avatar, steady_audio, device, torch_threads, warmup_frames, graph_kw)
    fps = row["steady"]["fps"]
    log(f"[{name}] steady {fps:.1f} fps" if fps else f"[{name}] steady: too few frames for a rate")
    return row
