"""``framegraph generate``'s implementation: a real video diffusion model streamed to an MP4.

The model is Wan 2.1 or SANA-Video, causal. Its options are in ``apps/commands/generate.py``.

    framegraph generate --model Wan2.1-T2V-1.3B-Self-Forcing --prompt "a fox running through snow" \\
        --seconds 10 --out fox.mp4
    framegraph generate --model self_forcing_dmd.pt --base Wan2.1-T2V-1.3B-Diffusers --prompt "..." --out x.mp4
    framegraph generate --model DIR --prompt "oil painting" --input walk.mp4 --strength 0.6 --out painted.mp4
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from framegraph.models.generate import build_generate_graph, default_dtype, file_source, load_generate_model
from framegraph.models.generate.onnx import default_wan_onnx_dir
from framegraph.models.generate.stages import check_strength, video_frames
from framegraph.models.runtime import default_device
from framegraph.stream.files import write_json
from framegraph.stream.media import MP4Sink
from framegraph.stream.progress import run_with_progress

from .argtypes import compiled_or


def _chunks(args, fps: float, r: int) -> int:
    if args.chunks:
        return args.chunks
    frames = round((args.seconds or 5.0) * fps)
    per_chunk = r * args.chunk_frames
    return max(1, -(-(frames - 1 + r) // per_chunk))  # whole chunks covering `frames` video frames


def _onnx_dir(args) -> str | None:
    """``--onnx``, or for ``--runtime onnx`` where ``framegraph export --generate`` puts the VAE folder's export."""
    if args.runtime != "onnx" or args.onnx:
        return args.onnx
    folder = args.base if os.path.isfile(args.model) else args.model
    return default_wan_onnx_dir(folder, args.size, args.chunk_frames)


def run(args: argparse.Namespace) -> int:
    if args.strength is not None:
        check_strength(args.strength)  # ValueError naming the value and the meaning
    if args.strength is not None and not args.input:
        raise ValueError("--strength goes with --input VIDEO (video-to-video); text-to-video always starts from noise")
    if args.input and not os.path.isfile(args.input):
        raise FileNotFoundError(f"--input {args.input}: no such file; expected a video file")
    if args.onnx and args.runtime != "onnx":
        raise ValueError("--onnx DIR goes with --runtime onnx")
    device = args.device or default_device(args.runtime)
    gm = load_generate_model(args.model, family=args.family, base=args.base, device=device,
                             dtype=default_dtype(device))
    height, width = args.size
    gm.latent_size(height, width)  # a bad size fails here, before anything runs
    wan_only = {"attention": args.attention, "cache_frames": args.cache_frames, "sink_frames": args.sink_frames}
    if gm.family.name != "wan" and (args.attention != "sdpa" or args.cache_frames or args.sink_frames is not None):
        raise ValueError("--attention, --cache-frames and --sink-frames are for the Wan family; SANA-Video's "
                         "attention is linear, its past a constant-size state")
    options = wan_only if gm.family.name == "wan" else {}
    chunks = _chunks(args, gm.fps, gm.vae.config.scale_factor_temporal)
    frames = video_frames(chunks, args.chunk_frames, gm.vae.config.scale_factor_temporal)
    source = file_source(args.input, frames, gm.fps) if args.input else None
    gg = build_generate_graph(gm, size=(height, width), chunks=chunks, prompt=args.prompt,
                              prompt_embeds=args.prompt_embeds, chunk_frames=args.chunk_frames,
                              timesteps=args.timesteps, shift=args.shift, source=source,
                              strength=(args.strength or 0.6) if args.input else None, seed=args.seed, device=device,
                              vae_runtime=compiled_or(args.compile, args.runtime, device), onnx_dir=_onnx_dir(args),
                              denoiser_runtime=compiled_or(args.compile, "torch", device), **options)
    warm = gg.warm()  # the model's first chunks (compilation, first calls) before the clock starts
    print(f"warmed up in {sum(warm.values()):.1f} s", file=sys.stderr)
    sink = gg.graph.add(MP4Sink(args.out, width=width, height=height, fps=gg.fps, audio_rate=None))
    gg.graph.connect(gg.decode, sink, capacity=8)
    hint = "fewer --timesteps or a smaller --size is faster" + (
        "" if torch.cuda.is_available() else ", and a CUDA GPU far faster (this machine generates on its CPU)")
    report = run_with_progress(gg.graph, sink, gg.frames, desc=f"generate {os.path.basename(args.out)}",
                               slow_hint=hint)
    if args.report:
        write_json(args.report, report)
    state = "interrupted, wrote" if report["interrupted"] else "wrote"
    print(f"{state} {args.out}: {sink.frames_written} frames {width}x{height} @ {gg.fps:g} fps, {chunks} chunks "
          f"of {args.chunk_frames} latent frames, {gm.family.name}, VAE on {args.runtime} ({report['fps']:.2f} "
          f"frames/s)", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0
