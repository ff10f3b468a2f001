"""``framegraph render``: offline renders to MP4 through a real stage graph."""
from __future__ import annotations

import argparse
import os
import sys

import torch

from framegraph.stream import Clock, Graph
from framegraph.stream.media import MP4Sink
from framegraph.stream.progress import run_with_progress
from framegraph.stream.testcard import TestCardAudio, TestCardVideo

from .argtypes import add_compile_argument, compiled_or, positive_float, video_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--testcard", action="store_true",
                      help="procedural test card: moving bands, frame counter, a white flash each second "
                           "with a beep exactly on it (checks A/V sync)")
    what.add_argument("--avatar", help="an avatar bundle folder (from `framegraph avatar train`, e.g. "
                                       "assets/avatars/astronaut); needs --audio")
    what.add_argument("--scene", help="a scene: 3DGS INRIA .ply or .splat, a 4DGS fudan-zvg checkpoint .pth "
                                      "(rendered at t = video time, looping), or a NeRF directory "
                                      "(config.json + model.safetensors, from `framegraph fit-nerf`)")
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
    p.add_argument("--fps", type=positive_float, default=25.0, help="frames per second (default 25)")
    p.add_argument("--size", type=video_size, default=None,
                   help="WIDTHxHEIGHT (default 640x360; with --avatar the portrait's own size — another size "
                        "scales the picture to fit, aspect kept)")
    p.add_argument("--out", required=True, help="output .mp4 file")
    p.add_argument("--backend", choices=["torch", "onnx", "onnx-int8"], default="torch",
                   help="(with --avatar) where the models compute: torch, or onnx (ONNX Runtime on the CPU, from "
                        "`framegraph export`), or onnx-int8 (the same, the models the export keeps in int8 — "
                        "`framegraph export --int8` — running int8)")
    p.add_argument("--onnx", default=None, help="(with --backend onnx / onnx-int8) the export folder (default: "
                                                "AVATAR/onnx)")
    p.add_argument("--preset", choices=["offline", "live"], default="offline",
                   help="x264 settings: offline (smaller file) or live (zerolatency, no B-frames)")
    p.add_argument("--report", help="also write the graph's telemetry report (JSON) here")
    add_compile_argument(p, "the avatar's models (with --avatar)")


def build_testcard_graph(out: str, width: int, height: int, fps: float, seconds: float,
                         preset: str = "offline") -> tuple[Graph, MP4Sink]:
    graph = Graph(Clock("fast"), name="testcard")
    video = graph.add(TestCardVideo(width=width, height=height, fps=fps, seconds=seconds))
    audio = graph.add(TestCardAudio(fps=fps, seconds=seconds))
    sink = graph.add(MP4Sink(out, width=width, height=height, fps=fps, preset=preset))
    graph.connect(video, sink, "video")
    graph.connect(audio, sink, "audio", capacity=4)
    return graph, sink


def build_scene_graph(scene_path: str, out: str, width: int, height: int, fps: float, seconds: float,
                      camera_path: str | None = None, device: str | None = None,
                      preset: str = "offline", time_duration: tuple[float, float] | None = None,
                      time_scale: float = 1.0) -> tuple[Graph, MP4Sink, int]:
    """CameraSource (orbit or nerfstudio path) → renderer (3DGS, 4DGS at t = frame time, or NeRF) →
    MP4Sink (video only)."""
    from framegraph.renderers.cameras import load_nerfstudio_camera_path
    from framegraph.renderers.scene_file import open_scene
    from framegraph.renderers.stages import CameraSource

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    scene = open_scene(scene_path, time_duration=time_duration)
    if camera_path:
        path = load_nerfstudio_camera_path(camera_path)
        if (path.width, path.height) != (width, height):  # render at the requested size, same fov
            sx, sy = width / path.width, height / path.height
            path.Ks[:, 0] *= sx
            path.Ks[:, 1] *= sy
            path.width, path.height = width, height
        n_frames = len(path)
    else:
        n_frames = max(1, round(seconds * fps))
        path = scene.framing.orbit(n_frames, width, height, fps)
    graph = Graph(Clock("fast"), name="render-scene")
    cams = graph.add(CameraSource(path, fps=fps, n_frames=n_frames))
    render = graph.add(scene.render_stage(width=width, height=height, device=device, time_scale=time_scale))
    sink = graph.add(MP4Sink(out, width=width, height=height, fps=fps, audio_rate=None, preset=preset))
    graph.connect(cams, render)
    graph.connect(render, sink)
    return graph, sink, n_frames


def run(args: argparse.Namespace) -> int:
    from framegraph.stream.telemetry import write_json

    width, height = args.size or (640, 360)
    if args.scene:
        graph, sink, total = build_scene_graph(args.scene, args.out, width, height, args.fps, args.seconds,
                                               args.camera_path, args.device, args.preset,
                                               args.time_duration, args.time_scale)
    elif args.avatar:
        if not args.audio:
            raise ValueError("--avatar needs --audio FILE (the speech to animate)")
        from framegraph.models.avatar import render_avatar_graph

        device = args.device or ("cuda" if torch.cuda.is_available() and args.backend == "torch" else "cpu")
        graph, sink, total = render_avatar_graph(args.avatar, args.audio, args.out, device=device,
                                                 preset=args.preset, size=args.size,
                                                 runtime=compiled_or(args.compile, args.backend, device),
                                                 onnx_dir=args.onnx)
        width, height, args.fps = sink.width, sink.height, float(sink.fps)
    else:
        if args.camera_path or args.orbit:
            raise ValueError("--orbit and --camera-path go with --scene")
        graph, sink = build_testcard_graph(args.out, width, height, args.fps, args.seconds, args.preset)
        total = graph.stages[0].n_frames
    hint = "a smaller --size renders faster" + ("" if torch.cuda.is_available() else
                                                 ", and a machine with a CUDA GPU far faster (this one renders on its CPU)")
    report = run_with_progress(graph, sink, total, desc=f"render {os.path.basename(args.out)}", slow_hint=hint)
    if args.report:
        write_json(report, args.report)
    state = "interrupted, wrote" if report["interrupted"] else "wrote"
    audio = f", {sink.audio_samples_written / 16000:.2f} s audio" if sink.audio_rate else ""
    print(f"{state} {args.out}: {sink.frames_written} frames {width}x{height} @ {args.fps:g} fps{audio} "
          f"({report['fps']:.1f} frames/s rendered)", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0
