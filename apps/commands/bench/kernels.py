"""``framegraph bench kernels``: the attention and DiT kernels against their torch and library peers."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal, get_args

Op = Literal["block_linear_attention", "norm_modulate", "gate_residual", "apply_rope", "monarch_attention"]
OPS: tuple[Op, ...] = get_args(Op)
Dtype = Literal["bfloat16", "float16", "float32"]

IMPLEMENTATION = "framegraph.apps.bench.kernels"  # its run(args) and figure(data, plt)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("benchmarks/kernels.json"),
                        help="JSON file to write (PNG beside it)")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--dtype", choices=get_args(Dtype), default=None,
                        help="input dtype (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="untimed calls for at least this long (25)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timed repetitions for at least this long (100)")
    parser.add_argument("--iters", type=int, default=10_000,
                        help="at most this many timed repetitions (the --rep-ms budget decides below it)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="untimed calls besides --warmup-ms (kept for old scripts)")
    parser.add_argument("--no-peaks", action="store_true", help="skip measuring the device's copy / matmul peaks")
    parser.add_argument("--backward", action="store_true", help="also time forward+backward")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=20)
    parser.add_argument("--head-dim", type=int, default=112)
    parser.add_argument("--frames", type=int, default=8, help="latent frames (tokens = frames * block size)")
    parser.add_argument("--block-size", type=int, default=1560, help="tokens per block (480p Sana-Video frame: 30x52)")
    parser.add_argument("--channels", type=int, default=2240, help="model width for the elementwise ops")
    add_monarch_arguments(parser)


def add_monarch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--monarch-grid", type=int, nargs=3, default=(21, 30, 52), metavar=("F", "H", "W"),
                        help="token grid after patching (default: Wan 480p, 81 frames: 21 x 30 x 52)")
    parser.add_argument("--monarch-iters", type=int, default=2, help="num_iters of the timed Monarch call")
