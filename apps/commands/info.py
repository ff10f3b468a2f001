"""``framegraph info``: versions, devices and backends available on this machine."""
from __future__ import annotations

import argparse

IMPLEMENTATION = "framegraph.apps.info"  # its run(args) runs the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
