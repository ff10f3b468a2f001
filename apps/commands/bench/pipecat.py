"""``framegraph bench pipecat``: the avatar as a Pipecat processor, against the bare avatar graph. The processor runs in
real Pipecat pipelines. It records images per second delivered and the delay from a TTS frame to its image. It also runs
concurrent agents."""
from __future__ import annotations

import argparse
import os

from framegraph import assets
from framegraph.apps.argtypes import positive_ints

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.pipecat"  # its run(args) and figure(data, plt)
ASSETS = str(assets.ROOT)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--avatar", default=os.path.join(ASSETS, "avatars", "astronaut"), help="the bundle (default: the "
                                                                                        "shipped astronaut)")
    p.add_argument("--runtime", default="torch,onnx", help="comma-separated runtimes (default torch,onnx)")
    p.add_argument("--agents", type=positive_ints, default=[1, 2],
                   help="concurrent agents, comma-separated (default 1,2)")
    p.add_argument("--seconds", type=float, default=10.0, help="speech per agent and run (default 10)")
    p.add_argument("--onnx", default=None, help="an existing export of the bundle (default: made into a temporary "
                                                "folder first, timed)")
