"""``framegraph generate``: stream a real video diffusion model (Wan 2.1 or SANA-Video, causal) to an MP4.

    framegraph generate --model Wan2.1-T2V-1.3B-Self-Forcing --prompt "a fox running through snow" \\
        --seconds 10 --out fox.mp4
    framegraph generate --model self_forcing_dmd.pt --base Wan2.1-T2V-1.3B-Diffusers --prompt "..." --out x.mp4
    framegraph generate --model DIR --prompt "oil painting" --input walk.mp4 --strength 0.6 --out painted.mp4
"""
from __future__ import annotations

import argparse
import os
import sys

from .argtypes import add_compile_argument, compiled_or, positive_float, positive_int

EPILOG = """\
weights (local disk only, nothing is downloaded):
  --model DIR     a diffusers folder: model_index.json, transformer/ (WanTransformer3DModel or
                  SanaVideoTransformer3DModel), vae/ (AutoencoderKLWan), scheduler/, and optionally
                  text_encoder/ + tokenizer/ (without them, pass --prompt-embeds)
  --model FILE    a single-file Wan causal student (.safetensors/.pt/.pth, original Wan key names, as
                  Self-Forcing, CausVid and LongLive publish) + --base DIR, the diffusers folder of its base
                  model (e.g. Wan2.1-T2V-1.3B-Diffusers) for config, VAE and text encoder

how it streams: chunks of --chunk-frames latent frames (3: 9 video frames for the first chunk, 12 after,
at 16 fps), each denoised in len(--timesteps) steps with a cache of the past (Wan: a rolling KV cache
with attention sinks; SANA-Video: a constant-size linear-attention state), then decoded by the causal VAE
with its cache. Bidirectional checkpoints (the stock Wan 2.1 / SANA-Video releases) run, but only causal
students (trained block-causally, few steps) make good video this way.
"""


def _timesteps(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timesteps {text!r}: expected comma-separated numbers, e.g. "
                                         f"1000,750,500,250") from None
    if not values or any(not 0 < v <= 1000 for v in values) or any(a <= b for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"--timesteps {text!r}: expected strictly decreasing values in (0, 1000], "
                                         f"e.g. 1000,750,500,250")
    return values


