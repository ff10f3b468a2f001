"""Talking-avatar speed benchmark: time to first frame, steady FPS, per-stage p50/p99, concurrent sessions.

    framegraph bench avatar --out benchmarks/results/cpu/avatar.json        # CPU defaults: a few minutes
    framegraph bench avatar --out /tmp/avatar.json --quick                   # small, a smoke test
    framegraph bench avatar --runtime torch,onnx --out benchmarks/results/cpu/avatar_onnx.json  # both backends

``--runtime torch,onnx`` measures every row on each runtime. It does so in the same run, on the same machine.
``torch,compiled`` does the same with Inductor, and CUDA graphs on a GPU. The ``onnx`` rows run the three model
stages on ONNX Runtime (``models.onnx``). The bench exports them into a temporary folder before measuring.
Random-weight rows have no bundle folder to export from. ``--onnx DIR`` uses an existing export of the shipped
bundle instead. ``onnx-int8`` rows add the int8 files to that export. They use ``framegraph export --int8``'s
default mode and kept models. ``bench avatar_int8`` has the per-model int8 figures. The sessions part runs on
each backend.

Issue 5's targets are for the shipped model class on an H100. First frame ≤ 100 ms. At least 120 FPS at 384²
and 60 FPS at 512². Four sessions at ≥ 25 FPS each. The JSON compares with them only as a reference.
``targets_apply`` says whether this device is an H100.

**What is measured.** The model class is the architecture of the shipped avatar, ``--avatar``. The default is
``assets/avatars/astronaut``. The class covers its VAE, DiT and audio-encoder configs. It covers the sampler steps,
chunk size, fps and VAD setting. For each ``--sizes`` entry, a bundle of that class is built with **random
weights**. Its generated face region, the VAE's decoded frame, has that side. Speed does not depend on the weights.
The region is pasted into the shipped portrait. It is scaled by ``size / shipped_region``, which keeps the shipped
framing. So the composited output frame is larger than the region: ``frame_size`` in the JSON. The shipped avatar
itself is measured too, as ``"shipped"``. It has its trained weights and native region. ``--no-shipped`` skips it.

Every graph is the real one, ``models.avatar.build_avatar_graph``. It runs AudioFeatures → state → Denoiser →
VAEDecode → Composite. A ``PushAudioSource`` feeds it. A collecting sink stamps each composited frame's arrival
with ``time.monotonic_ns``. On CUDA it first synchronizes the sink's own stream. So the frame is really
finished. The hot path never synchronizes the whole device.

1. **time to first frame** — from the first audio pushed to the first composited frame at the sink.
   ``live``: 20 ms chunks pushed at real-time pace on a real-time clock. A server session sees them so.
   The first frame cannot come before its audio and look-ahead have arrived: ``audio_wait_ms``.
   ``burst``: the audio pushed at once on a fast clock. This is the pure compute and hand-off latency.
   ``cold`` is the first session of a freshly built bundle. Graph build and start are timed separately.
   ``warm`` is the median over ``--repeats`` later sessions.
2. **steady FPS** — ``--seconds`` of speech pushed at once, on a fast clock. It runs full sampler steps, with no
   fallbacks. It reports frames per second at the sink after the first ``warmup_frames``. Per stage it
   reports work p50 / p99 and waits, from the graph's telemetry. Work is ``process()`` less its waits on
   full rings. On CUDA it adds each call's GPU time. CUDA events on the stage's stream give it.
3. **sessions** — N graphs at once, built as the server's ``avatar`` pipeline builds them. That means a
   real-time clock and ``max_in_flight=8``. It means a per-chunk budget with step fallbacks, and
   ``drop_oldest`` into the sink. Each has its own audio, pushed in real time by its own thread. It reports
   presented FPS per session, against the avatar's fps. It reports TTFF, drops and end-to-end latency. There
   is no video encoding here. That is the server bench's part.

Audio is espeak-ng speech, from ``models.synth``, when the library is present. Otherwise it is synthetic voiced
bursts.
The JSON names which.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
from PIL import Image

from framegraph.models.audio import AudioEncoder
from framegraph.models.avatar import AvatarError, PortraitAvatar, load_avatar
from framegraph.models.avatar.int8 import DEFAULT_INT8, DEFAULT_MODE, quantize_export
from framegraph.models.avatar.portrait.onnx import export_avatar, load_manifest
from framegraph.models.dit import AvatarDiT
from framegraph.models.runtime import default_device
from framegraph.models.vae import VideoVAE
from framegraph.stream.files import write_json

from .avatar_measure import AVATAR_STAGES, CHUNK, SESSION_FPS_TOLERANCE, measure_sessions, measure_size
from .measure import torch_threads
from .meta import ROOT, bench_metadata, write_result
from .speech import SAMPLE_RATE, speech

TARGETS = {"device": "NVIDIA H100", "time_to_first_frame_ms": 100.0, "fps": {"384": 120.0, "512": 60.0},
           "sessions": 4, "session_fps": 25.0}


# ---- the model class ---------------------------------------------------------------------------------

def _config(path: str) -> dict:
    with open(path) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def shipped_class(root: str) -> dict:
    """The shipped bundle's architecture: its three model configs and avatar.json settings."""
    for part in ("avatar.json", "vae/config.json", "dit/config.json", "audio/config.json"):
        if not os.path.isfile(os.path.join(root, part)):
            raise AvatarError(f"--avatar {root!r}: {part} is missing (expected an avatar bundle folder)")
    avatar = _config(os.path.join(root, "avatar.json"))
    vae = _config(os.path.join(root, "vae", "config.json"))
    return {"root": root, "avatar": avatar, "vae": vae, "dit": _config(os.path.join(root, "dit", "config.json")),
            "audio": _config(os.path.join(root, "audio", "config.json")),
            "compression": int(vae["patch_size"]) * 2 ** (len(vae["block_out_channels"]) - 1)}


