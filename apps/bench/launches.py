"""Host syncs, kernels and allocations per steady-state frame of every pipeline: the launch audit.

    framegraph bench launches --out benchmarks/results/cpu/launches.json
    framegraph bench launches --pipelines avatar,generate --frames 24 --out out/launches.json

Each pipeline runs through its real graph. It uses the stages the apps build. It uses the torch runtime and a fast
clock. An :class:`~framegraph.stream.audit.OpCounter` counts each stage's ``process`` in its own worker
thread. It counts three things:

- aten kernels dispatched, views excluded;
- host syncs, each by name: ``.item()``, ``.tolist()``, ``.cpu()``, ``bool(tensor)``, ``nonzero``,
  boolean-mask indexing, every data-dependent shape;
- tensors allocated.

The first ``--warmup`` calls of each stage are left out. They build state, tables and caches. The rest is the
steady state.

Pipelines and their unit:

- ``avatar``: the shipped portrait bundle, per video frame.
- ``video_avatar``: a video avatar bundle, per video frame. It has random weights and region ``--video-region``.
- ``generate``: tiny random Wan, per chunk.
- ``3dgs`` / ``4dgs`` / ``nerf``: per rendered frame. The scenes are a random SH3 scene, the shipped bouncing
  ball, and the shipped spheres NeRF.

Each pipeline names its *device stages*. Those compute on the pipeline's device in a GPU run: the models, the
renderer, the composite. The others are host stages by design and are reported beside them. They are audio in,
the video avatar's loop frames, encoders and sinks. **Target: 0 host syncs per steady-state frame in the
device stages**. ``tests/apps/test_bench_launches.py`` fails when one gains a sync.

On a CPU every tensor is a host tensor. So a read of any tensor counts. See :mod:`framegraph.stream.audit`.
The kernel counts are eager torch's launches. A compiled runtime fuses them; count those with the profiler on a
GPU.

The JSON holds, per pipeline and per stage, ``calls`` and ``sync_ops``. It holds ``kernels`` / ``syncs`` /
``allocations`` per call, as median and max. It also holds the per-unit totals of the device stages. A table is
printed, and drawn beside it.

The renderers run their sync-free path, ``sync_free=True``, as a GPU does by default. The 3DGS and 4DGS renderers use
fixed-capacity tile lists. On the CPU they use the torch twin of the Triton blending kernel. NeRF uses a
fixed-shape march. Their ``capacity_overflows`` count the frames that needed more than a capacity held. Those
frames lost work.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from framegraph.models.avatar import RunSettings, build_avatar_graph, load_avatar
from framegraph.models.avatar.video.bundle import random_video_avatar
from framegraph.models.generate import build_generate_graph, default_dtype
from framegraph.models.runtime import default_device
from framegraph.renderers.gaussians import random_scene
from framegraph.renderers.scene_file import open_scene
from framegraph.renderers.stages import CameraSource, GaussianRenderStage, framing_for_points
from framegraph.stream import Clock, Graph, PortSpec, Stage
from framegraph.stream.audit import count_stage_calls
from framegraph.stream.record import IterableSource

from ..commands.bench.launches import PIPELINES
from .generate import build_model
from .measure import torch_threads
from .meta import ASSETS, bench_metadata, write_result
from .speech import speech_like


@dataclass
class Built:
    """A pipeline ready to run. It has its graph, the stages it counts, its device stages and its unit."""

    graph: Graph
    counted: list[Stage]
    device_stages: tuple[str, ...]
    unit: str  # what one steady-state call of a device stage produces: "frame" or "chunk"


class Drain(Stage):
    """Sink: takes whatever arrives on ``port`` (shape ``spec``) and keeps nothing."""

    def __init__(self, spec: PortSpec, port: str = "video", name: str = "sink"):
        super().__init__(name)
        self.inputs = {port: spec}
        self.frames = 0

    def process(self, inputs, out):
        self.frames += 1


def _audio_source(seconds: float) -> IterableSource:
    """Speech-like 16 kHz PCM in 20 ms chunks. The pts come from the chunk index: 50 a second."""
    pcm = torch.from_numpy(speech_like(seconds))
    n = len(pcm) // 320
    return IterableSource(pcm[: n * 320].view(n, 320), PortSpec((320,), torch.int16), port="audio", fps=50.0,
                          name="mic")


def _avatar(avatar, args, device_stages: tuple[str, ...]) -> Built:
    graph = Graph(Clock("fast"), name="avatar")
    settings = RunSettings(device=args.device, torch_threads=1 if args.device == "cpu" else None)
    ag = build_avatar_graph(avatar, _audio_source(args.frames / avatar.fps + 0.5), audio_sink=None, graph=graph,
                            settings=settings, max_in_flight=4)
    graph.connect(ag.video, graph.add(Drain(ag.video.outputs["video"])), "video", "video")
    return Built(graph, [ag.features, ag.state, *ag.stages.values()], device_stages, "frame")


def build_avatar(args) -> Built:
    return _avatar(load_avatar(f"{ASSETS}/avatars/astronaut"), args, ("denoiser", "vae_decode", "composite"))


def build_video_avatar(args) -> Built:
    avatar = random_video_avatar(n_frames=16, region_size=args.video_region)
    return _avatar(avatar, args, ("mouth_shape", "mouth_region"))


def build_generate(args) -> Built:
    dtype = default_dtype(args.device)
    gm = build_model("wan", "tiny", args.device, dtype)
    gg = build_generate_graph(gm, size=(64, 96), chunks=args.frames, device=args.device,
                              timesteps=(1000, 750, 500, 250))
    gg.denoiser.set_prompt_embeds(torch.randn(gm.prompt_tokens, gm.family.text_dim(gm.transformer)), name="random")
    gg.graph.connect(gg.decode, gg.graph.add(Drain(gg.decode.outputs["video"])), "video", "video", capacity=8)
    return Built(gg.graph, [gg.source, gg.denoiser, gg.decode], ("denoiser", "vae_decode"), "chunk")


def _render(stage, framing, args, fps: float = 25.0) -> Built:
    graph = Graph(Clock("fast"), name="render")
    path = framing.orbit(args.frames, stage.width, stage.height, fps)
    cams = graph.add(CameraSource(path, fps=fps), max_in_flight=2)
    graph.add(stage)
    graph.connect(cams, stage, "camera", "camera")
    graph.connect(stage, graph.add(Drain(stage.outputs["video"])), "video", "video")
    return Built(graph, [stage], (stage.name,), "frame")


def build_3dgs(args) -> Built:
    scene = random_scene(args.gaussians, 3, seed=0)
    width, height = args.render_size
    stage = GaussianRenderStage(scene, width=width, height=height, device=args.device, sync_free=True)
    return _render(stage, framing_for_points(scene.means), args)


def _scene_file(path: str, args) -> Built:
    scene = open_scene(path)
    width, height = args.render_size
    stage = scene.render_stage(width=width, height=height, device=args.device, sync_free=True)
    return _render(stage, scene.framing, args)


def build_4dgs(args) -> Built:
    return _scene_file(f"{ASSETS}/scenes4d/bouncing_ball.pth", args)


def build_nerf(args) -> Built:
    return _scene_file(f"{ASSETS}/nerf/spheres", args)


BUILDERS: dict[str, Callable[[argparse.Namespace], Built]] = {
    "avatar": build_avatar, "video_avatar": build_video_avatar, "generate": build_generate, "3dgs": build_3dgs,
    "4dgs": build_4dgs, "nerf": build_nerf,
}


def _stage_summary(calls: list[dict]) -> dict:
    if not calls:
        return {"calls": 0}
    sync_ops: dict[str, int] = {}
    for c in calls:
        for name, n in c["sync_ops"].items():
            sync_ops[name] = sync_ops.get(name, 0) + n
    out = {"calls": len(calls), "sync_ops": sync_ops}
    for key in ("kernels", "syncs", "allocations", "allocated_bytes"):
        values = [c[key] for c in calls]
        out[f"{key}_per_call"] = {"median": statistics.median(values), "max": max(values), "min": min(values),
                                  "total": sum(values)}
    return out


def audit(name: str, args) -> dict:
    """Build pipeline ``name``, run it with every stage counted, summarise its steady state."""
    built = BUILDERS[name](args)
    calls = count_stage_calls(built.counted)
    t0 = time.perf_counter()
    built.graph.run()
    wall = time.perf_counter() - t0
    stages = {n: _stage_summary(c.steady(args.warmup)) | {"device_stage": n in built.device_stages}
              for n, c in calls.items()}
    for stage in built.counted:
        capacity = getattr(stage, "tiles", None) or getattr(stage, "march", None)
        if capacity is not None:  # a renderer's sync-free path: frames that outgrew a capacity (and lost work)
            stages[stage.name]["capacity_overflows"] = capacity.overflows
    units = max((stages[n]["calls"] for n in built.device_stages), default=0)
    per_unit = {}
    for key in ("kernels", "syncs", "allocations"):
        total = sum(stages[n][f"{key}_per_call"]["total"] for n in built.device_stages if stages[n]["calls"])
        per_unit[key] = total / units if units else None
    worst = max((stages[n].get("syncs_per_call", {}).get("max", 0) for n in built.device_stages), default=0)
    return {"pipeline": name, "unit": built.unit, "device_stages": list(built.device_stages),
            "steady_units": units, "per_unit": per_unit, "max_syncs_in_a_device_call": worst,
            "meets_target": worst == 0, "wall_s": wall, "stages": stages}


def _table(result: dict) -> str:
    rows = [f"{'pipeline':<13} {'stage':<15} {'dev':<4} {'calls':>5} {'kernels/call':>12} {'syncs/call':>10} "
            f"{'allocs/call':>11}  sync ops"]
    for p in result["pipelines"]:
        for name, s in p["stages"].items():
            if not s["calls"]:
                continue
            ops = ", ".join(f"{k}×{v}" for k, v in s["sync_ops"].items())
            rows.append(f"{p['pipeline']:<13} {name:<15} {'yes' if s['device_stage'] else '':<4} {s['calls']:>5} "
                        f"{s['kernels_per_call']['median']:>12g} {s['syncs_per_call']['max']:>10g} "
                        f"{s['allocations_per_call']['median']:>11g}  {ops}")
        u = p["per_unit"]
        rows.append(f"{p['pipeline']:<13} {'= per ' + p['unit']:<15} {'':<4} {p['steady_units']:>5} "
                    f"{u['kernels'] or 0:>12.0f} {u['syncs'] or 0:>10.1f} {u['allocations'] or 0:>11.0f}  "
                    f"target 0 syncs: {'met' if p['meets_target'] else 'NOT met'}")
    return "\n".join(rows)


def figure(data: dict, plt):
    """Per pipeline, device stages only: kernels, syncs and allocations per steady-state unit."""
    pipes = data["pipelines"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    names = [f"{p['pipeline']}\n(per {p['unit']})" for p in pipes]
    for ax, key in zip(axes, ("kernels", "syncs", "allocations")):
        values = [p["per_unit"][key] or 0 for p in pipes]
        ax.bar(names, values, color="#cc3311" if key == "syncs" else "#4477aa")
        ax.set_title(f"{key} per steady-state unit (device stages)", fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=35)
    fig.suptitle(f"launch audit on {data['device']} ({data['runtime']} runtime, eager)", fontsize=10)
    fig.tight_layout()
    return fig


def run(args: argparse.Namespace) -> int:
    args.device = args.device or default_device()
    names = [n.strip() for n in args.pipelines.split(",") if n.strip()]
    bad = [n for n in names if n not in PIPELINES]
    if bad or not names:
        raise ValueError(f"--pipelines {args.pipelines!r}: unknown {bad}; choose from {', '.join(PIPELINES)}")
    if args.frames <= args.warmup:
        raise ValueError(f"--frames {args.frames} must exceed --warmup {args.warmup} (the steady state is the rest)")
    result = bench_metadata("launches") | {"runtime": "torch", "render_device": args.device, "frames": args.frames,
                                           "warmup_calls": args.warmup, "pipelines": []}
    with torch_threads(1 if args.device == "cpu" else None):
        for name in names:
            print(f"{name} ...", flush=True)
            result["pipelines"].append(audit(name, args))
    png = write_result(result, args.out, figure)
    print(_table(result))
    print(f"wrote {args.out} and {png}")
    return 0
