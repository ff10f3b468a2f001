"""``framegraph render``'s implementation. Its options are in ``apps/commands/render.py``.

It renders through a graph to a video file. It shows a progress bar, and writes its report and a summary line. It
renders the test card, a scene (``render_scene.py``) or the avatar. The avatar may have alpha or stand over a
background. It may stand in a scene (``scene_avatar/``). Only the render that uses them imports the renderers or the
avatar's models. A test card loads neither."""
from __future__ import annotations

import argparse
import os
import struct
import sys

import psutil
import torch

from framegraph.models.runtime import default_device
from framegraph.stream import Clock, Graph
from framegraph.stream.files import write_json
from framegraph.stream.media import MP4Sink
from framegraph.stream.media.alpha import ALPHA_FORMATS
from framegraph.stream.progress import run_with_progress
from framegraph.stream.testcard import TestCardAudio, TestCardVideo

from .argtypes import compiled_or


def build_testcard_graph(out: str, width: int, height: int, fps: float, seconds: float,
                         preset: str = "offline") -> tuple[Graph, MP4Sink]:
    graph = Graph(Clock("fast"), name="testcard")
    video = graph.add(TestCardVideo(width=width, height=height, fps=fps, seconds=seconds))
    audio = graph.add(TestCardAudio(fps=fps, seconds=seconds))
    sink = graph.add(MP4Sink(out, width=width, height=height, fps=fps, preset=preset))
    graph.connect(video, sink, "video")
    graph.connect(audio, sink, "audio", capacity=4)
    return graph, sink


# What a render holds: a base, and bytes a pixel of its frames (rings, encoder, renderer). From peak RSS; see
# docs/bench_notes.md.
BASE_BYTES = 300 * 2**20
BYTES_PER_PIXEL = 112


def check_memory(width: int, height: int, available: int | None = None) -> int:
    """Refuse a render at ``width`` x ``height`` that would not fit. The limit is this machine's free memory.

    It refuses before anything is allocated, with a ``ValueError`` naming both. ``available`` is the free memory in
    bytes; by default, what the system says. Returns the bytes estimated."""
    need = BASE_BYTES + BYTES_PER_PIXEL * width * height
    free = psutil.virtual_memory().available if available is None else available
    if need > free:
        raise ValueError(f"--size {width}x{height}: this render needs about {need / 2**30:.1f} GiB of memory, and "
                         f"{free / 2**30:.1f} GiB is free; a smaller --size (or a machine with more memory)")
    return need


def write(graph: Graph, sink: MP4Sink, total: int, args: argparse.Namespace) -> int:
    """Run ``graph``, ``total`` frames into ``sink``, with a progress bar. Write ``--report``; say what was written.

    A file already at ``--out`` is replaced only by a complete render. The sink then finishes at its partial name,
    ``NAME.partial.EXT``. It is renamed to ``--out`` here when the render was not interrupted. After Ctrl-C it
    stays there, and the summary says so."""
    hint = "a smaller --size renders faster" + (
        "" if torch.cuda.is_available() else ", and a machine with a CUDA GPU far faster (this one renders on its CPU)")
    check_memory(sink.width, sink.height)
    earlier = os.path.exists(args.out)
    if earlier:
        sink.path = sink.partial_path  # the sink's own rename at the end leaves the file where it was written
    report = run_with_progress(graph, sink, total, desc=f"render {os.path.basename(args.out)}", slow_hint=hint)
    if args.report:
        write_json(args.report, report)
    written, kept = args.out, ""
    if earlier and report["interrupted"]:
        written, kept = sink.partial_path, f"; {args.out}, from before, is left as it was"
    elif earlier:
        os.replace(sink.partial_path, args.out)
    state = "interrupted, wrote the partial render to" if report["interrupted"] else "wrote"
    audio = f", {sink.audio_samples_written / sink.audio_rate:.2f} s audio" if sink.audio_rate else ""
    print(f"{state} {written}: {sink.frames_written} frames {sink.width}x{sink.height} @ {float(sink.fps):g} fps"
          f"{audio} ({report['fps']:.1f} frames/s rendered){kept}", file=sys.stderr)
    print(os.path.abspath(written))
    return 0


def wav_cut_short(path: str) -> str | None:
    """A sentence when ``path`` is a WAV file shorter than its header says, else None.

    Such a file is a copy or a recording cut off. The sentence says how much audio it holds of how much. None
    means not a WAV, whole, or a header that gives no length."""
    try:
        with open(path, "rb") as f:
            riff = f.read(12)
            if len(riff) < 12 or riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
                return None
            rate = block = None
            while len(head := f.read(8)) == 8:
                chunk, size = head[:4], struct.unpack("<I", head[4:])[0]
                if chunk == b"fmt ":
                    fmt = f.read(size + size % 2)
                    rate, block = struct.unpack("<I", fmt[4:8])[0], struct.unpack("<H", fmt[12:14])[0]
                elif chunk == b"data":
                    held = os.fstat(f.fileno()).st_size - f.tell()
                    if not rate or not block or size in (0, 0xFFFFFFFF) or held >= size:
                        return None
                    return (f"{path} is cut short: its header promises {size / block / rate:.2f} s of audio, the file "
                            f"holds {held / block / rate:.2f} s; rendering the {held / block / rate:.2f} s it holds")
                else:
                    f.seek(size + size % 2, os.SEEK_CUR)
    except OSError:
        return None  # the decoder says what is wrong with the file
    return None


