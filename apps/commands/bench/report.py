"""``framegraph bench report``: benchmark JSON files collected into one HTML page and a summary PNG. Each file is drawn
by its bench."""
from __future__ import annotations

import argparse

IMPLEMENTATION = "framegraph.apps.bench.report"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inputs", nargs="+", default=["benchmarks/results"],
                   help="JSON files or folders (searched recursively); default benchmarks/results")
    p.add_argument("--out", required=True, help="HTML file to write (a summary PNG is written beside it)")
