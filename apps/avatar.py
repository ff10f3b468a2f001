"""``framegraph avatar``: the talking avatar's tools.

    framegraph avatar synth --out data/synth --clips 100 --seconds 8 [--portrait me.jpg] [--seed 0]

``synth`` writes synthetic talking clips of a portrait (MP4: H.264 + AAC 16 kHz) with a JSON of
ground truth per frame (jaw open, lip width / round, teeth, blink, head pose offsets, state) and the
eSpeak NG phoneme events, plus ``index.json`` listing the clips. Needs the system package
``espeak-ng``. (``train`` and ``eval`` will join it.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive whole number")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return v


def _box(text: str):
    from framegraph.models.synth.portrait import PortraitError, parse_box

    try:
        return parse_box(text)
    except PortraitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="avatar_command", required=True, metavar="WHAT")
    s = sub.add_parser("synth", help="write synthetic talking clips (MP4 + JSON ground truth) of a portrait",
                       description="Animate a portrait with eSpeak NG speech in several voices, rates and "
                                   "pitches: visemes from the phoneme events, blinks, head motion, idle and "
                                   "listening stretches. Writes clip_NNNNN.mp4 + clip_NNNNN.json per clip and "
                                   "index.json. Deterministic for a given --seed.")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--clips", type=_positive_int, default=10, help="number of clips (default 10)")
    s.add_argument("--seconds", type=_positive_float, default=8.0, help="length of each clip (default 8)")
    s.add_argument("--fps", type=_positive_int, default=25, help="frames per second; must divide 16000 (default 25)")
    s.add_argument("--portrait", help="image file of a frontal face (default: the shipped astronaut portrait)")
    s.add_argument("--mouth-box", type=_box, metavar="X,Y,W,H",
                   help="mouth box in the portrait's pixels (default: found with OpenCV's Haar cascades)")
    s.add_argument("--max-side", type=_positive_int, default=512,
                   help="scale larger portraits down to this longer side (default 512)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0); clip i uses (seed, i)")
    s.set_defaults(avatar_func=run_synth)


def run(args: argparse.Namespace) -> int:
    return args.avatar_func(args)


def run_synth(args: argparse.Namespace) -> int:
    from framegraph.models.synth import (EspeakError, EspeakNotFound, PortraitError, PortraitRenderer,
                                         espeak_available, load_portrait, prepare_clip)
    from framegraph.models.synth.espeak import INSTALL_HINT

    from .runner import run_with_progress

    if 16_000 % args.fps:
        print(f"framegraph avatar synth: error: --fps {args.fps} must divide 16000 (25, 32, 40, 50...)",
              file=sys.stderr)
        return 2
    try:
        portrait = load_portrait(args.portrait, mouth_box=args.mouth_box, max_side=args.max_side)
    except (FileNotFoundError, PortraitError) as exc:
        print(f"framegraph avatar synth: error: {exc}", file=sys.stderr)
        return 2
    if not espeak_available():
        print(f"framegraph avatar synth: error: eSpeak NG is not installed; {INSTALL_HINT}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    renderer = PortraitRenderer(portrait)
    written = []
    for i in range(args.clips):
        try:
            job = prepare_clip(args.out, i, seconds=args.seconds, fps=args.fps, portrait=portrait, seed=args.seed,
                               renderer=renderer)
        except (EspeakNotFound, EspeakError) as exc:
            print(f"framegraph avatar synth: error: {exc}", file=sys.stderr)
            return 2
        report = run_with_progress(job.graph, job.sink, job.plan.n_frames, desc=f"clip {i + 1}/{args.clips}")
        if report["interrupted"]:
            print(f"interrupted: {job.video_path} is shorter than planned and has no ground truth; "
                  f"{len(written)} complete clips in {args.out}", file=sys.stderr)
            break
        job.write_ground_truth()
        written.append({"video": os.path.basename(job.video_path), "json": os.path.basename(job.json_path),
                        "frames": job.plan.n_frames, "clip": i})
    index = {"seed": args.seed, "fps": args.fps, "seconds": args.seconds, "portrait": portrait.to_json(),
             "clips": written}
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"wrote {len(written)} clips of {args.seconds:g} s ({portrait.width}x{portrait.height} @ {args.fps} fps) "
          f"to {args.out}", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0 if len(written) == args.clips else 130
