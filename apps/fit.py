"""``framegraph fit``: fit 3D Gaussians to posed images, or a procedural scene, and save an INRIA PLY.

    framegraph fit --synthetic toy --out out/toy.ply --steps 3000
    framegraph fit --images DIR --cameras DIR/transforms.json --out scene.ply --downscale 4

The camera file is a nerfstudio-style ``transforms.json``. Each frame has an OpenGL camera-to-world
``transform_matrix``, and ``fl_x fl_y cx cy w h`` in pixels. See ``framegraph.renderers.fit.data`` for the full
format. Every ``--held-out-every``-th image is held out and scored at the end.

It writes ``OUT.ply``. It writes ``OUT.fit.json`` / ``OUT.fit.safetensors``, the state ``--resume`` continues
from. That state is saved every ``--checkpoint-every`` steps, at the end and on Ctrl-C. It writes a JSON report,
``OUT.report.json`` unless ``--report`` says otherwise. ``framegraph fit-nerf``, in ``fit_nerf.py``, shares the
report header.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

import torch

from framegraph.models.runtime import default_device
from framegraph.renderers.fit import FitConfig, Fitter, load_transforms, synthetic_dataset
from framegraph.renderers.fit.densify import DensifyConfig
from framegraph.renderers.scenes import procedural_scene
from framegraph.stream.files import write_json

from .bench.meta import git_commit
from .cli import command_line


def start_device(args: argparse.Namespace) -> str:
    """Apply ``--threads`` and resolve ``--device``, by default cuda when available. Refuses cuda without it."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or default_device()
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available here; use --device cpu")
    return device


def report_header(device: str) -> dict:
    """What every fit report starts with: the exact command, git commit, date, versions, CPUs and threads."""
    return {
        "command": command_line(),
        "git_commit": git_commit(), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else None,
    }


def load_data(args: argparse.Namespace):
    """``(train, held_out, fitter_kwargs)`` for the chosen source."""
    if args.synthetic:
        scene = procedural_scene(args.synthetic)  # ValueError naming the choices if unknown
        w, h = args.size
        train = synthetic_dataset(args.synthetic, args.views, w, h, seed=args.seed)
        held = synthetic_dataset(args.synthetic, max(4, args.views // 8), w, h, seed=args.seed, held_out=True)
        kwargs = {"bounds": scene.bounds}
        if args.init == "points":
            pts, cols = scene.sample_points(args.init_points, seed=args.seed)
            kwargs = {"points": pts, "colors": cols}
        return train, held, kwargs
    if args.init == "points":
        raise ValueError("--init points needs --synthetic (with --images, initial points are random in the "
                         "region the cameras look at)")
    cameras = args.cameras or os.path.join(args.images, "transforms.json")
    if not args.cameras and not os.path.isfile(cameras):
        raise ValueError(f"--images {args.images}: no --cameras given and no transforms.json in that folder")
    data = load_transforms(cameras, args.images, background=args.background, downscale=args.downscale,
                           min_images=2 if args.held_out_every else 1)
    train, held = data.split(args.held_out_every)
    if len(train) == 0:
        raise ValueError(f"{cameras}: no training images left after holding out every "
                         f"{args.held_out_every}-th of {len(data)}")
    return train, held, {}


def run(args: argparse.Namespace) -> int:
    if not args.out.lower().endswith(".ply"):
        raise ValueError(f"--out {args.out!r}: expected a .ply file name")
    if args.cameras and not args.images:
        raise ValueError("--cameras goes with --images")
    device = start_device(args)
    train, held, kwargs = load_data(args)
    prefix = args.out[:-4]
    if args.resume:
        fitter = Fitter.load(prefix, train, device=device, steps=args.steps)
        print(f"resuming {args.out} at step {fitter.step} with {fitter.n} Gaussians", file=sys.stderr)
    else:
        cfg = FitConfig(steps=args.steps, seed=args.seed, sh_degree=args.sh_degree, init_points=args.init_points,
                        background=tuple(args.background), densify=DensifyConfig(max_gaussians=args.max_gaussians))
        torch.manual_seed(args.seed)
        fitter = Fitter(train, cfg, device=device, **kwargs)
    print(f"fitting {len(train)} views {train.width}x{train.height} from {train.source} on {device}: "
          f"{fitter.n} Gaussians to start, {args.steps} steps", file=sys.stderr)
    t0, cpu0 = time.perf_counter(), time.process_time()
    # Ctrl-C: the step in flight finishes, the checkpoint is saved, KeyboardInterrupt reaches main()
    fitter.run(args.steps, progress=not args.no_progress, checkpoint=prefix,
               checkpoint_every=args.checkpoint_every, desc=f"fit {os.path.basename(args.out)}")
    run_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0

    report = report_header(device)
    report.update({
        "out": args.out, "data": train.source, "device": str(device), "seed": fitter.cfg.seed,
        "steps": fitter.step, "size": [train.width, train.height], "train_views": len(train),
        "held_out_views": len(held), "n_gaussians": fitter.n, "sh_degree": fitter.sh_degree_now,
        "wall_s": round(fitter.wall_s, 2), "wall_s_this_run": round(run_s, 2), "cpu_s_this_run": round(cpu_s, 2),
    })
    if len(held):
        ev = fitter.evaluate(held)
        report["held_out"] = ev
        print(f"held-out PSNR {ev['psnr']:.2f} dB, SSIM {ev['ssim']:.4f} over {ev['n_views']} views",
              file=sys.stderr)
    report["train"] = {k: v for k, v in fitter.evaluate(train.subset(range(0, len(train), max(1, len(train) // 8))))
                       .items() if k != "psnr_per_view"}
    report_path = args.report or prefix + ".report.json"
    write_json(report_path, report, indent=1)
    print(f"wrote {args.out}: {fitter.n} Gaussians, SH degree {fitter.sh_degree_now}, {fitter.step} steps in "
          f"{fitter.wall_s:.0f} s (report {report_path})", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0
