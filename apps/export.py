"""``framegraph export --avatar DIR [--out DIR]``: write the ONNX files of an avatar bundle's three stateful
models (audio encoder, DiT step and commit, VAE decoder; every stream state an explicit input / output)
and their manifest, for ``--backend onnx`` (render, bench, demo). Needs the ``onnx`` package
(``pip install 'framegraph[export]'``). The default output is ``DIR/onnx``, where ``--backend onnx`` looks."""
from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--avatar", required=True, help="the avatar bundle folder (e.g. assets/avatars/astronaut)")
    p.add_argument("--out", default=None, help="output folder (default: AVATAR/onnx)")


def run(args: argparse.Namespace) -> int:
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.graph import default_onnx_dir
    from framegraph.models.onnx.export import export_avatar

    avatar = load_avatar(args.avatar)
    out = args.out or default_onnx_dir(avatar)
    t0 = time.perf_counter()
    manifest = export_avatar(avatar, out)
    files = ", ".join(f["file"] for f in manifest["files"].values() if "file" in f)
    print(f"exported {args.avatar} (bundle {manifest['bundle_hash'][:12]}, opset {manifest['opset']}) to {out} in "
          f"{time.perf_counter() - t0:.1f} s: {files}", file=sys.stderr)
    print(out)
    return 0
