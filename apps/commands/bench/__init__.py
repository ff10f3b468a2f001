"""``framegraph bench NAME``: one front per benchmark, every one of the same shape.

A bench is two modules. Its front lives here, in ``commands/bench/NAME.py``. The front declares
``add_arguments(parser)``, the bench's options. ``--out FILE.json`` is among them; see :func:`add_out_argument`.
The front also names its ``IMPLEMENTATION``. That is the module in ``apps/bench/`` that measures. It exports:

- ``run(args) -> int``: measures, writes the JSON and prints a summary. It returns the exit status. The JSON holds
  ``meta.bench_metadata(NAME)`` and the numbers. ``meta.write_result`` writes it, with the PNG of its figure
  beside it.
- ``figure(data, plt) -> matplotlib.figure.Figure``: its plot of one result, drawn from the JSON alone. So the
  PNG beside the JSON and the bench's section in ``framegraph bench report`` are the same picture.

A result names its bench: ``"benchmark": NAME``, written by ``bench_metadata``. ``bench report`` draws it with
that bench's ``figure``. Adding a bench is its two modules and one line in :data:`BENCHES`.
"""
from __future__ import annotations

import argparse
import importlib

# NAME → (front module, help), in the order `framegraph bench --help` lists them.
BENCHES = {
    "runtime": (f"{__name__}.runtime", "stage-graph overhead, latency under overload, drops, allocations, RSS"),
    "kernels": (f"{__name__}.kernels", "attention and DiT kernels against their torch / library peers"),
    "render": (f"{__name__}.render", "3DGS / 4DGS / NeRF render speed and peak memory per backend (+ gsplat)"),
    "server": (f"{__name__}.server", "streaming server: RSS over 100 sessions, latency over a 10-min soak"),
    "avatar": (f"{__name__}.avatar", "talking avatar: time to first frame, FPS and stage p50/p99 per size, sessions"),
    "avatar_int8": (f"{__name__}.avatar_int8",
                    "avatar's ONNX models in int8 vs float32, per model: held-out quality, stage p50, the decision"),
    "generate": (f"{__name__}.generate",
                 "Wan / SANA-Video streamed end to end: FPS (denoise + decode + encode), first frame, stage p50/p99"),
    "video_avatar": (f"{__name__}.video_avatar",
                     "video avatar on a real clip: held-out lip sync, PSNR outside the mouth, FPS, first frame"),
    "av_sync": (f"{__name__}.av_sync",
                "the A/V shift training makes on real clips, old rule vs new, the shape head's fit at each lag"),
    "whisper_features": (f"{__name__}.whisper_features",
                         "Whisper encoder features on a sliding window: cost per engine and window, agreement"),
    "musetalk": (f"{__name__}.musetalk",
                 "MuseTalk 1.5: its audio context live (sliding windows) against offline 30-s segments, cost"),
    "pipecat": (f"{__name__}.pipecat",
                "the avatar as a Pipecat processor: fps delivered, TTS-frame-to-image delay vs the bare graph, agents"),
    "nerf_fit": (f"{__name__}.nerf_fit", "fit-nerf on a real capture: steps/s and held-out PSNR against training time"),
    "launches": (f"{__name__}.launches",
                 "host syncs, kernels and allocations per steady-state frame of every pipeline (the launch audit)"),
    "first_frame": (f"{__name__}.first_frame",
                    "a session's first frame after preload (cold / warm, torch / compiled) against its steady latency"),
    "compile": (f"{__name__}.compile",
                "every Triton kernel compiled for sm_89 / sm_90 / sm_120: registers, spills, shared memory"),
    "scene_avatar": (f"{__name__}.scene_avatar",
                     "the avatar in a 3D scene: each branch alone and the composite, FPS, work p50, first frame"),
    "sessions": (f"{__name__}.sessions",
                 "many live sessions at once, batched by the model service or each alone: fps, p95, CPU per frame"),
    "startup": (f"{__name__}.startup", "each command's start-up: --help, render --help, info, a test card, an avatar"),
}

# `framegraph bench report`: a command beside the benches (it measures nothing; it draws their results).
REPORT = (f"{__name__}.report", "collect benchmark JSON files into one HTML page + PNG")

SUBCOMMANDS = {name: (module, help_, None) for name, (module, help_) in {**BENCHES, "report": REPORT}.items()}


def implementation(name: str):
    """The module that measures bench ``name``, with its ``run`` and ``figure``, imported."""
    return importlib.import_module(importlib.import_module(BENCHES[name][0]).IMPLEMENTATION)


def add_out_argument(p: argparse.ArgumentParser) -> None:
    """``--out FILE.json``: where a bench writes its result. Its figure goes beside it as ``FILE.png``."""
    p.add_argument("--out", required=True, help="JSON file to write (a PNG plot is written beside it)")