def _size_hw(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size {text!r}: expected HEIGHTxWIDTH, e.g. 480x832") from None
    if h <= 0 or w <= 0:
        raise argparse.ArgumentTypeError(f"--size {text!r}: height and width must be positive")
    return h, w


def _strength(text: str) -> float:
    from framegraph.models.generate.stages import STRENGTH_MEANING, check_strength

    try:
        return check_strength(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--strength {text!r}: expected a number in (0, 1]: {STRENGTH_MEANING}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("--model", required=True, help="diffusers folder, or single-file Wan causal student (with --base)")
    p.add_argument("--base", help="diffusers folder of the base model: config, VAE, text encoder for a single-file "
                                  "--model (or the text encoder a --model folder lacks)")
    p.add_argument("--family", choices=["wan", "sana"], help="model family (default: read from the folder's config)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="text prompt (needs text_encoder/ + tokenizer/ in --model or --base)")
    what.add_argument("--prompt-embeds", metavar="FILE",
                      help="precomputed prompt embeddings: a .safetensors file with prompt_embeds [L, D] (D = the "
                           "model's text width) and optionally prompt_attention_mask [L]")
    p.add_argument("--timesteps", "--steps", type=_timesteps, default=[1000.0, 750.0, 500.0, 250.0],
                   help="few-step schedule on the 0..1000 scale, one model call each (default 1000,750,500,250, "
                        "Self-Forcing's)")
    p.add_argument("--shift", type=positive_float, default=5.0,
                   help="flow shift the timesteps are warped with (default 5, as Self-Forcing / CausVid / LongLive "
                        "sample: 1000,750,500,250 become 1000,937.5,833,625); 1 uses them as given")
    p.add_argument("--attention", choices=["sdpa", "monarch"], default="sdpa",
                   help="(Wan) self-attention over the KV cache: exact SDPA or Monarch attention (block-causal)")
    p.add_argument("--cache-frames", type=positive_int,
                   help="(Wan) latent frames the KV cache keeps per layer, sinks included (default 4 chunks)")
    p.add_argument("--sink-frames", type=int,
                   help="(Wan) the stream's first latent frames kept for ever as attention sinks (default 1 chunk)")
    p.add_argument("--size", type=_size_hw, default=(480, 832),
                   help="HEIGHTxWIDTH in pixels (default 480x832); multiples of 16")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=positive_float, help="video length (default 5); rounded up to whole chunks")
    length.add_argument("--chunks", type=positive_int, help="number of chunks to generate")
    p.add_argument("--chunk-frames", type=positive_int, default=3,
                   help="latent frames per chunk (default 3, what Self-Forcing / CausVid students were trained with)")
    p.add_argument("--input", metavar="VIDEO", help="video-to-video: restyle this video (looped to the length)")
    p.add_argument("--strength", type=_strength, default=None,
                   help="(with --input) how much to change it: 0..1, the noise level the input is taken to "
                        "(default 0.6); the timesteps are scaled by it")
    p.add_argument("--seed", type=int, default=0, help="noise seed (default 0)")
    p.add_argument("--device", help="cuda (bf16, Triton kernels) or cpu (fp32); default cuda when available "
                                    "(cpu with --backend onnx)")
    p.add_argument("--backend", choices=["torch", "onnx"], default="torch",
                   help="where the causal VAE decoder computes: torch, or onnx (ONNX Runtime on the CPU, float32, "
                        "from `framegraph export --generate MODEL_DIR --size HxW --chunk-frames N`)")
    p.add_argument("--onnx", default=None, help="(with --backend onnx) the export folder (default: "
                                                "MODEL_DIR/onnx/vae_<H>x<W>_f<N>, where framegraph export writes it)")
    p.add_argument("--out", required=True, help="output .mp4 file")
    p.add_argument("--report", help="also write the graph's telemetry report (JSON) here")
    add_compile_argument(p, "the transformer and the VAE decoder")


def _chunks(args, fps: float, r: int) -> int:
    if args.chunks:
        return args.chunks
    frames = round((args.seconds or 5.0) * fps)
    per_chunk = r * args.chunk_frames
    return max(1, -(-(frames - 1 + r) // per_chunk))  # whole chunks covering `frames` video frames


def _onnx_dir(args) -> str | None:
    """``--onnx``, or (``--backend onnx``) where ``framegraph export --generate`` puts the export of the VAE's folder."""
    from framegraph.models.generate.onnx import default_wan_onnx_dir

    if args.backend != "onnx" or args.onnx:
        return args.onnx
    folder = args.base if os.path.isfile(args.model) else args.model
    return default_wan_onnx_dir(folder, args.size, args.chunk_frames)


def run(args: argparse.Namespace) -> int:
    import torch

    from framegraph.models.generate import build_generate_graph, default_dtype, file_source, load_generate_model
    from framegraph.models.generate.stages import video_frames
    from framegraph.stream.media import MP4Sink
    from framegraph.stream.progress import run_with_progress
    from framegraph.stream.telemetry import write_json

    if args.strength is not None and not args.input:
        raise ValueError("--strength goes with --input VIDEO (video-to-video); text-to-video always starts from noise")
    if args.input and not os.path.isfile(args.input):
        raise FileNotFoundError(f"--input {args.input}: no such file; expected a video file")
    if args.onnx and args.backend != "onnx":
        raise ValueError("--onnx DIR goes with --backend onnx")
    device = args.device or ("cuda" if torch.cuda.is_available() and args.backend == "torch" else "cpu")
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
                              vae_runtime=compiled_or(args.compile, args.backend, device), onnx_dir=_onnx_dir(args),
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
        write_json(report, args.report)
    state = "interrupted, wrote" if report["interrupted"] else "wrote"
    print(f"{state} {args.out}: {sink.frames_written} frames {width}x{height} @ {gg.fps:g} fps, {chunks} chunks "
          f"of {args.chunk_frames} latent frames, {gm.family.name}, VAE on {args.backend} ({report['fps']:.2f} "
          f"frames/s)", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0
