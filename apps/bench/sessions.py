"""``framegraph bench sessions``: N live sessions of one avatar at once, batched or not.

With batching, their model calls go through one model service, :mod:`framegraph.stream.batching`. Without it,
each session calls its own.

    framegraph bench sessions --pipeline avatar,video_avatar --sessions 1,2,3,4,8 --batching on,off --repeat 3 \\
        --out benchmarks/results/cpu/sessions.json

Each session is built as the server builds it. It has a realtime clock and is live. Frames whose audio is older
than the live lag are skipped. Each session is fed its speech in 20 ms chunks, in real time, from a common
start. That is ``measure_sessions``, shared with ``bench avatar``.

With ``--repeat N`` each count runs N times. Its row is the median run, by the slowest session's fps.

Per run it records:

- each session's presented fps, and their spread: how fair the shares were;
- each session's glass-to-glass p50 / p95, audio chunk in → picture out;
- the aggregate fps;
- the process's CPU time per presented frame;
- batched: the service's batch sizes, queue wait and frames missed.

``video_avatar`` is a video avatar at ``--video-region``. It has the trained bundles' generator widths. Its
weights are fresh, since the cost does not depend on them. ``avatar`` is the shipped portrait. Batching is built
for the video avatar's generator and for the portrait's DiT and VAE decoder, on torch and on ONNX Runtime.
"""
from __future__ import annotations

import argparse
import os
import tempfile

from framegraph.models.avatar import load_avatar, random_video_avatar
from framegraph.models.avatar.portrait.onnx import export_avatar
from framegraph.models.avatar.video.onnx import export_video_avatar
from framegraph.models.runtime import default_device
from framegraph.stream.batching import ModelService

from .avatar_measure import SESSION_FPS_TOLERANCE, measure_sessions
from .measure import torch_threads
from .meta import ROOT, bench_metadata, write_result
from .speech import speech

TRAINED_WIDTHS = (24, 48, 96, 96)  # MouthGenerator's default channels: what trained video bundles have


def _device(args) -> str:
    """Where the sessions' torch models run. ONNX Runtime's run on the CPU."""
    return "cpu" if args.runtime == "onnx" else (args.device or default_device())


def _avatar(pipeline: str, args):
    if pipeline == "video_avatar":
        return f"video avatar {args.video_region}²", random_video_avatar(region_size=args.video_region,
                                                                          generator_channels=TRAINED_WIDTHS)
    path = args.avatar or os.path.join(ROOT, "assets", "avatars", "astronaut")
    return os.path.basename(os.path.normpath(path)), load_avatar(path)


def _graph_kw(pipeline: str, avatar, args, tmp: str) -> dict:
    if args.runtime == "torch":
        return {"runtime": "torch"}
    out = os.path.join(tmp, pipeline)
    if not os.path.isdir(out):
        (export_video_avatar if pipeline == "video_avatar" else export_avatar)(avatar, out)
    return {"runtime": "onnx", "onnx_dir": out}


