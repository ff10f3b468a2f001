"""``framegraph render``'s implementation (its options: ``apps/commands/render.py``): the test card, a scene
(``render_scene.py``) or the avatar through a graph to an MP4 with a progress bar, its report and a summary line.
The renderers and the avatar's models are imported only by the render that uses them: a test card loads neither."""
from __future__ import annotations

import argparse
import os
import sys

import torch

from framegraph.stream import Clock, Graph
from framegraph.stream.files import write_json
from framegraph.stream.media import MP4Sink
from framegraph.stream.progress import run_with_progress
from framegraph.stream.testcard import TestCardAudio, TestCardVideo


def build_testcard_graph(out: str, width: int, height: int, fps: float, seconds: float,
                         preset: str = "offline") -> tuple[Graph, MP4Sink]:
    graph = Graph(Clock("fast"), name="testcard")
    video = graph.add(TestCardVideo(width=width, height=height, fps=fps, seconds=seconds))
    audio = graph.add(TestCardAudio(fps=fps, seconds=seconds))
    sink = graph.add(MP4Sink(out, width=width, height=height, fps=fps, preset=preset))
    graph.connect(video, sink, "video")
    graph.connect(audio, sink, "audio", capacity=4)
    return graph, sink


def write(graph: Graph, sink: MP4Sink, total: int, args: argparse.Namespace) -> int:
    """Run ``graph`` (``total`` frames into ``sink``) with a progress bar; write ``--report``; say what was written."""
    hint = "a smaller --size renders faster" + ("" if torch.cuda.is_available() else
                                                 ", and a machine with a CUDA GPU far faster (this one renders on its CPU)")
    report = run_with_progress(graph, sink, total, desc=f"render {os.path.basename(args.out)}", slow_hint=hint)
    if args.report:
        write_json(args.report, report)
    state = "interrupted, wrote" if report["interrupted"] else "wrote"
    audio = f", {sink.audio_samples_written / 16000:.2f} s audio" if sink.audio_rate else ""
    print(f"{state} {args.out}: {sink.frames_written} frames {sink.width}x{sink.height} @ {float(sink.fps):g} fps"
          f"{audio} ({report['fps']:.1f} frames/s rendered)", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def run(args: argparse.Namespace) -> int:
    width, height = args.size or (640, 360)
    if args.scene:
        from .render_scene import build_scene_graph  # heavy: the renderers

        graph, sink, total = build_scene_graph(args.scene, args.out, width, height, args.fps, args.seconds,
                                               args.camera_path, args.device, args.preset, args.time_duration,
                                               args.time_scale)
    elif args.camera_path or args.orbit:
        raise ValueError("--orbit and --camera-path go with --scene")
    elif args.avatar:
        if not args.audio:
            raise ValueError("--avatar needs --audio FILE (the speech to animate)")
        from framegraph.models.avatar import render_avatar_graph  # heavy: the avatar's models

        graph, sink, total = render_avatar_graph(args.avatar, args.audio, args.out, device=args.device,
                                                 preset=args.preset, size=args.size, runtime=args.runtime,
                                                 onnx_dir=args.onnx)
    else:
        graph, sink = build_testcard_graph(args.out, width, height, args.fps, args.seconds, args.preset)
        total = graph.stages[0].n_frames
    return write(graph, sink, total, args)
