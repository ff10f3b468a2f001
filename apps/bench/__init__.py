"""``framegraph bench NAME``: one module per benchmark, every one of the same shape.

A bench module exports three things:

- ``add_arguments(parser)``: its command-line arguments (``--out FILE.json`` among them);
- ``run(args) -> int``: measures, writes the JSON (``meta.bench_metadata(NAME)`` and its numbers) with the PNG
  of its figure beside it (``meta.write_result``), prints a summary; returns the exit status;
- ``figure(data, plt) -> matplotlib.figure.Figure``: its plot of one result, drawn from the JSON alone, so the
  PNG beside the JSON and the bench's section in ``framegraph bench report`` are the same picture.

A result names its bench (``"benchmark": NAME``, written by ``bench_metadata``); ``bench report`` draws it with
that bench's ``figure``. Adding a bench is its module and one line in ``BENCHES``.
"""
from __future__ import annotations

# NAME → (module, help), in the order `framegraph bench --help` lists them.
BENCHES = {
    "runtime": ("framegraph.apps.bench.runtime", "stage-graph overhead, latency under overload, drops, allocations, RSS"),
    "kernels": ("framegraph.apps.bench.kernels", "attention and DiT kernels against their torch / library peers"),
    "render": ("framegraph.apps.bench.render", "3DGS / 4DGS / NeRF render speed and peak memory per backend (+ gsplat)"),
    "server": ("framegraph.apps.bench.server", "streaming server: RSS over 100 sessions, latency over a 10-min soak"),
    "avatar": ("framegraph.apps.bench.avatar", "talking avatar: time to first frame, FPS and stage p50/p99 per size, sessions"),
    "avatar_int8": ("framegraph.apps.bench.avatar_int8",
                    "avatar's ONNX models in int8 vs float32, per model: held-out quality, stage p50, the decision"),
    "generate": ("framegraph.apps.bench.generate",
                 "Wan / SANA-Video streamed end to end: FPS (denoise + decode + encode), first frame, stage p50/p99"),
    "video_avatar": ("framegraph.apps.bench.video_avatar",
                     "video avatar on a real clip: held-out lip sync, PSNR outside the mouth, FPS, first frame"),
    "nerf_fit": ("framegraph.apps.bench.nerf_fit",
                 "fit-nerf on a real capture: steps/s and held-out PSNR against training time"),
    "launches": ("framegraph.apps.bench.launches",
                 "host syncs, kernels and allocations per steady-state frame of every pipeline (the launch audit)"),
    "first_frame": ("framegraph.apps.bench.first_frame",
                    "a session's first frame after preload (cold / warm, torch / compiled) against its steady latency"),
    "compile": ("framegraph.apps.bench.compile",
                "every Triton kernel compiled for sm_89 / sm_90 / sm_120: registers, spills, shared memory"),
}

# `framegraph bench report`: a command beside the benches (it measures nothing; it draws their results).
REPORT = ("framegraph.apps.bench.report", "collect benchmark JSON files into one HTML page + PNG")
