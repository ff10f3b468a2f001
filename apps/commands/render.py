"""``framegraph render``: offline renders to MP4 through a real stage graph.

It renders the test card, a scene or the avatar. The avatar can have alpha, stand over a background, or be
placed in a scene.

    framegraph render --avatar assets/avatars/astronaut --audio hello.wav --alpha --out hello.webm
    framegraph render --scene assets/scenes/toy.ply --avatar assets/avatars/astronaut --audio hello.wav \
        --place 0,0,0 --orbit --size 320x180 --out in_scene.mp4
"""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import (
    SIZE_LIMIT,
    add_compile_argument,
    add_runtime_argument,
    background,
    placement,
    positive_float,
    video_size,
)

IMPLEMENTATION = "framegraph.apps.render"  # its run(args) runs the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to render (--testcard, --scene or --avatar; --scene with --avatar places the "
                                "talking avatar in the scene)")
    what.add_argument("--testcard", action="store_true",
                      help="procedural test card: moving bands, frame counter, a white flash each second "
                           "with a beep exactly on it (checks A/V sync)")
    what.add_argument("--avatar", help="an avatar bundle folder (from `framegraph avatar train`, e.g. "
                                       "assets/avatars/astronaut); needs --audio")
    what.add_argument("--scene", help="a scene: 3DGS INRIA .ply or .splat, a 4DGS fudan-zvg checkpoint .pth "
                                      "(rendered at t = video time, looping), or a NeRF directory "
                                      "(config.json + model.safetensors, from `framegraph fit-nerf`)")
    p.add_argument("--place", type=placement, metavar="X,Y,Z[,YAW,HEIGHT]",
                   help="(with --scene and --avatar) where the avatar stands in the scene: the bottom centre of its "
                        "picture at X,Y,Z (scene units, z up); YAW (degrees, 0 = facing -y) fixes which way it faces "
                        "(default: always facing the camera), HEIGHT its height in scene units (default: a quarter of "
                        "the orbit's distance); a value that starts with a minus is written --place=-0.6,-0.8,0")
    p.add_argument("--alpha", action="store_true",
                   help="(with --avatar) write the person matte as the video's alpha channel: --out NAME.webm (VP9 "
                        "with alpha + Opus) or NAME.mov (ProRes 4444 + PCM)")
    p.add_argument("--background", type=background, metavar="COLOR|IMAGE",
                   help="(with --avatar) the person over a colour (green, #00ff00, 0,255,0...) or a picture (scaled to "
                        "cover the frame) instead of the portrait's own background")
    cams = p.add_mutually_exclusive_group()
    cams.add_argument("--orbit", action="store_true", help="(with --scene) circle the scene (the default)")
    cams.add_argument("--camera-path", help="(with --scene) a nerfstudio camera_path.json")
    p.add_argument("--audio", help="(with --avatar) the speech to animate: any file FFmpeg decodes")
    p.add_argument("--device", default=None,
                   help="(with --scene) where to render: cuda (Triton kernels) or cpu (torch reference); "
                        "default cuda when available")
    p.add_argument("--time-duration", nargs=2, type=float, metavar=("T0", "T1"),
                   help="(with a 4DGS .pth) the scene's time span, from its training config (e.g. 0 10 for N3V, "
                        "0 1 for D-NeRF); default: the checkpoint's .json sidecar, else -0.5 0.5")
    p.add_argument("--time-scale", type=positive_float, default=1.0,
                   help="(with a 4DGS .pth) scene time units per second of video (default 1)")
    p.add_argument("--seconds", type=positive_float, default=5.0, help="duration (default 5)")
    p.add_argument("--fps", type=positive_float, default=None,
                   help="frames per second (default 25; with --avatar the avatar's own, the only one it renders at)")
    p.add_argument("--size", type=video_size, default=None,
                   help=f"WIDTHxHEIGHT (default 640x360; with --avatar the portrait's own size — another size "
                        f"scales the picture to fit, aspect kept), {SIZE_LIMIT}; a size this machine's free memory "
                        f"would not hold is refused before the render starts")
    p.add_argument("--out", required=True, help="output .mp4 file (.webm or .mov with --alpha)")
    add_compile_argument(p, "the avatar's models (with --avatar)")
    add_runtime_argument(p, "(with --avatar) where the models compute: torch, or onnx (ONNX Runtime on the CPU, "
                            "from `framegraph export`), or onnx-int8 (the same, the models the export keeps in int8 — "
                            "`framegraph export --int8` — running int8)")
    p.add_argument("--onnx", default=None, help="(with --runtime onnx / onnx-int8) the export folder (default: "
                                                "AVATAR/onnx)")
    p.add_argument("--preset", choices=["offline", "live"], default="offline",
                   help="x264 settings: offline (smaller file) or live (zerolatency, no B-frames)")
    p.add_argument("--report", help="also write the graph's telemetry report (JSON) here")

