"""Gaussian-splatting render speed per backend: ms per frame, FPS and speed-up over the torch reference.

    framegraph bench render --out benchmarks/results/cuda/render.json --gaussians 500000 --size 1920x1080
    framegraph bench render --out out/render_cpu.json --quick        # small CPU smoke run

Each timed frame is a whole :func:`rasterize` call (projection, SH, tile sort, blending) with input
validation off, as a render stage would call it. GPU timings use CUDA events; the reported time is
the median over ``--iters`` frames after ``--warmup``. Each backend's image is compared with the
torch reference's (PSNR). On a CPU-only machine the Triton backend runs through Triton's
interpreter: its timing then says nothing about speed and is flagged ``"interpreted": true``.
A PNG of the first camera's reference frame is written beside the JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch


def _size(text: str) -> tuple:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be WIDTHxHEIGHT, e.g. 1280x720, got {text!r}") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return w, h


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="JSON file to write (a PNG of the render is written beside it)")
    p.add_argument("--scene", help="INRIA .ply or .splat scene (default: a random scene)")
    p.add_argument("--gaussians", type=int, default=None,
                   help="random scene size (default 200000 on CUDA, 2000 on CPU)")
    p.add_argument("--sh-degree", type=int, default=3, choices=(0, 1, 2, 3), help="random scene SH degree")
    p.add_argument("--size", type=_size, default=None, help="WIDTHxHEIGHT (default 1280x720 on CUDA, 128x96 on CPU)")
    p.add_argument("--cameras", type=int, default=1, help="cameras rendered per call (batched)")
    p.add_argument("--backends", default="torch,triton", help="comma-separated: torch, triton")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, default=3, help="untimed frames first (default 3)")
    p.add_argument("--iters", type=int, default=None, help="timed frames (default 20 on CUDA, 3 on CPU)")
    p.add_argument("--tile-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny run (a smoke test, not a measurement)")


def _scene_and_cameras(args, device):
    from framegraph.renderers.cameras import orbit_path
    from framegraph.renderers.gaussians import load_scene, random_scene

    cpu = device.type == "cpu"
    if args.scene:
        scene = load_scene(args.scene, device=device)
        source = os.path.abspath(args.scene)
    else:
        n = args.gaussians or (150 if args.quick else 2000 if cpu else 200_000)
        scene = random_scene(n, args.sh_degree, seed=args.seed, device=device)
        source = f"random(n={n}, sh_degree={args.sh_degree}, seed={args.seed})"
    width, height = args.size or ((64, 48) if args.quick else (128, 96) if cpu else (1280, 720))
    means = scene.means.detach().float()
    center = means.median(dim=0).values
    spread = torch.quantile((means - center).norm(dim=1).cpu(), 0.9).item() if scene.n else 1.0
    path = orbit_path(center.cpu(), 2.2 * max(spread, 1e-3), max(args.cameras, 1), elevation_deg=25,
                      fov_deg=60, width=width, height=height)
    return scene, source, path.viewmats.to(device), path.Ks.to(device), width, height


def _time_frames(render, device, warmup: int, iters: int) -> list:
    for _ in range(warmup):
        render()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            render()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            render()
            times.append((time.perf_counter() - t0) * 1000)
    return times


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


def _save_png(image: torch.Tensor, path: str) -> None:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        return
    pixels = (image.detach().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    Image.fromarray(pixels).save(path)


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"torch", "triton"}
    if unknown:
        raise ValueError(f"--backends: unknown {sorted(unknown)}; choose from torch, triton")
    if "triton" in backends and device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

    from framegraph.renderers.gaussians import rasterize, triton_available

    from .benchmeta import bench_metadata

    scene, source, viewmats, Ks, width, height = _scene_and_cameras(args, device)
    iters = args.iters or (1 if args.quick else 3 if device.type == "cpu" else 20)
    warmup = 0 if args.quick else args.warmup  # the untimed first render (kept for PSNR) also warms up
    result = bench_metadata("render")
    result.update({
        "scene": {"source": source, "gaussians": scene.n, "sh_degree": scene.sh_degree},
        "resolution": [width, height], "cameras": viewmats.shape[0], "tile_size": args.tile_size,
        "render_device": str(device), "timing": "cuda events" if device.type == "cuda" else "perf_counter",
        "warmup": warmup, "iters": iters, "results": {},
    })

    images = {}
    for backend in backends:
        if backend == "triton" and not triton_available(device):
            result["results"][backend] = {"skipped": f"triton cannot run on {device} here"}
            continue

        def render(backend=backend):
            with torch.no_grad():
                return rasterize(**scene.rasterize_args(), viewmats=viewmats, Ks=Ks, width=width, height=height,
                                 tile_size=args.tile_size, backend=backend, validate=False)

        img, _, meta = render()
        images[backend] = img
        times = _time_frames(render, device, warmup, iters)
        ms = statistics.median(times)
        result["results"][backend] = {
            "ms_per_frame_median": ms,
            "ms_per_frame_min": min(times),
            "ms_per_frame_max": max(times),
            "fps": 1000.0 * viewmats.shape[0] / ms,
            "intersections": int(meta["flatten_ids"].numel()),
            "interpreted": backend == "triton" and device.type == "cpu",
        }

    ref = result["results"].get("torch", {})
    for backend, entry in result["results"].items():
        if "ms_per_frame_median" in entry and "ms_per_frame_median" in ref:
            entry["speedup_vs_torch"] = ref["ms_per_frame_median"] / entry["ms_per_frame_median"]
            entry["psnr_vs_torch_db"] = _psnr(images[backend], images["torch"])

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    png = None
    if images:
        png = os.path.splitext(args.out)[0] + ".png"
        _save_png(next(iter(images.values()))[0, ..., :3], png)

    print(f"{scene.n} Gaussians, {width}x{height}, {viewmats.shape[0]} camera(s) on {device}")
    for backend, entry in result["results"].items():
        if "skipped" in entry:
            print(f"  {backend:7s} skipped: {entry['skipped']}")
            continue
        extra = " (interpreted: not a speed measurement)" if entry["interpreted"] else ""
        ratio = f", x{entry['speedup_vs_torch']:.2f} vs torch" if "speedup_vs_torch" in entry else ""
        print(f"  {backend:7s} {entry['ms_per_frame_median']:9.2f} ms/frame  {entry['fps']:8.1f} FPS{ratio}{extra}")
    print(f"wrote {args.out}" + (f" and {png}" if png else ""))
    return 0
