"""``framegraph bench scene_avatar``: the avatar in a scene, measured as a user runs it.

Its options are in ``apps/commands/bench/scene_avatar.py``. It runs three real graphs on the fast clock. Each
ends in a sink that keeps nothing:

- **avatar alone**: speech → the avatar's stages, with its matte, at the bundle's own size.
- **scene alone**: the orbit's cameras → the scene's render stage at the size asked. The stage makes depth and
  opacity layers too.
- **composite**: both in one graph, :func:`~framegraph.apps.scene_avatar.build_scene_avatar_graph`. The
  compositing stage joins them on the audio clock.

For each it records frames per second at the sink and time to the first frame. It records each stage's work
p50/p99: its own compute, without its waits. See :mod:`framegraph.stream.telemetry`. The target on a CPU: the
composite at ≥ 90 % of its slower branch's FPS alone. Compositing and the shared clock cost little. The
branches work in parallel, each stage on its own thread.
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
import wave

import numpy as np
import torch

from framegraph import assets
from framegraph.models.avatar import RunSettings, build_avatar_graph, load_avatar
from framegraph.models.runtime import default_device
from framegraph.renderers.stages import CameraSource
from framegraph.stream import Clock, Graph, PortSpec, Stage
from framegraph.stream.media import SAMPLE_RATE, AudioFileSource

from ..scene_avatar.graph import add_scene_branch, build_scene_avatar_graph, open_scene_checked, placement_from
from .measure import stage_times, torch_threads
from .meta import bench_metadata, write_result
from .speech import speech

TARGET_SHARE = 0.9  # the composite's FPS / its slower branch's alone, at least (the target on CPU)


class Discard(Stage):
    """A sink that takes each picture and keeps nothing. The measure is the graph, not an encoder."""

    def __init__(self, shape: tuple[int, ...], name: str = "discard"):
        super().__init__(name)
        self.inputs = {"video": PortSpec(shape, torch.uint8, "cpu")}

    def process(self, inputs, out):
        pass


def _figures(report: dict, frames: int) -> dict:
    return {"frames": frames, "fps": round(report["fps"], 2),
            "first_frame_ms": round(report["time_to_first_frame_ms"], 1),
            "stages": stage_times(report)}


def _avatar_alone(avatar, wav: str) -> dict:
    g = Graph(Clock("fast"), name="avatar-alone")
    ag = build_avatar_graph(avatar, AudioFileSource(wav), graph=g, audio_sink=None, settings=RunSettings(alpha=True))
    sink = g.add(Discard((avatar.height, avatar.width, 3)))
    g.connect(ag.video, sink, "video", "video", capacity=4)
    return g.run()


def _scene_alone(scene, path, n: int, fps: float, width: int, height: int, device: str) -> dict:
    g = Graph(Clock("fast"), name="scene-alone")
    _, render = add_scene_branch(g, scene, CameraSource(path, fps=fps, n_frames=n), width=width, height=height,
                                 device=device)
    sink = g.add(Discard((height, width, 3)))
    g.connect(render, sink, "video", "video", capacity=2)
    return g.run()


def _composite(scene, avatar, wav: str, placement, path, n: int, width: int, height: int, device: str) -> dict:
    sink = Discard((height, width, 3))
    sg = build_scene_avatar_graph(scene, avatar, AudioFileSource(wav), placement, width=width, height=height,
                                  path=path, n_frames=n, sink=sink, device=device)
    return sg.graph.run()


def measure(args: argparse.Namespace) -> dict:
    device = args.device or default_device()
    width, height = (64, 36) if args.quick else args.size
    seconds = 0.6 if args.quick else args.seconds
    scene_path = args.scene or str(assets.path("scenes", "toy.ply"))
    avatar_path = args.avatar or str(assets.path("avatars", "astronaut"))
    scene, avatar = open_scene_checked(scene_path), load_avatar(avatar_path)
    placement = placement_from(args.place, scene)
    samples, source = speech(seconds)
    n = math.ceil(len(samples) * avatar.fps / SAMPLE_RATE)
    path = scene.framing.orbit(n, width, height, avatar.fps)
    with tempfile.TemporaryDirectory() as tmp:
        wav, warm = os.path.join(tmp, "speech.wav"), os.path.join(tmp, "warm.wav")
        _write_wav(wav, samples)
        _write_wav(warm, samples[:int(4 * SAMPLE_RATE / avatar.fps)])  # 4 frames: the first calls, untimed
        _composite(scene, avatar, warm, placement, path, 4, width, height, device)
        runs = {"avatar_alone": _figures(_avatar_alone(avatar, wav), n),
                "scene_alone": _figures(_scene_alone(scene, path, n, avatar.fps, width, height, device), n),
                "composite": _figures(_composite(scene, avatar, wav, placement, path, n, width, height, device), n)}
    slower = min(runs["avatar_alone"]["fps"], runs["scene_alone"]["fps"])
    share = runs["composite"]["fps"] / slower if slower else None
    return {"scene": os.path.relpath(scene_path) if not os.path.isabs(args.scene or "") else scene_path,
            "scene_kind": scene.kind, "gaussians": scene.size,
            "avatar": os.path.relpath(avatar_path), "avatar_kind": avatar.kind,
            "avatar_size": [avatar.width, avatar.height], "scene_size": [width, height], "fps_of_the_clock": avatar.fps,
            "place": list(args.place), "seconds": seconds, "speech": source, "render_device": device,
            "torch_threads": torch.get_num_threads(), "runs": runs,
            "composite_share_of_slower_branch": None if share is None else round(share, 3),
            "target_share": TARGET_SHARE, "target_met": None if share is None else share >= TARGET_SHARE,
            "branch_work_p50_ms": _branch_work(runs["composite"]["stages"])}


def _branch_work(stages: dict) -> dict:
    """The composite run's work p50 per branch, and the compositor's.

    A branch's figure is the sum of its stages'. The avatar's are the audio side and the picture stages. The
    scene's are the camera and the render."""
    scene = {"camera", "gaussians", "gaussians4d", "nerf"}
    comp = {"quad_in_scene"}
    sums = {"avatar": 0.0, "scene": 0.0, "composite": 0.0}
    for name, s in stages.items():
        if name == "discard" or name.startswith("audio_file"):
            continue
        side = "scene" if name in scene else "composite" if name in comp else "avatar"
        sums[side] += s["p50_ms"]
    return {k: round(v, 2) for k, v in sums.items()}


