"""``framegraph bench video_avatar``: a video avatar, bundle kind "video", on a real clip of its person.

    framegraph bench video_avatar --avatar AVATAR_DIR --clip person.mp4 --out benchmarks/results/cpu/video_avatar.json

It measures, on this machine's CPU:

- **quality** on the held-out segment. Its audio was never used in training. By default the segment runs from
  the bundle's ``training.heldout.start_s`` to the end. The measure is
  :func:`framegraph.models.avatar.video_eval.evaluate_video_avatar`. It gives the landmark mouth-openness
  correlation, generated vs real. It gives PSNR / SSIM outside the mouth, and mouth sharpness. It gives the jaw
  line's edge at its worst frame. It checks that the lips close in silence.
- **typed text**, ``typed_text``: :func:`~framegraph.models.avatar.eval.video.evaluate_typed_text`. The avatar
  draws eSpeak NG sentences it never learnt, on its loop. The drawn mouth is compared with their phonemes' jaw.
  It also records how wide the mouth opens while speaking. The person's real ``real_speaking_openness`` stands
  beside it.
- **speed** of the real graph, ``build_avatar_graph``. The graph is AudioFeatures → state → MouthShape,
  VideoLoop → MouthRegion. It runs on each ``--runtime``: torch, and ONNX Runtime. The ONNX export is made for
  the run. It runs on a fast clock at the video's resolution. It records frames per second. It records the time
  from the graph's start to its first frame out. Both are taken at the bundle's own region size. Both are also
  taken for a generator of the same architecture at ``--region``, 256 by default. That generator's weights are
  fresh, since the cost does not depend on them.

The bundle is loaded as the server loads it, with ``load_bundle_at``. That loads the weights and the voice
detector. ``first_frame_ms`` is the first session's. Its kernels run for the first time in the process.
``first_frame_warm_ms`` is the median of the next ``--warm-runs`` sessions'. That is what each later user of a
running server waits for. Speed runs before quality, so the first session is the process's first.

With ``--people VIDEO...`` it measures something else. It measures one change to what the mouth hears, on every
person. See :mod:`.video_avatar_people`.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from framegraph.apps.bundles import load_bundle_at
from framegraph.models import runtime as models_runtime
from framegraph.models.avatar.eval.video import evaluate_typed_text, evaluate_video_avatar
from framegraph.models.synth.espeak import EspeakNotFound
from framegraph.models.training import REPORT
from framegraph.stream.media import decode_audio

from .meta import bench_metadata, write_result
from .video_avatar_speed import at_region, graph_speed


def _training_run(folder: str) -> dict | None:
    """How the bundle's training went, from ``avatar train``'s ``train_report.json``. None without one.

    It holds the seconds of each phase, the threads and torch. It holds the video's frames and seconds."""
    path = os.path.join(folder, REPORT)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        report = json.load(f)
    return {k: report.get(k) for k in ("timings", "threads", "torch", "frames", "train_frames", "seconds")}


def run(args: argparse.Namespace) -> int:
    if args.people:
        from . import video_avatar_people
        return video_avatar_people.run(args)
    if not (args.avatar and args.clip):
        raise ValueError("bench video_avatar needs --avatar and --clip (one bundle on a clip of its person), or "
                         "--people VIDEO... (a change measured on every person)")
    folder = os.path.abspath(args.avatar)
    avatar = load_bundle_at(folder)
    if avatar.kind != "video":
        raise ValueError(f"--avatar {args.avatar!r} is a portrait bundle; this bench measures a video avatar "
                         f"(framegraph avatar train --video)")
    torch.set_num_threads(args.threads)
    start = args.start_s if args.start_s is not None else avatar.heldout_start_s
    result = bench_metadata("video_avatar")
    result.update({"avatar": args.avatar, "clip": args.clip, "torch_threads": args.threads,
                   "training": avatar.meta.get("training"), "training_run": _training_run(folder)})
    audio = decode_audio(args.audio or args.clip)
    runtimes = [r.strip() for r in args.runtime.split(",") if r.strip()]
    for r in runtimes:
        models_runtime.check("avatar-video", r)
    result["speed"] = [graph_speed(avatar, audio, args.seconds, args.warm_runs, r, args.threads) for r in runtimes]
    if args.region and args.region != avatar.region_size and args.region <= min(avatar.width, avatar.height):
        big = at_region(avatar, args.region)
        result["speed"] += [{**graph_speed(big, audio, args.seconds, args.warm_runs, r, args.threads),
                             "weights": "fresh (same architecture; the cost does not depend on them)"}
                            for r in runtimes]
    t0 = time.monotonic()
    result["quality"] = evaluate_video_avatar(avatar, args.clip, start_s=start, end_s=args.end_s)
    result["quality"]["seconds"] = round(time.monotonic() - t0, 1)
    try:  # typed text, as a user who types meets the avatar: eSpeak sentences it never learnt
        result["typed_text"] = evaluate_typed_text(avatar)
    except EspeakNotFound as exc:
        result["typed_text"] = {"skipped": str(exc)}
    held = avatar.heldout_start_s  # measured on frames training never saw, or not
    result["quality"]["held_out"] = held > 0 and start >= held
    png = write_result(result, args.out, figure)
    print(json.dumps({"quality": {k: result["quality"][k] for k in (
        "landmark_openness_corr", "landmark_openness_swing", "outside_mouth_psnr_db", "mouth_sharpness_ratio",
        "lips_sharpness_ratio", "jaw_edge_ratio", "jaw", "silence", "real_speaking_openness")},
        "typed_text": result["typed_text"],
        "speed": result["speed"]}, indent=1))
    print(f"wrote {args.out} and {png}")
    return 0


def figure(data: dict, plt):
    if "people" in data:
        from . import video_avatar_people
        return video_avatar_people.figure(data, plt)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    runs = data.get("speed", [])
    labels = [f"{r['region_size']}² {r.get('runtime', 'torch')}" for r in runs]
    ax.bar(labels, [r["fps"] or 0 for r in runs], color="#4878a8")
    for i, r in enumerate(runs):
        ax.text(i, (r["fps"] or 0) + 0.3, f"{r['fps']} fps\nfirst frame {r['first_frame_ms']} ms\n(later sessions "
                f"{r.get('first_frame_warm_ms')} ms)", ha="center", va="bottom",
                fontsize=8)
    q = data.get("quality", {})
    ax.set_title(f"video avatar ({data.get('torch_threads')} CPU threads): openness r="
                 f"{q.get('landmark_openness_corr')}, outside-mouth {q.get('outside_mouth_psnr_db')} dB", fontsize=8)
    ax.set_ylabel("frames / s (graph, fast clock)")
    ax.set_ylim(0, max([r["fps"] or 0 for r in runs] + [25]) * 1.35)
    fig.tight_layout()
    return fig
