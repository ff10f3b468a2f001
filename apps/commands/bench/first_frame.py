"""``framegraph bench first_frame``: a session's first frame after preload, against its steady per-frame latency. It
covers cold and warm, torch and compiled. Each configuration runs in a fresh process."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import positive_int, positive_ints

from . import add_out_argument

PIPELINES = ("generate", "avatar", "video_avatar")
RUNTIMES = ("torch", "compiled")

IMPLEMENTATION = "framegraph.apps.bench.first_frame"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--pipelines", default=",".join(PIPELINES), help=f"comma-separated, of {', '.join(PIPELINES)}")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help="comma-separated: torch, compiled")
    p.add_argument("--frames", type=int, default=24, help="frames per session (generate: chunks; default 24)")
    p.add_argument("--warmup", type=int, default=3, help="units after the first left out of the steady median")
    p.add_argument("--video-region", type=positive_ints, default=[96, 208],
                   help="video avatar regions, px, comma-separated (default 96,208: a small one, where a session's "
                        "fixed costs weigh most, and the natural-speech bundles' 208)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--config", choices=["tiny", "1.3b"], default="tiny", help="generate: the Wan configuration")
    p.add_argument("--size", type=lambda t: [int(v) for v in t.lower().split("x")], default=[64, 96],
                   help="generate: HEIGHTxWIDTH (default 64x96)")
    p.add_argument("--vae", choices=["tiny", "wan2.1"], default=None, help="generate: the VAE (default: with --config)")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="processes per configuration (default 1): with more, the configuration's figures are its "
                        "median run's (by first frame / steady), every run's ratio kept beside them")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds one configuration may take")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a configuration, in this process
    p.add_argument("--pipeline", help=argparse.SUPPRESS)
    p.add_argument("--runtime", help=argparse.SUPPRESS)
    p.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
