"""``framegraph bench startup``: how long each command takes from the shell, start-up included. The commands are
``--help``, ``render --help``, ``info``, a 1-s test card and a 1-s avatar render."""
from __future__ import annotations

import argparse
import os

from framegraph import assets

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.startup"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--runs", type=int, default=7, help="runs of each command, taken in turns (default 7; the median "
                                                       "is reported)")
    p.add_argument("--avatar", default=os.path.join(str(assets.ROOT), "avatars", "astronaut"),
                   help="the avatar bundle the avatar row renders (default assets/avatars/astronaut)")
    p.add_argument("--quick", action="store_true", help="one run of each (a smoke test, not a measurement)")
