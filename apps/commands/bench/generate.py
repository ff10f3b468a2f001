"""``framegraph bench generate``: Wan / SANA-Video streamed end to end. It records FPS (denoise + decode + encode),
first frame, stage p50/p99 and peak memory."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import (
    SIZE_LIMIT,
    VAE_RUNTIMES,
    add_runtime_argument,
    name_list,
    positive_int,
    positive_ints,
    runtime_list,
    size_hw,
)

from . import add_out_argument

IMPLEMENTATION = "framegraph.apps.bench.generate"  # its run(args) and figure(data, plt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", choices=["wan", "sana"], required=True)
    p.add_argument("--config", choices=["1.3b", "2b", "tiny"], required=True,
                   help="1.3b (Wan 2.1), 2b (SANA-Video) or tiny (either family; CPU runs)")
    p.add_argument("--size", type=size_hw, default=(480, 832), help=f"HEIGHTxWIDTH (default 480x832; {SIZE_LIMIT})")
    p.add_argument("--steps", type=positive_int, default=4,
                   help="denoising steps per chunk (timesteps 1000 down in equal steps)")
    p.add_argument("--attention", choices=["sdpa", "monarch"], default="sdpa", help="(Wan) attention over the cache")
    p.add_argument("--chunk-frames", type=positive_int, default=3, help="latent frames per chunk (default 3)")
    p.add_argument("--chunks", type=positive_int, default=8, help="chunks to generate (default 8)")
    p.add_argument("--warmup", type=int, default=1, help="first chunks left out of the steady FPS (default 1)")
    p.add_argument("--device", help="cuda (bf16) or cpu (fp32); default cuda when available")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads, and ONNX Runtime's with --runtime onnx "
                                                        "(default: torch's; ORT: half the cores)")
    p.add_argument("--vae", choices=["tiny", "wan2.1"], default=None,
                   help="the VAE: tiny or wan2.1 (the real decoder, random weights); default tiny with --config tiny")
    add_runtime_argument(p, "where the VAE decoder computes: torch, onnx (ONNX Runtime, CPU, float32: the decoder is "
                            "exported first, into a temporary folder) or both, comma-separated, measured one after "
                            "the other in one run (e.g. torch,onnx; default torch)",
                         type=runtime_list(VAE_RUNTIMES), default=["torch"])
    p.add_argument("--compile", action="store_true",
                   help="the transformer and the torch VAE decoder on the compiled runtime (Inductor, and CUDA graphs "
                        "on a GPU unless FRAMEGRAPH_CUDA_GRAPHS=0)")
    p.add_argument("--warm", action="store_true",
                   help="warm the graph before it starts (GenerateGraph.warm: the model load's second half); "
                        "its time is recorded as warm_s and the first frame is then the first frame after preload")
    p.add_argument("--sessions", type=positive_ints, default=None,
                   help="sessions at once, comma-separated (e.g. 1,2,4): each count runs that many graphs side by "
                        "side, each with its own seed and prompt, and records each one's FPS (default: one graph)")
    p.add_argument("--batching", type=name_list(("on", "off"), "--batching"), default=["on", "off"],
                   help="with --sessions: on (one model, the denoiser's chunks batched on the model service's lane), "
                        "off (a model per session, each alone) or on,off (default)")
    add_out_argument(p)
