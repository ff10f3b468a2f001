"""``framegraph export --avatar DIR [--out DIR] [--int8 [dynamic|static]]``: write the ONNX files of an avatar
bundle's three stateful models (audio encoder, DiT step and commit, VAE decoder; every stream state an explicit
input / output) and their manifest, for ``--backend onnx`` (render, bench, demo). Needs the ``onnx`` package
(``pip install 'framegraph[export]'``). The default output is ``DIR/onnx``, where ``--backend onnx`` looks.

``--int8`` also writes an int8 version of every file beside it (``models/onnx/quantize.py``) for
``--backend onnx-int8``; the models that run int8 there are the measured default (only those whose avatar
quality holds, ``benchmarks/results/cpu/avatar_int8.json``) or ``--int8-models``."""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from framegraph.models.onnx.quantize import DEFAULT_INT8, DEFAULT_MODE, MODES

    p.add_argument("--avatar", required=True, help="the avatar bundle folder (e.g. assets/avatars/astronaut)")
    p.add_argument("--out", default=None, help="output folder (default: AVATAR/onnx)")
    p.add_argument(
        "--int8",
        nargs="?",
        const=DEFAULT_MODE,
        choices=MODES,
        default=None,
        help=f"also write int8 files for --backend onnx-int8: dynamic (weights int8, activations "
        f"quantized per call) or static (activation ranges calibrated on speech run through the "
        f"float32 stages) (default when given: {DEFAULT_MODE})",
    )
    p.add_argument(
        "--int8-models",
        default=None,
        metavar="LIST",
        help="comma-separated models that --backend onnx-int8 runs in int8: audio, dit, vae, or none "
        f"(default: the measured choice, {','.join(DEFAULT_INT8) or 'none'} — the models whose "
        "openness correlation and identity SSIM stay within 0.01 of float32 and that are faster)",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="CLIP",
        help="(--int8 static) a file with speech audio to calibrate on (default: synthetic espeak-ng speech)",
    )


def _models(text: str | None):
    from framegraph.models.onnx.quantize import DEFAULT_INT8, check_models

    if text is None:
        return list(DEFAULT_INT8)
    if text.strip() == "none":
        return []
    return check_models(m.strip() for m in text.split(",") if m.strip())


def run(args: argparse.Namespace) -> int:
    import os

    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.graph import default_onnx_dir
    from framegraph.models.onnx.export import export_avatar

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
    out = args.out or default_onnx_dir(avatar)
    t0 = time.perf_counter()
    manifest = export_avatar(avatar, out)
    files = ", ".join(f["file"] for f in manifest["files"].values() if "file" in f)
    print(
        f"exported {args.avatar} (bundle {manifest['bundle_hash'][:12]}, opset {manifest['opset']}) to {out} in "
        f"{time.perf_counter() - t0:.1f} s: {files}",
        file=sys.stderr,
    )
    if args.int8:
        from framegraph.models.onnx.quantize import quantize_export

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