def _write_wav(path: str, samples: np.ndarray) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.astype(np.int16).tobytes())


def run(args: argparse.Namespace) -> int:
    result = bench_metadata("scene_avatar")
    with torch_threads(args.threads or (1 if not torch.cuda.is_available() else None)):
        result.update(measure(args))
    result["quick"] = bool(args.quick)
    png = write_result(result, args.out, figure)
    r = result["runs"]
    print(f"scene_avatar {result['scene_size'][0]}x{result['scene_size'][1]} ({result['render_device']}): avatar alone "
          f"{r['avatar_alone']['fps']} fps, scene alone {r['scene_alone']['fps']} fps, composite "
          f"{r['composite']['fps']} fps ({result['composite_share_of_slower_branch']} of the slower branch; target "
          f"{TARGET_SHARE}), first frame {r['composite']['first_frame_ms']} ms; work p50 per branch "
          f"{result['branch_work_p50_ms']}")
    print(f"wrote {args.out} and {png}")
    return 0


def figure(data: dict, plt):
    """FPS of each branch alone and of the composite; the composite run's work p50 per stage."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    runs = data["runs"]
    names = ["avatar_alone", "scene_alone", "composite"]
    fps = [runs[n]["fps"] for n in names]
    a.bar([n.replace("_", " ") for n in names], fps, color=["#d95f02", "#1b9e77", "#7570b3"])
    slower = min(fps[:2])
    a.axhline(data["target_share"] * slower, color="k", ls="--", lw=1,
              label=f"{data['target_share']:.0%} of the slower branch")
    a.set_ylabel("frames per second")
    a.set_title(f"{data['scene_size'][0]}x{data['scene_size'][1]} on {data['render_device']} "
                f"(load {data['load_average_1_5_15min'][0]})")
    a.legend()
    stages = runs["composite"]["stages"]
    order = sorted(stages, key=lambda k: -stages[k]["p50_ms"])
    b.barh(order, [stages[k]["p50_ms"] for k in order], color="#666")
    b.set_xlabel("work p50 per frame (ms), composite run")
    b.invert_yaxis()
    fig.tight_layout()
    return fig
