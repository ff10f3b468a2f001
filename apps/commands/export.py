"""``framegraph export``: an avatar bundle's models, or a video model's causal VAE decoder, to ONNX."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import INT8_DEFAULT_MODE, INT8_MODES, SIZE_LIMIT, positive_int, size_hw

IMPLEMENTATION = "framegraph.apps.export"  # its run(args) runs the command

EPILOG = """\
    framegraph export --avatar DIR [--out DIR] [--int8 [dynamic|static]]
        an avatar bundle's models (a portrait: audio encoder, DiT step and append, VAE decoder; a video
        avatar: audio encoder and mouth generator), for
        render / bench / demo; default output DIR/onnx, where their --runtime onnx looks. --int8 also
        writes an int8 version of every file beside it (models/avatar/int8.py) for --runtime onnx-int8;
        the models that run int8 there are the measured default (only those whose avatar quality holds,
        benchmarks/results/cpu/avatar_int8.json) or --int8-models.
    framegraph export --generate MODEL_DIR --size HxW [--chunk-frames N] [--out DIR]
        a video model folder's causal VAE decoder (AutoencoderKLWan: Wan 2.1 / 2.2, SANA-Video), its
        temporal cache an input / output, for `framegraph generate --runtime onnx`; shapes are fixed, so
        one export per --size and --chunk-frames (default output MODEL_DIR/onnx/vae_<H>x<W>_f<N>, where
        generate looks). For a single-file student, MODEL_DIR is its --base folder (the VAE's).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--avatar", help="the avatar bundle folder (e.g. assets/avatars/astronaut)")
    what.add_argument("--generate", metavar="MODEL_DIR",
                      help="a diffusers video model folder (its vae/ is exported), as `framegraph generate` takes it")
    p.add_argument("--size", type=size_hw,
                   help=f"(--generate, required) HEIGHTxWIDTH of the video, e.g. 480x832 ({SIZE_LIMIT})")
    p.add_argument("--chunk-frames", type=positive_int, default=3,
                   help="(--generate) latent frames per chunk, as generate's --chunk-frames (default 3)")
    p.add_argument("--out", default=None,
                   help="output folder (default: AVATAR/onnx, or MODEL_DIR/onnx/vae_<H>x<W>_f<N>)")
    p.add_argument("--int8", nargs="?", const=INT8_DEFAULT_MODE, choices=INT8_MODES, default=None,
                   help="(--avatar) also write int8 files for --runtime onnx-int8: dynamic (weights int8, activations "
                        "quantized per call) or static (activation ranges calibrated on speech run through the "
                        "float32 stages; the int8 measurement chose between them: "
                        f"benchmarks/results/cpu/avatar_int8.json) (default when given: {INT8_DEFAULT_MODE})")
    p.add_argument("--int8-models", default=None, metavar="LIST",
                   help="(--avatar) comma-separated models that --runtime onnx-int8 runs in int8: audio, dit, vae, or "
                        "none (default: the measured choice — the models whose openness correlation and identity SSIM "
                        "stay within 0.01 of float32 and that are faster)")
    p.add_argument("--calibration", default=None, metavar="CLIP",
                   help="(--int8 static) a file with speech audio to calibrate on (default: synthetic espeak-ng "
                        "speech)")