def size_multiple(cls: dict) -> int:
    """Region sides must be a multiple of this: VAE compression × DiT patch."""
    return cls["compression"] * int(cls["dit"].get("patch_size", 1))


def random_bundle(cls: dict, size: int, seed: int = 0):
    """A :class:`~framegraph.models.avatar.PortraitAvatar` of the shipped class with random weights.

    Its generated region is ``size`` px. It is composited into the shipped portrait, scaled by
    ``size / shipped_region``."""
    a = cls["avatar"]
    scale = size / int(a["region_size"])
    with Image.open(os.path.join(cls["root"], a["portrait"])) as im:
        im = im.convert("RGB")
        w, h = max(size, round(im.width * scale)), max(size, round(im.height * scale))
        portrait = torch.from_numpy(np.array(im.resize((w, h), Image.BICUBIC)))
    x, y = (min(max(0, round(v * scale)), lim - size) for v, lim in zip(a["face_box"][:2], (w, h)))
    mouth = a.get("mouth_box")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = VideoVAE(**{**cls["vae"], "sample_size": size}).eval()
        lat = size // vae.spatial_compression
        dit = AvatarDiT(**{**cls["dit"], "sample_size": [lat, lat]}).eval()
        audio = AudioEncoder(**cls["audio"]).eval()
    return PortraitAvatar(vae=vae, dit=dit, audio=audio, portrait=portrait, crop_box=(x, y, size, size),
                  region_size=size,
                  mouth_box=None if mouth is None else tuple(float(v) * scale for v in mouth),
                  fps=float(a.get("fps", 25.0)), chunk_frames=int(a.get("chunk_frames", 1)),
                  steps=int(a.get("steps", 2)), shift=float(a.get("shift", 1.0)), vad=bool(a.get("vad", True)))


# ---- plot --------------------------------------------------------------------------------------------

