"""``framegraph bench video_avatar --people``: one change to what the mouth hears, measured on every person.

    framegraph bench video_avatar --people a.mp4 b.mp4 c.mp4 --work WORK --out benchmarks/results/cpu/people.json

Each talking video shows one person. Per video, two bundles are trained on the same first part of the video.
``--holdout`` keeps its tail out of training. ``before`` has ``--change``'s setting off. For ``whisper`` that
means the mouth hears the astronaut encoder alone. ``after`` has it on, the default.

The change touches only the sound's side: features, shape head, A/V lag. So the generator is trained once, for
``before``. ``after`` continues from its finished checkpoint. Both are measured as ``bench video_avatar``
measures one bundle. That is the held-out tail's landmark openness correlation and swing, the lips' sharpness
and the lips in silence. It is also frames per second of the real graph, torch on a fast clock. Speed is taken
at the bundle's region and at ``--region``.

The verdict: the change is kept only if no person's held-out openness correlation drops by more than
``KEEP_DROP``, 0.03. ``WORK/<video name>/{before,after}`` keep the bundles and their train reports. A bundle
trained there before with the same settings is continued from the generator's checkpoint, not trained again.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from framegraph.apps.bundles import load_bundle_at
from framegraph.models.avatar.eval.video import evaluate_video_avatar
from framegraph.models.avatar.video.generator import GENERATOR_STATE
from framegraph.models.avatar.video.lipsync import GAIN_FOLDS
from framegraph.models.avatar.video.train import VIDEO_CLIPS, train_video_avatar
from framegraph.stream.media import decode_audio

from .meta import bench_metadata, write_result
from .video_avatar_speed import at_region, graph_speed

KEEP_DROP = 0.03  # the most a person's held-out openness correlation may drop for a change to be kept
# VideoTrainConfig's fields of the sound's side: each change's setting off ('before') and on ('after', the default)
CHANGES = {"whisper": (False, True), "av_sync": (False, True), "follow_openness": (False, True),
           "gain_folds": (4, GAIN_FOLDS)}
QUALITY = ("landmark_openness_corr", "landmark_openness_swing", "lips_sharpness_ratio", "mouth_sharpness_ratio",
           "silence")


def _train(video: str, folder: Path, settings: dict, threads: int) -> tuple[dict, float]:
    """Train or continue the bundle in ``folder``. Returns its report and the minutes it took here."""
    t0 = time.monotonic()
    _, report = train_video_avatar(video, folder, torch_threads=threads, progress=False,
                                   log=lambda m: print(f"  {m}", file=sys.stderr), **settings)
    return report, round((time.monotonic() - t0) / 60, 2)


def _measure(folder: Path, video: str, audio, args) -> dict:
    """One bundle's held-out quality and its graph's speed. See the module docstring."""
    avatar = load_bundle_at(folder)
    q = evaluate_video_avatar(avatar, video, start_s=avatar.heldout_start_s)
    speed = [graph_speed(avatar, audio, args.seconds, 0, "torch", args.threads)]
    if args.region and args.region != avatar.region_size and args.region <= min(avatar.width, avatar.height):
        speed.append(graph_speed(at_region(avatar, args.region), audio, args.seconds, 0, "torch", args.threads))
    return {**{k: q.get(k) for k in QUALITY}, "heldout_start_s": avatar.heldout_start_s,
            "features": avatar.features_kind,
            "fps": {str(s["region_size"]): s["fps"] for s in speed},
            "first_frame_ms": {str(s["region_size"]): s["first_frame_ms"] for s in speed}}


def _person(video: str, args) -> dict:
    name = Path(video).stem
    root = Path(args.work) / name
    base = {"steps": args.steps, "holdout": args.holdout}
    off, on = CHANGES[args.change]
    print(f"{name}: training 'before' ({args.change} {off}; the generator, {args.steps} steps)", file=sys.stderr)
    before_report, before_min = _train(video, root / "before", {**base, args.change: off}, args.threads)
    state = root / "before" / "train" / GENERATOR_STATE
    (root / "after" / "train").mkdir(parents=True, exist_ok=True)
    shutil.copy2(state, root / "after" / "train" / GENERATOR_STATE)  # the same generator: only the sound differs
    # and the same prepared clips: the checkpoint holds to their pictures (libx264 may encode a frame of a width
    # not a multiple of 16 differently run to run, so clips prepared afresh can differ by a few levels)
    shutil.copytree(root / "before" / "train" / VIDEO_CLIPS, root / "after" / "train" / VIDEO_CLIPS,
                    dirs_exist_ok=True)
    print(f"{name}: training 'after' ({args.change} {on}; the generator continues as finished)", file=sys.stderr)
    after_report, after_min = _train(video, root / "after", {**base, args.change: on}, args.threads)
    audio = decode_audio(video)
    out = {"person": name, "video": os.path.basename(video)}
    for side, report, minutes in (("before", before_report, before_min), ("after", after_report, after_min)):
        print(f"{name}: measuring '{side}' on the held-out tail", file=sys.stderr)
        out[side] = {**_measure(root / side, video, audio, args), "train_minutes_here": minutes,
                     "train_timings": report["timings"], "audio_features": report["audio_features"],
                     "av_offset": report["av_offset"], "head_heldout": report["heldout"]}
    corr = [out[s]["landmark_openness_corr"] for s in ("before", "after")]
    out["corr_change"] = None if None in corr else round(corr[1] - corr[0], 4)
    out["worse"] = out["corr_change"] is None or out["corr_change"] < -KEEP_DROP
    return out


def run(args: argparse.Namespace) -> int:
    if args.change not in CHANGES:
        raise ValueError(f"--change {args.change!r}; expected one of {list(CHANGES)}")
    for video in args.people:
        if not os.path.isfile(video):
            raise ValueError(f"--people {video!r} does not exist; expected a talking video of one person")
    torch.set_num_threads(args.threads)
    result = bench_metadata("video_avatar")
    result.update({"change": args.change, "keep_drop": KEEP_DROP, "steps": args.steps, "holdout": args.holdout,
                   "torch_threads": args.threads, "work": os.path.abspath(args.work), "people": []})
    for video in args.people:
        result["people"].append(_person(video, args))
    worse = [p["person"] for p in result["people"] if p["worse"]]
    result["kept"] = not worse
    result["verdict"] = (f"kept: no person's held-out openness correlation drops by more than {KEEP_DROP}"
                         if not worse else f"not kept: {', '.join(worse)} drop(s) by more than {KEEP_DROP}")
    png = write_result(result, args.out, figure)
    for p in result["people"]:
        b, a = p["before"], p["after"]
        print(f"{p['person']}: openness r {b['landmark_openness_corr']} -> {a['landmark_openness_corr']}, swing "
              f"{b['landmark_openness_swing']} -> {a['landmark_openness_swing']}, lips "
              f"{b['lips_sharpness_ratio']} -> {a['lips_sharpness_ratio']}, fps {b['fps']} -> {a['fps']}")
    print(result["verdict"])
    print(f"wrote {args.out} and {png}")
    return 0


def figure(data: dict, plt):
    people = data.get("people", [])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    xs = range(len(people))
    for dx, side, colour in ((-0.2, "before", "#a0a0a0"), (0.2, "after", "#4878a8")):
        vals = [p[side]["landmark_openness_corr"] or 0 for p in people]
        ax.bar([x + dx for x in xs], vals, width=0.38, color=colour, label=f"{data.get('change')} {side}")
        for x, v in zip(xs, vals):
            ax.text(x + dx, v + 0.01, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [p["person"] for p in people], fontsize=8)
    ax.set_ylabel("held-out openness correlation")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title(data.get("verdict", ""), fontsize=8)
    fig.tight_layout()
    return fig
