"""``framegraph export``'s implementation. Its options and usage are in ``apps/commands/export.py``.

It writes ONNX files of an avatar bundle's models, or of a video model's causal VAE decoder, for
``--runtime onnx``. Every stream state is an explicit input / output. A manifest goes with them. It needs the
``onnx`` package: ``pip install 'framegraph[export]'``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from framegraph.models import runtime
from framegraph.models.avatar import RunSettings, load_avatar, onnx_dir
from framegraph.models.avatar.int8 import DEFAULT_INT8, check_models, quantize_export
from framegraph.models.generate import load_folder_vae
from framegraph.models.generate.onnx import default_wan_onnx_dir, export_wan_vae


def _models(text: str | None):
    if text is None:
        return list(DEFAULT_INT8)
    if text.strip() == "none":
        return []
    return check_models(m.strip() for m in text.split(",") if m.strip())


def run(args: argparse.Namespace) -> int:
    if args.generate is not None:
        return _run_generate(args)
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
    if args.int8 is not None:
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
    if args.int8 is not None:
        t0 = time.perf_counter()
        manifest = quantize_export(avatar, out, args.int8, models=models, calibration_audio=args.calibration)
        q = manifest["int8"]
        print(
            f"int8 ({q['mode']}) in {time.perf_counter() - t0:.1f} s: "
            f"{', '.join(f['file'] for f in q['files'].values())}; --runtime onnx-int8 runs "
            f"{', '.join(q['models']) or 'no model'} in int8",
            file=sys.stderr,
        )
    print(out)
    return 0


def _run_generate(args: argparse.Namespace) -> int:
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
