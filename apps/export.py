"""``framegraph export``: write ONNX files (every stream state an explicit input / output) and their manifest,
for ``--backend onnx``. Needs the ``onnx`` package (``pip install 'framegraph[export]'``).

    framegraph export --avatar DIR [--out DIR] [--int8 [dynamic|static]]
        an avatar bundle's three stateful models (audio encoder, DiT step and commit, VAE decoder), for
        render / bench / demo; default output DIR/onnx, where their --backend onnx looks. --int8 also
        writes an int8 version of every file beside it (models/avatar/portrait/int8.py) for --backend onnx-int8;
        the models that run int8 there are the measured default (only those whose avatar quality holds,
        benchmarks/results/cpu/avatar_int8.json) or --int8-models.
    framegraph export --generate MODEL_DIR --size HxW [--chunk-frames N] [--out DIR]
        a video model folder's causal VAE decoder (AutoencoderKLWan: Wan 2.1 / 2.2, SANA-Video), its
        temporal cache an input / output, for `framegraph generate --backend onnx`; shapes are fixed, so
        one export per --size and --chunk-frames (default output MODEL_DIR/onnx/vae_<H>x<W>_f<N>, where
        generate looks). For a single-file student, MODEL_DIR is its --base folder (the VAE's).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .argtypes import positive_int
from .generate import _size_hw


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--avatar", help="the avatar bundle folder (e.g. assets/avatars/astronaut)")
    what.add_argument("--generate", metavar="MODEL_DIR",
                      help="a diffusers video model folder (its vae/ is exported), as `framegraph generate` takes it")
    p.add_argument("--size", type=_size_hw, help="(--generate, required) HEIGHTxWIDTH of the video, e.g. 480x832")
    p.add_argument("--chunk-frames", type=positive_int, default=3,
                   help="(--generate) latent frames per chunk, as generate's --chunk-frames (default 3)")
    p.add_argument("--out", default=None,
                   help="output folder (default: AVATAR/onnx, or MODEL_DIR/onnx/vae_<H>x<W>_f<N>)")
    from framegraph.models.avatar.portrait.int8 import DEFAULT_INT8, DEFAULT_MODE, MODES

    p.add_argument("--int8", nargs="?", const=DEFAULT_MODE, choices=MODES, default=None,
                   help=f"(--avatar) also write int8 files for --backend onnx-int8: dynamic (weights int8, activations "
                        f"quantized per call) or static (activation ranges calibrated on speech run through the "
                        f"float32 stages) (default when given: {DEFAULT_MODE})")
    p.add_argument("--int8-models", default=None, metavar="LIST",
                   help="(--avatar) comma-separated models that --backend onnx-int8 runs in int8: audio, dit, vae, or "
                        f"none (default: the measured choice, {','.join(DEFAULT_INT8) or 'none'} — the models whose "
                        "openness correlation and identity SSIM stay within 0.01 of float32 and that are faster)")
    p.add_argument("--calibration", default=None, metavar="CLIP",
                   help="(--int8 static) a file with speech audio to calibrate on (default: synthetic espeak-ng speech)")


def _models(text: str | None):
    from framegraph.models.avatar.portrait.int8 import DEFAULT_INT8, check_models

    if text is None:
        return list(DEFAULT_INT8)
    if text.strip() == "none":
        return []
    return check_models(m.strip() for m in text.split(",") if m.strip())


def run(args: argparse.Namespace) -> int:
    if args.generate is not None:
        return _run_generate(args)
    from framegraph.models import runtime
    from framegraph.models.avatar import RunSettings, load_avatar, onnx_dir

    if args.int8 is None and (args.int8_models is not None or args.calibration is not None):
        print(
            "framegraph export: error: --int8-models / --calibration go with --int8 (e.g. --int8 static)",
            file=sys.stderr,
        )
        return 2
    try:
        models = _models(args.int8_models)
    except ValueError as e:
        print(f"framegraph export: error: {e}", file=sys.stderr)
        return 2
    if args.calibration is not None and not os.path.isfile(args.calibration):
        print(f"framegraph export: error: --calibration {args.calibration!r} does not exist", file=sys.stderr)
        return 2
    avatar = load_avatar(args.avatar)
    if args.int8:
        runtime.check(f"avatar-{avatar.kind}", "onnx-int8")  # a kind without int8 says so before the export
    out = args.out or onnx_dir(avatar, RunSettings())
    t0 = time.perf_counter()
    manifest = avatar.export_onnx(out)
    files = ", ".join(f["file"] for f in manifest["files"].values() if "file" in f)
    print(
        f"exported {args.avatar} (bundle {manifest['bundle_hash'][:12]}, opset {manifest['opset']}) to {out} in "
        f"{time.perf_counter() - t0:.1f} s: {files}",
        file=sys.stderr,
    )
    if args.int8:
        from framegraph.models.avatar.portrait.int8 import quantize_export

        t0 = time.perf_counter()
        manifest = quantize_export(avatar, out, args.int8, models=models, calibration_audio=args.calibration)
        q = manifest["int8"]
        print(
            f"int8 ({q['mode']}) in {time.perf_counter() - t0:.1f} s: "
            f"{', '.join(f['file'] for f in q['files'].values())}; --backend onnx-int8 runs "
            f"{', '.join(q['models']) or 'no model'} in int8",
            file=sys.stderr,
        )
    print(out)
    return 0


def _run_generate(args: argparse.Namespace) -> int:
    from framegraph.models.generate import load_folder_vae
    from framegraph.models.generate.onnx import default_wan_onnx_dir, export_wan_vae

    if args.int8 is not None or args.int8_models is not None or args.calibration is not None:
        raise ValueError("--int8 / --int8-models / --calibration are for --avatar exports; --generate writes float32")
    if args.size is None:
        raise ValueError("--generate needs --size HEIGHTxWIDTH (the export's shapes are fixed), e.g. --size 480x832")
    vae = load_folder_vae(args.generate)
    out = args.out or default_wan_onnx_dir(args.generate, args.size, args.chunk_frames)
    t0 = time.perf_counter()
    manifest = export_wan_vae(vae, out, size=args.size, chunk_frames=args.chunk_frames, source=args.generate)
    print(f"exported the VAE of {args.generate} (hash {manifest['bundle_hash'][:12]}, opset {manifest['opset']}, "
          f"{args.size[0]}x{args.size[1]}, {args.chunk_frames} latent frames per chunk) to {out} in "
          f"{time.perf_counter() - t0:.1f} s: vae_first.onnx, vae_next.onnx", file=sys.stderr)
    print(out)
    return 0