def figure(result: dict, plt):
    """The benchmark's figure (also used by ``bench report``)."""
    rows = result["sizes"]
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    ax = axes[0][0]
    fps = [r["steady"]["fps"] or 0.0 for r in rows]
    ax.bar(names, fps, color="#4477aa")
    for i, r in enumerate(rows):
        t = TARGETS["fps"].get(str(r["region_size"])) if r["weights"] != "shipped" else None
        if t:
            ax.plot([i - 0.4, i + 0.4], [t, t], "k--")
            ax.text(i, t, f"H100 target {t:.0f}", ha="center", va="bottom", fontsize=8)
        ax.text(i, fps[i], f"{fps[i]:.1f}", ha="center", va="bottom", fontsize=9)
    real = result["model_class"]["settings"].get("fps") or 25.0
    ax.axhline(real, color="#228833", lw=0.8, ls=":", label=f"real time ({real:g} fps)")
    ax.legend(fontsize=7)
    ax.set_ylabel("frames / s (fast clock)")
    ax.set_title(f"steady FPS per region size — {result['device']}", fontsize=10)
    ax = axes[0][1]
    stages = [s for s in AVATAR_STAGES if any(s in r["steady"]["stages_host_ms"] for r in rows)]
    width = 0.8 / max(1, len(rows))
    for j, r in enumerate(rows):
        table = r["steady"]["stages_gpu_ms"] or r["steady"]["stages_host_ms"]
        p50 = [table.get(s, {}).get("p50_ms", 0.0) for s in stages]
        p99 = [table.get(s, {}).get("p99_ms", 0.0) for s in stages]
        xs = np.arange(len(stages)) + j * width
        ax.bar(xs, p99, width, color=f"C{j}", alpha=0.35)
        ax.bar(xs, p50, width, color=f"C{j}", label=f"{r['name']}")
    ax.set_xticks(np.arange(len(stages)) + width * (len(rows) - 1) / 2, stages, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms of work per process() call")
    ax.set_title("per-stage time per call: p50 (dark), p99 (pale)"
                 + (" (GPU, CUDA events)" if rows[0]["steady"]["stages_gpu_ms"] else " (CPU)"), fontsize=10)
    ax.legend(fontsize=7, ncol=len(rows), loc="upper center", bbox_to_anchor=(0.5, -0.07), frameon=False)
    ax = axes[1][0]
    xs = np.arange(len(rows))
    cold = [r["ttff"]["cold"]["live_ms"] for r in rows]
    live = [r["ttff"]["warm_live_ms"]["median"] for r in rows]
    burst = [r["ttff"]["warm_burst_ms"]["median"] for r in rows]
    ax.bar(xs - 0.27, cold, 0.27, label="cold, live audio", color="#ee6677")
    ax.bar(xs, live, 0.27, label="warm, live audio", color="#4477aa")
    ax.bar(xs + 0.27, burst, 0.27, label="warm, audio at once", color="#66ccee")
    ax.axhline(TARGETS["time_to_first_frame_ms"], color="k", ls="--", lw=0.8, label="H100 target 100 ms")
    ax.axhline(rows[0]["ttff"]["audio_wait_ms"], color="#999999", ls=":", lw=0.8, label="live: waiting for audio")
    ax.set_xticks(xs, names)
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_title("time to first composited frame", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1][1]
    sess = result.get("sessions")
    if sess and sess.get("runs"):
        for run in sess["runs"]:
            ys = [p["presented_fps"] for p in run["per_session"]]
            ax.scatter([run["sessions"]] * len(ys), ys, color="#4477aa", zorder=3)
        ax.axhline(sess["runs"][0]["target_fps"], color="k", ls="--", lw=0.8, label="avatar fps (target)")
        ax.set_xticks([run["sessions"] for run in sess["runs"]])
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        ax.set_title(f"concurrent sessions ({sess['avatar']}): presented FPS per session", fontsize=10)
    ax.set_xlabel("sessions at once")
    fig.tight_layout()
    return fig


# ---- command line ------------------------------------------------------------------------------------

def _settings(args) -> dict:
    cuda = args.device.startswith("cuda")
    q = args.quick
    s = {"sizes": args.sizes if args.sizes is not None else ([64] if q else [256, 384, 512]),
         "seconds": args.seconds if args.seconds is not None else (1.0 if q else 20.0 if cuda else 6.0),
         "repeats": args.repeats if args.repeats is not None else (1 if q else 3),
         "sessions": args.sessions if args.sessions is not None
         else ([2] if q else [1, 2] if not cuda else [1, 2, 4]),
         "session_seconds": args.session_seconds if args.session_seconds is not None
         else (1.0 if q else 10.0 if cuda else 6.0),
         "ttff_seconds": 0.32, "warmup_frames": 5 if q else 10,
         "torch_threads": args.torch_threads if args.torch_threads is not None else (None if cuda else 1)}
    s["session_size"] = args.session_size if args.session_size is not None else (
        s["sizes"][0] if q else 384 if cuda else "shipped")
    if s["seconds"] <= 0 or s["session_seconds"] <= 0:
        raise ValueError("--seconds and --session-seconds must be > 0")
    if s["repeats"] < 1:
        raise ValueError(f"--repeats must be >= 1, got {s['repeats']}")
    s["backends"] = list(args.runtime)  # the JSON's name for the runtimes measured (a recorded field)
    if any(b not in ("torch", "compiled") for b in s["backends"]) and cuda:
        raise ValueError("--runtime onnx / onnx-int8 run on the CPU (ONNX Runtime's CPU provider); use --device cpu")
    if s["torch_threads"] is not None and s["torch_threads"] < 1:
        raise ValueError(f"--torch-threads must be >= 1, got {s['torch_threads']}")
    return s


def _shown_path(path: str) -> str:
    """A bundle path as recorded: relative to the repository when inside it."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else full


def run(args: argparse.Namespace) -> int:
    args.device = args.device or default_device()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    s = _settings(args)
    cls = shipped_class(args.avatar)
    mult = size_multiple(cls)
    for size in s["sizes"] + ([s["session_size"]] if isinstance(s["session_size"], int) else []):
        if size % mult:
            raise ValueError(f"--sizes / --session-size: {size} is not a multiple of {mult} (the region side must "
                             f"divide by the VAE's {cls['compression']}x compression times the DiT's patch "
                             f"{cls['dit'].get('patch_size', 1)}); e.g. 256,384,512")
    with torch_threads(s["torch_threads"]), tempfile.TemporaryDirectory(prefix="fg-bench-onnx-") as tmp:
        s["export_root"] = tmp
        result = bench_metadata("avatar")
        steady_audio, audio_info = speech(s["seconds"], seed=0)
        audio_info = {**audio_info, "seconds": s["seconds"], "samples": int(len(steady_audio)),
                      "sample_rate": SAMPLE_RATE, "chunk_ms": 1000 * CHUNK // SAMPLE_RATE}
        result.update(_description(args, s, cls, result["device"], audio_info))
        # each finished row is on disk at once: a run cut at a deadline (a GPU lease) keeps what it measured
        def partial(rows):
            write_json(args.out, {**result, "sizes": rows, "partial": "cut before the last row or the sessions"})

        result["sizes"], session_avatar = _measure_sizes(args, s, cls, steady_audio, partial)
        by_backend = {b: _measure_sessions(args.device, s, session_avatar, b, args) for b in s["backends"]}
        result["sessions"] = by_backend[s["backends"][0]]
        result["sessions_by_backend"] = by_backend
        result["summary"] = _summary(result)
    png = write_result(result, args.out, figure)
    for line in _summary_lines(result):
        print(line)
    print(f"wrote {args.out} and {png}")
    return 0


def _log(msg: str) -> None:
    print(msg, flush=True)


def _description(args, s: dict, cls: dict, device_name: str, audio: dict) -> dict:
    """What the JSON says about the run beside its numbers.

    That is the device, model class, weights, settings and targets."""
    device = args.device
    return {
        "stage_device": device,
        "note": ("CUDA run" if device.startswith("cuda") else
                 "CPU run: the targets are for an H100 GPU; these CPU figures only show the benchmark works "
                 "and how the stages compare") + ("; --quick: a smoke test, not a measurement" if args.quick
                                                  else ""),
        "model_class": {"avatar": _shown_path(args.avatar), "vae": cls["vae"], "dit": cls["dit"], "audio": cls["audio"],
                        "settings": {k: cls["avatar"].get(k) for k in ("region_size", "fps", "chunk_frames",
                                                                       "steps", "shift", "vad", "size")}},
        "weights": "random, shipped architecture (speed does not depend on the weights); the 'shipped' row "
                   "uses the shipped trained weights",
        "size_meaning": "size = side in px of the generated face region (the VAE's decoded frame, "
                        f"{cls['compression']}x the latent side); it is pasted into the shipped portrait "
                        f"scaled by size/{cls['avatar']['region_size']} (the shipped framing), so the "
                        "composited output frame is each row's frame_size",
        "audio": audio,
        "settings": {**{k: v for k, v in s.items() if k != "export_root"},
                     "torch_threads_effective": torch.get_num_threads(),
                     "clock": "time.monotonic_ns (the runtime's clock); CUDA: the sink synchronizes its own "
                              "stream before stamping a frame; stage GPU times from CUDA events",
                     "stage_times": "work per process() call from the graph's telemetry (its waits on full "
                                    "rings and for input apart: *_wait_*); audio_features runs once "
                                    "per 20 ms audio chunk (2 calls per video frame at 25 fps)"},
        "targets": {**TARGETS, "targets_apply": "H100" in device_name},
    }


def _graph_kw(backend: str, avatar, name: str, s: dict, args) -> dict:
    """The :class:`~framegraph.models.avatar.RunSettings` fields for ``backend``.

    For onnx and onnx-int8 it includes the export of ``avatar``. The export is made now, timed, into the run's
    temporary folder. For onnx-int8 it adds the int8 files the export picks by default. The shipped bundle uses
    ``--onnx`` when given."""
    if backend in ("torch", "compiled"):
        return {} if backend == "torch" else {"runtime": "compiled"}
    if name == "shipped" and args.onnx:
        return {"runtime": backend, "onnx_dir": args.onnx}

    out = os.path.join(s["export_root"], name)
    if not os.path.isdir(out):
        t = time.perf_counter()
        export_avatar(avatar, out)
        _log(f"[{name}] exported to ONNX in {time.perf_counter() - t:.1f} s")
    if backend == "onnx-int8" and "int8" not in load_manifest(out, avatar):
        t = time.perf_counter()
        quantize_export(avatar, out, DEFAULT_MODE, models=DEFAULT_INT8)
        _log(f"[{name}] int8 ({DEFAULT_MODE}, kept: {', '.join(DEFAULT_INT8) or 'none'}) in "
             f"{time.perf_counter() - t:.1f} s")
    return {"runtime": backend, "onnx_dir": out}


def _row_name(name: str, backend: str, s: dict) -> str:
    return name if len(s["backends"]) == 1 and backend == "torch" else f"{name} {backend}"


def _measure_sizes(args, s: dict, cls: dict, steady_audio: np.ndarray, partial=lambda rows: None
                   ) -> tuple[list, tuple]:
    """One row per ``--sizes`` entry (random weights) and one for the shipped avatar, per backend.

    ``partial(rows)`` is called after each row. Also returns the sessions' avatar as ``(name, Avatar)``."""
    ttff_audio, _ = speech(s["ttff_seconds"], seed=1)
    common = dict(device=args.device, ttff_audio=ttff_audio, steady_audio=steady_audio, repeats=s["repeats"],
                  torch_threads=s["torch_threads"], warmup_frames=s["warmup_frames"], log=_log)
    rows = []
    session_avatar = None
    for size in s["sizes"]:
        avatar = random_bundle(cls, size)
        for b in s["backends"]:
            rows.append(measure_size(_row_name(str(size), b, s), avatar, weights="random, shipped architecture",
                                     graph_kw=_graph_kw(b, avatar, str(size), s, args), **common))
            rows[-1]["backend"] = b
            partial(rows)
        if s["session_size"] == size:
            session_avatar = (str(size), avatar)
    shipped = None
    if args.shipped or s["session_size"] == "shipped":
        shipped = load_avatar(args.avatar)
    if args.shipped:
        for b in s["backends"]:
            rows.append(measure_size(_row_name("shipped", b, s), shipped, weights="shipped",
                                     graph_kw=_graph_kw(b, shipped, "shipped", s, args), **common))
            rows[-1].update(bundle=_shown_path(args.avatar), backend=b)
    if s["session_size"] == "shipped":
        session_avatar = ("shipped", shipped)
    elif session_avatar is None:
        session_avatar = (str(s["session_size"]), random_bundle(cls, s["session_size"]))
    return rows, session_avatar


def _measure_sessions(device: str, s: dict, session_avatar: tuple, backend: str, args) -> dict:
    """Concurrent live sessions of one avatar on ``backend``, for each ``--sessions`` count."""
    name, avatar = session_avatar
    audio, _ = speech(s["session_seconds"], seed=2)
    kw = _graph_kw(backend, avatar, name, s, args)
    runs = []
    for n in s["sessions"]:
        _log(f"sessions ({backend}): {n} at once, avatar {name}, {s['session_seconds']:g} s of audio each")
        runs.append(measure_sessions(avatar, n, s["session_seconds"], device, s["torch_threads"], audio, kw))
        _log(f"sessions ({backend}): {n} at once: presented fps min {runs[-1]['fps_min']:.1f} "
             f"(target {runs[-1]['target_fps']:g})")
    return {"avatar": name, "backend": backend, "region_size": avatar.region_size,
            "keep_up_rule": f"presented fps >= {SESSION_FPS_TOLERANCE:g} x the avatar's fps", "runs": runs}


def _summary(result: dict) -> dict:
    rows = {}
    for r in result["sizes"]:
        target = TARGETS["fps"].get(str(r["region_size"])) if r["weights"] != "shipped" else None
        ttff = r["ttff"]
        rows[r["name"]] = {
            "frame_size": r["frame_size"], "steady_fps": r["steady"]["fps"], "fps_target_h100": target,
            "fps_target_met": (None if target is None or r["steady"]["fps"] is None
                               else bool(r["steady"]["fps"] >= target)),
            "ttff_cold_live_ms": ttff["cold"]["live_ms"], "ttff_warm_live_ms": ttff["warm_live_ms"]["median"],
            "ttff_warm_burst_ms": ttff["warm_burst_ms"]["median"],
            "ttff_target_met_warm_live": bool(ttff["warm_live_ms"]["median"] <= TARGETS["time_to_first_frame_ms"])}
    runs = result["sessions"]["runs"]
    four = next((r for r in runs if r["sessions"] == TARGETS["sessions"]), None)
    return {"targets_apply": result["targets"]["targets_apply"], "sizes": rows, "backends": _compare(result),
            "sessions_fps_min": {str(r["sessions"]): r["fps_min"] for r in runs},
            "four_sessions_target_met": None if four is None else four["all_keep_up"]}


def _compare(result: dict) -> dict:
    """Per avatar measured on both backends, two ratios.

    One is onnx / torch steady FPS. The other is torch / onnx per-stage p50. Above 1, onnx is faster."""
    out = {}
    by = {(r["name"].rsplit(" ", 1)[0], r.get("backend", "torch")): r for r in result["sizes"]}
    for (name, b), r in by.items():
        t = by.get((name, "torch"))
        if b != "onnx" or t is None:
            continue
        ts, os_ = t["steady"]["stages_host_ms"], r["steady"]["stages_host_ms"]
        out[name] = {"fps_torch": t["steady"]["fps"], "fps_onnx": r["steady"]["fps"],
                     "fps_ratio": None if not (t["steady"]["fps"] and r["steady"]["fps"])
                     else r["steady"]["fps"] / t["steady"]["fps"],
                     "stage_p50_speedup": {k: ts[k]["p50_ms"] / os_[k]["p50_ms"] for k in ts
                                           if k in os_ and ts[k].get("p50_ms") and os_[k].get("p50_ms")}}
    return out


def _waits(host: dict) -> str:
    """`` (waits out/in p50 A/B ms)`` of a stage's host row; empty when it has neither."""
    out, into = host.get("output_wait_p50_ms"), host.get("input_wait_p50_ms")
    if out is None and into is None:
        return ""
    return " (waits out/in p50 " + "/".join("-" if v is None else f"{v:.1f}" for v in (out, into)) + " ms)"


def _summary_lines(result: dict) -> list[str]:
    applies = "targets apply" if result["targets"]["targets_apply"] else "H100 targets: reference only"
    lines = [f"device {result['device']} ({applies})"]
    for r in result["sizes"]:
        st, t = r["steady"], r["ttff"]
        fps = f"{st['fps']:.1f}" if st["fps"] else "n/a"
        stages = ", ".join(f"{k} {v['p50_ms']:.1f}/{v['p99_ms']:.1f}" + _waits(st["stages_host_ms"].get(k, {}))
                           for k, v in (st["stages_gpu_ms"] or st["stages_host_ms"]).items() if v.get("calls"))
        lines.append(f"{r['name']:>8} (region {r['region_size']}², frame {r['frame_size'][0]}x{r['frame_size'][1]}): "
                     f"{fps} fps; TTFF cold {t['cold']['live_ms']:.0f} ms, warm live "
                     f"{t['warm_live_ms']['median']:.0f} ms, burst {t['warm_burst_ms']['median']:.0f} ms; "
                     f"work p50/p99 ms: {stages}")
    for name, c in result["summary"]["backends"].items():
        lines.append(f"{name}: onnx/torch steady fps {c['fps_onnx']:.1f}/{c['fps_torch']:.1f}; stage p50 speedup "
                     + ", ".join(f"{k} {v:.2f}x" for k, v in c["stage_p50_speedup"].items()))
    for b, sess in result.get("sessions_by_backend", {"": result["sessions"]}).items():
        for run in sess["runs"]:
            lines.append(f"{run['sessions']} session(s) of {sess['avatar']} {b}: presented fps "
                         + ", ".join(f"{p['presented_fps']:.1f}" for p in run["per_session"])
                         + f" (target {run['target_fps']:g})")
    return lines
