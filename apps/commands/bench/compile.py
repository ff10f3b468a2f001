"""``framegraph bench compile``: every Triton kernel compiled offline for sm_89 / sm_90 / sm_120. It records registers,
spills and shared memory."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """A GPU architecture we compile for: compute capability, a GPU, its shared memory per block. 89 is sm_89."""

    capability: int
    gpu: str
    shared_limit_bytes: int


TARGETS = (
    Target(89, "RTX 4090 (Ada)", 99 * 1024),
    Target(90, "H100 (Hopper)", 227 * 1024),
    Target(120, "RTX 5090 (Blackwell)", 99 * 1024),
)

IMPLEMENTATION = "framegraph.apps.bench.compile"  # its run(args) and figure(data, plt)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compile.json"), help="JSON file to write")
    parser.add_argument("--arch", type=int, nargs="+", choices=[t.capability for t in TARGETS],
                        default=[t.capability for t in TARGETS], help="compute capabilities to compile for")
    parser.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
