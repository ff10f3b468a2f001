"""``framegraph bench video_avatar``: a video avatar on a real clip. It records held-out lip sync, PSNR outside the
mouth, FPS and first frame. With ``--people`` it measures one change to what the mouth hears on every person, before and
after."""
from __future__ import annotations

import argparse

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.video_avatar"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--avatar", help="a video avatar bundle (framegraph avatar train --video)")
    p.add_argument("--clip", help="a real clip of the same person at the bundle's size and fps")
    p.add_argument("--people", nargs="+", metavar="VIDEO",
                   help="instead of --avatar/--clip: talking videos of one person each; per person a bundle is "
                        "trained with --change off and one with it on (the same generator), both measured on the "
                        "held-out tail; the change is kept only if nobody's openness correlation drops by more "
                        "than 0.03 (minutes per person: the training's, about 10 for a 20-s video on 2 threads)")
    p.add_argument("--change", default="whisper",
                   help="with --people: the training setting compared, off then on: whisper (the mouth hears "
                        "Whisper's features beside the encoder), av_sync, follow_openness, gain_folds (the head's "
                        "gain measured on 4 folds, then on 8) (default whisper)")
    p.add_argument("--work", default="people", help="with --people: where the bundles are trained (WORK/<video "
                                                     "name>/{before,after}; a finished one is continued; people)")
    p.add_argument("--steps", type=int, default=3000, help="with --people: the generator's training steps (3000)")
    p.add_argument("--holdout", type=float, default=0.2,
                   help="with --people: the share of each video's end kept out of training and measured (0.2)")
    p.add_argument("--start-s", type=float, help="held-out segment start (default: the bundle's training holdout)")
    p.add_argument("--end-s", type=float, help="held-out segment end (default: the clip's end)")
    p.add_argument("--audio", help="speech driving the speed runs (default: the clip's own sound)")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds of audio per speed run (8)")
    p.add_argument("--region", type=int, default=256, help="also time a generator of this region size (256)")
    p.add_argument("--warm-runs", type=int, default=3, help="later sessions timed to their first frame (3)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (2)")
    p.add_argument("--runtime", default="torch",
                   help="comma-separated runtimes to time the graph on: torch, onnx (the audio encoder and the "
                        "generator on ONNX Runtime, exported for the run; default torch)")
    add_out_argument(p)
