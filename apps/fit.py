"""``framegraph fit``: fit 3D Gaussians to posed images (or a procedural scene) and save an INRIA PLY.

    framegraph fit --synthetic toy --out out/toy.ply --steps 3000
    framegraph fit --images DIR --cameras DIR/transforms.json --out scene.ply --downscale 4

Camera file: nerfstudio-style ``transforms.json`` (OpenGL camera-to-world
``transform_matrix`` per frame, ``fl_x fl_y cx cy w h`` in pixels); see
``framegraph.renderers.fit.data`` for the full format. Every ``--held-out-every``-th
image is held out and scored at the end. Writes ``OUT.ply`` plus
``OUT.fit.json`` / ``OUT.fit.safetensors`` (the state ``--resume`` continues from,
saved every ``--checkpoint-every`` steps, at the end and on Ctrl-C) and a JSON
report (``OUT.report.json`` unless ``--report`` says otherwise). ``framegraph
fit-nerf`` (``fit_nerf.py``) shares the run options and the report header.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

from .argtypes import positive_int, video_size


def _rgb(text: str) -> tuple:
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != 3 or not all(0.0 <= v <= 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"background {text!r}: expected R,G,B in [0, 1], e.g. 0,0,0")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="folder of training images (paths in --cameras are relative to it)")
    src.add_argument("--synthetic", metavar="NAME",
                     help="render a procedural scene's views and fit those (available: toy)")
    p.add_argument("--cameras", help="(with --images) nerfstudio-style transforms.json "
                                     "(default: transforms.json in the images folder)")
    p.add_argument("--out", required=True, help="output scene, INRIA .ply")
    p.add_argument("--steps", type=positive_int, default=3000, help="optimisation steps (default 3000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--sh-degree", type=int, choices=[0, 1, 2, 3], default=3, help="final SH degree (default 3)")
    p.add_argument("--init", choices=["random", "points"], default="random",
                   help="start from random points in the scene bounds, or (with --synthetic) from the "
                        "procedural scene's SfM-like surface point cloud (default random)")
    p.add_argument("--init-points", type=positive_int, default=2000, help="initial Gaussians (default 2000)")
    p.add_argument("--max-gaussians", type=positive_int, default=None, help="stop growing at this many")
    p.add_argument("--background", type=_rgb, default=(0.0, 0.0, 0.0),
                   help="R,G,B in [0, 1] behind the Gaussians and under transparent pixels (default 0,0,0)")
    p.add_argument("--held-out-every", type=int, default=8,
                   help="(with --images) hold out every N-th image for the final score; 0: none (default 8)")
    p.add_argument("--downscale", type=positive_int, default=1, help="(with --images) shrink images by N")
    p.add_argument("--views", type=positive_int, default=32, help="(with --synthetic) training views (default 32)")
    p.add_argument("--size", type=video_size, default=(128, 96),
                   help="(with --synthetic) WIDTHxHEIGHT of the rendered views (default 128x96)")
    p.add_argument("--report", help="where to write the JSON report (default OUT.report.json)")
    add_run_arguments(p, "OUT.fit.json / OUT.fit.safetensors")


def add_run_arguments(p: argparse.ArgumentParser, checkpoint: str) -> None:
    """The options of a fit's run that ``fit`` and ``fit-nerf`` share (``checkpoint`` names its files)."""
    p.add_argument("--resume", action="store_true",
                   help=f"continue from {checkpoint} (same data and options; a larger --steps continues the run)")
    p.add_argument("--checkpoint-every", type=positive_int, default=None,
                   help="also save the checkpoint every N steps (it is always saved at the end, and on Ctrl-C)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for torch (default: torch's choice; 1 is fastest on a busy machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def start_device(args: argparse.Namespace) -> str:
    """Apply ``--threads`` and resolve ``--device`` (default cuda when available); refuses cuda without it."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available here; use --device cpu")
    return device


def report_header(command: str, device: str) -> dict:
    """What every fit report starts with: the exact command, git commit, date, versions, CPUs and threads."""
    import torch

    from .bench.meta import git_commit

    return {
        "command": " ".join(["framegraph", command] + sys.argv[2:]) if sys.argv[1:2] == [command]
        else " ".join([os.path.basename(sys.executable)] + sys.argv),
        "git_commit": git_commit(), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else None,
    }


def load_data(args: argparse.Namespace):
    """``(train, held_out, fitter_kwargs)`` for the chosen source."""
    from framegraph.renderers.fit import load_transforms, synthetic_dataset
    from framegraph.renderers.scenes import procedural_scene

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
    import torch

    from framegraph.renderers.fit import FitConfig, Fitter
    from framegraph.renderers.fit.densify import DensifyConfig

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

    report = report_header("fit", device)
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
    Path(report_path).parent.mkdir(parents=True, exist_ok=True)
    Path(report_path).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}: {fitter.n} Gaussians, SH degree {fitter.sh_degree_now}, {fitter.step} steps in "
          f"{fitter.wall_s:.0f} s (report {report_path})", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m framegraph.apps.fit ...`` (the same as ``framegraph fit ...``)."""
    parser = argparse.ArgumentParser(prog="framegraph fit", description=__doc__.strip().splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"framegraph fit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("framegraph fit: aborted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
