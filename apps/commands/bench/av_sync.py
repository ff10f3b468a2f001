"""``framegraph bench av_sync``: the A/V shift training would make on real clips. It compares two rules. The old one is
the rule before the shape head's confirmation and the peak-inside-the-window test. The new one has both. It also records
the head's fit at each lag."""
from __future__ import annotations

import argparse

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.av_sync"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clip", action="append", required=True,
                   help="a talking video of one person (repeat for several); named in the result by --name")
    p.add_argument("--name", action="append", help="how the result names each --clip (default: its file name)")
    p.add_argument("--holdout", type=float, default=0.2, help="the end share kept out of training (0.2)")
    p.add_argument("--work", required=True, help="folder for the prepared clips (reused between runs)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    add_out_argument(p)
