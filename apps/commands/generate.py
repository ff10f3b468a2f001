"""``framegraph generate``: stream a real video diffusion model to an MP4.

The model is Wan 2.1 or SANA-Video, causal.

    framegraph generate --model Wan2.1-T2V-1.3B-Self-Forcing --prompt "a fox running through snow" \\
        --seconds 10 --out fox.mp4
    framegraph generate --model self_forcing_dmd.pt --base Wan2.1-T2V-1.3B-Diffusers --prompt "..." --out x.mp4
    framegraph generate --model DIR --prompt "oil painting" --input walk.mp4 --strength 0.6 --out painted.mp4
"""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import (
    SIZE_LIMIT,
    VAE_RUNTIMES,
    add_compile_argument,
    add_runtime_argument,
    positive_float,
    positive_int,
    size_hw,
    timesteps,
)

IMPLEMENTATION = "framegraph.apps.generate"  # its run(args) runs the command

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
    p.add_argument("--timesteps", "--steps", type=timesteps, default=[1000.0, 750.0, 500.0, 250.0],
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
    p.add_argument("--size", type=size_hw, default=(480, 832),
                   help=f"HEIGHTxWIDTH in pixels (default 480x832); multiples of 16, {SIZE_LIMIT}")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=positive_float, help="video length (default 5); rounded up to whole chunks")
    length.add_argument("--chunks", type=positive_int, help="number of chunks to generate")
    p.add_argument("--chunk-frames", type=positive_int, default=3,
                   help="latent frames per chunk (default 3, what Self-Forcing / CausVid students were trained with)")
    p.add_argument("--input", metavar="VIDEO", help="video-to-video: restyle this video (looped to the length)")
    p.add_argument("--strength", type=float, default=None,
                   help="(with --input) how much to change it: in (0, 1], the noise level the input is taken to "
                        "(default 0.6); the timesteps are scaled by it")
    p.add_argument("--seed", type=int, default=0, help="noise seed (default 0)")
    p.add_argument("--device", help="cuda (bf16, Triton kernels) or cpu (fp32); default cuda when available "
                                    "(cpu with --runtime onnx)")
    add_runtime_argument(p, "where the causal VAE decoder computes: torch, or onnx (ONNX Runtime on the CPU, "
                            "float32, from `framegraph export --generate MODEL_DIR --size HxW --chunk-frames N`)",
                         choices=VAE_RUNTIMES)
    p.add_argument("--onnx", default=None, help="(with --runtime onnx) the export folder (default: "
                                                "MODEL_DIR/onnx/vae_<H>x<W>_f<N>, where framegraph export writes it)")
    p.add_argument("--out", required=True, help="output .mp4 file")
    add_compile_argument(p, "the transformer and the VAE decoder")
    p.add_argument("--report", help="also write the graph's telemetry report (JSON) here")