def check_out(args: argparse.Namespace) -> None:
    """``--out`` ends in an extension this render writes: ``.mp4``, or with ``--alpha`` ``.webm`` / ``.mov``.

    Otherwise a ``ValueError`` names them."""
    root, ext = os.path.splitext(args.out)
    accepted = tuple(ALPHA_FORMATS) if args.alpha else (".mp4",)
    if ext.lower() in accepted:
        return
    writes = ("--alpha writes .webm (VP9 with alpha + Opus) or .mov (ProRes 4444 + PCM)" if args.alpha else
              "a render writes .mp4 (H.264 + AAC; .webm and .mov with --alpha)")
    raise ValueError(f"--out {args.out}: {writes}, and {ext or 'no extension'!r} is none of them; e.g. --out "
                     f"{root}{accepted[0]}")


def check_choice(args: argparse.Namespace) -> None:
    """What to render, from the flags. It is the test card, a scene, the avatar, or the avatar in a scene.

    Each option must come with what it goes with. Otherwise a ``ValueError`` names the option."""
    if not (args.testcard or args.scene or args.avatar):
        raise ValueError("say what to render: --testcard, --scene FILE or --avatar DIR (--scene with --avatar places "
                         "the talking avatar in the scene)")
    if args.testcard and (args.scene or args.avatar):
        raise ValueError("--testcard renders alone, not with --scene or --avatar")
    if (args.camera_path or args.orbit) and not args.scene:
        raise ValueError("--orbit and --camera-path go with --scene")
    if args.avatar and not args.audio:
        raise ValueError("--avatar needs --audio FILE (the speech to animate)")
    if (args.alpha or args.background is not None) and not args.avatar:
        raise ValueError("--alpha and --background go with --avatar (the person's matte)")
    if args.alpha and args.background is not None:
        raise ValueError("--alpha keeps the background transparent, --background fills it: give one of them")
    if (args.alpha or args.background is not None) and args.scene:
        raise ValueError("--alpha and --background go with --avatar alone; in a scene the scene is the background")
    if (args.alpha or args.background is not None) and args.size:
        raise ValueError("--size goes with neither --alpha nor --background: they keep the avatar's own size")
    if args.place is not None and not (args.scene and args.avatar):
        raise ValueError("--place goes with --scene and --avatar (where the avatar stands in the scene)")
    if args.scene and args.avatar and args.place is None:
        raise ValueError("--scene with --avatar needs --place X,Y,Z[,YAW,HEIGHT]: where the avatar stands in the scene")


def run(args: argparse.Namespace) -> int:
    check_choice(args)
    check_out(args)
    short = wav_cut_short(args.audio) if args.audio else None
    if short:
        print(f"framegraph render: note: {short}", file=sys.stderr)
    width, height = args.size or (640, 360)
    fps = args.fps or 25.0
    if args.scene and args.avatar:
        from .scene_avatar import render_scene_avatar  # heavy: the renderers and the avatar's models

        graph, sink, total = render_scene_avatar(args.scene, args.avatar, args.audio, args.out, width=width,
                                                 height=height, place=args.place, camera_path_file=args.camera_path,
                                                 device=args.device, preset=args.preset,
                                                 time_duration=args.time_duration, time_scale=args.time_scale,
                                                 runtime=args.runtime, onnx_dir=args.onnx)
    elif args.scene:
        from .render_scene import build_scene_graph  # heavy: the renderers

        graph, sink, total = build_scene_graph(args.scene, args.out, width, height, fps, args.seconds,
                                               args.camera_path, args.device, args.preset, args.time_duration,
                                               args.time_scale)
    elif args.avatar:
        from framegraph.models.avatar import RunSettings, render_avatar_graph  # heavy: the avatar's models

        device = args.device or default_device(args.runtime)
        settings = RunSettings(runtime=compiled_or(args.compile, args.runtime, device), device=device,
                               onnx_dir=args.onnx)
        graph, sink, total = render_avatar_graph(args.avatar, args.audio, args.out, settings, preset=args.preset,
                                                 size=args.size, alpha=args.alpha, background=args.background)
    else:
        graph, sink = build_testcard_graph(args.out, width, height, fps, args.seconds, args.preset)
        total = graph.stages[0].n_frames
    return write(graph, sink, total, args)