def _measure(pipeline: str, args, tmp: str, audio) -> dict:
    name, avatar = _avatar(pipeline, args)
    kw = _graph_kw(pipeline, avatar, args, tmp)
    rows = []
    for batching in args.batching:
        for n in args.sessions:
            runs = [_run_once(pipeline, n, batching, args, kw, avatar, audio, rep) for rep in range(args.repeat)]
            run = sorted(runs, key=lambda r: r["fps_min"])[(len(runs) - 1) // 2]  # the median, the lower of two
            run["repeats_fps_min"] = [r["fps_min"] for r in runs]
            rows.append(run)
    held = {b: max((r["sessions"] for r in rows if r["batching"] == b and r.get("all_keep_up")), default=0)
            for b in args.batching}
    return {"avatar": name, "runtime": args.runtime, "region_size": avatar.region_size, "fps": avatar.fps,
            "runs": rows, "sessions_held": held}


def _run_once(pipeline: str, n: int, batching: str, args, kw: dict, avatar, audio, rep: int) -> dict:
    """One run of ``n`` sessions, with a fresh model service when batched."""
    service = ModelService() if batching == "on" else None  # a server's: its lane on torch's default threads
    what = f"[{pipeline}] {n} session(s), batching {batching}" + (f", run {rep + 1} of {args.repeat}"
                                                                   if args.repeat > 1 else "")
    print(what, flush=True)
    run = measure_sessions(avatar, n, args.seconds, _device(args), args.torch_threads, audio,
                           {**kw, "batching": service})
    run["batching"] = batching
    run["p95_ms_max"] = max((p["end_to_end_ms"]["p95_ms"] or 0.0) for p in run["per_session"])
    if service is not None:
        # one lane per model: the portrait's DiT has one per sampler steps level it fell back to
        run["service"] = {lane.name: {**lane.stats.as_dict(), "cost_ms": {str(b): round(ns / 1e6, 3) for b, ns in
                                                                           sorted(lane.cost_ns.items())}}
                          for lane in service.lanes().values()}
    spread = "" if run["fps_spread"] is None else f" (spread {100 * run['fps_spread']:.0f} %)"
    print(f"{what}: fps min {run['fps_min']:.1f}{spread}, aggregate {run['aggregate_fps']:.1f}, p95 "
          f"{run['p95_ms_max']:.0f} ms, CPU {run['cpu_ms_per_frame']:.1f} ms/frame", flush=True)
    return run


def run(args: argparse.Namespace) -> int:
    result = bench_metadata("sessions")
    audio, audio_info = speech(args.seconds, seed=2)
    result["description"] = {
        "what": "N live sessions of one avatar at once (realtime clock, fed in real time), their generator calls "
                "batched by one model service or each alone",
        "keep_up_rule": f"presented fps >= {SESSION_FPS_TOLERANCE:g} x the avatar's fps",
        "glass_to_glass": "end_to_end_ms: an audio chunk's arrival at the source to its picture at the sink",
        "cpu_ms_per_frame": "the process's CPU time over the run / the frames all sessions presented",
        "audio": {**audio_info, "seconds": args.seconds}, "torch_threads": args.torch_threads,
        "repeat": f"{args.repeat} run(s) per row; a row is the median run by its slowest session's fps",
        "cpus": os.cpu_count(), "load_at_start": os.getloadavg()[0], "session_device": _device(args)}
    with torch_threads(args.torch_threads), tempfile.TemporaryDirectory(prefix="fg-bench-sessions-") as tmp:
        result["pipelines"] = {p: _measure(p, args, tmp, audio) for p in args.pipeline}
    result["load_at_end"] = os.getloadavg()[0]
    png = write_result(result, args.out, figure)
    for p, res in result["pipelines"].items():
        print(f"{p} ({res['avatar']}, {res['runtime']}): sessions held at {res['fps']:g} fps: "
              + ", ".join(f"batching {b} {n}" for b, n in res["sessions_held"].items()))
    print(f"wrote {args.out} and {png}")
    return 0


def figure(result: dict, plt):
    pipes = result["pipelines"]
    fig, axes = plt.subplots(1, len(pipes), figsize=(5.5 * len(pipes), 4), squeeze=False)
    for ax, (p, res) in zip(axes[0], pipes.items()):
        for b, colour in (("on", "#228833"), ("off", "#aa3377")):
            runs = [r for r in res["runs"] if r["batching"] == b and "fps_min" in r]
            if runs:
                ax.plot([r["sessions"] for r in runs], [r["fps_min"] for r in runs], "o-", color=colour,
                        label=f"batching {b}: slowest session")
        ax.axhline(SESSION_FPS_TOLERANCE * res["fps"], color="grey", ls="--", lw=1, label="keeps up")
        ax.set(xscale="log", xlabel="sessions at once", ylabel="presented fps")
        ax.set_title(f"{p}: {res['avatar']} on {res['runtime']}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
