"""Fit the shipped 4DGS demo scene to multi-view video of its procedural ground truth. Save it as a fudan-zvg
checkpoint.

    python -m framegraph.renderers.gaussians4d.demo --out assets/scenes4d/bouncing_ball.pth --threads 1

The ground truth is :func:`framegraph.renderers.scenes.bouncing_ball_scene`, ray-cast in torch. It has a
checkered floor, a bouncing, spinning beach ball and drifting coloured blobs. It loops every 2 seconds. A rig of
``--cameras`` cameras films ``--frames`` frames of the loop at ``--size``. The 4D Gaussians start at the scene's
surface points at those frame times. :class:`Fitter4D` fits them. The PSNR is measured on cameras placed between
the rig's. The times are halfway between its frames. None of these is trained on.

It writes ``OUT.pth`` and ``OUT.json``: the checkpoint and its ``time_duration`` sidecar. It also writes
``OUT.report.json``: command, settings, times, PSNR, versions. It is deterministic for a seed on one machine
and torch build.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from framegraph.stream.files import write_json

from ..fit.densify import DensifyConfig
from ..scenes import BOUNCING_BALL_DURATION_S, bouncing_ball_scene
from .fit import Fit4DConfig, Fitter4D, VideoViews, render_video, scene_points
from .io import save_checkpoint

TIME_DURATION = (0.0, BOUNCING_BALL_DURATION_S)


def rig_video(frames: int, cameras: int, width: int, height: int, *, seed: int = 0) -> VideoViews:
    """The training video: ``frames`` frames from a rig of ``cameras``. Frame ``k`` is at ``k / frames`` of the loop."""
    times = [k * BOUNCING_BALL_DURATION_S / frames for k in range(frames)]
    return render_video(bouncing_ball_scene, times, bouncing_ball_scene(0.0).views(cameras, width, height, seed=seed))


def held_out_video(frames: int, width: int, height: int, *, n_frames: int = 4, n_cameras: int = 4,
                   seed: int = 0) -> VideoViews:
    """What the fit is scored on: ``n_frames`` times, seen from ``n_cameras`` cameras.

    The times are halfway between the frames of a ``frames``-frame rig video. The cameras sit between the rig's."""
    step = BOUNCING_BALL_DURATION_S / frames
    times = [(k + 0.5) * step for k in range(0, frames, max(1, frames // n_frames))][:n_frames]
    views = bouncing_ball_scene(0.0).views(n_cameras, width, height, seed=seed + 1, offset=0.5)
    return render_video(bouncing_ball_scene, times, views)


def fit_demo(*, frames: int = 40, cameras: int = 12, width: int = 128, height: int = 96, steps: int = 2000,
             points_per_frame: int = 150, max_gaussians: int = 12_000, seed: int = 0,
             progress: bool = True) -> tuple[Fitter4D, VideoViews]:
    """Fit the demo scene. Returns the finished :class:`Fitter4D` and the held-out video."""
    train = rig_video(frames, cameras, width, height, seed=seed)
    held = held_out_video(frames, width, height, seed=seed)
    points, colors, times = scene_points(bouncing_ball_scene, train.times.tolist(), points_per_frame, seed=seed)
    config = Fit4DConfig(steps=steps, seed=seed, densify=DensifyConfig(max_gaussians=max_gaussians))
    fitter = Fitter4D(train, config, points, colors, times, TIME_DURATION)
    fitter.run(progress=progress, desc="fit bouncing_ball")
    return fitter, held


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m framegraph.renderers.gaussians4d.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output .pth (OUT.json with time_duration and OUT.report.json "
                                                "go beside it)")
    p.add_argument("--steps", type=int, default=2000, help="optimisation steps, one (frame, camera) each "
                                                           "(default 2000)")
    p.add_argument("--frames", type=int, default=40, help="frames of the 2 s loop the rig films (default 40)")
    p.add_argument("--cameras", type=int, default=12, help="cameras in the rig (default 12)")
    p.add_argument("--size", default="128x96", help="WIDTHxHEIGHT of the training images (default 128x96)")
    p.add_argument("--points-per-frame", type=int, default=150,
                   help="initial Gaussians per frame, at the scene's surface points (default 150)")
    p.add_argument("--max-gaussians", type=int, default=12_000, help="densification stops here (default 12000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default; 1 is fastest "
                                                          "on a busy machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        print(f"--size {args.size!r}: expected WIDTHxHEIGHT, e.g. 128x96", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    t0, cpu0 = time.perf_counter(), time.process_time()
    fitter, held = fit_demo(frames=args.frames, cameras=args.cameras, width=width, height=height, steps=args.steps,
                            points_per_frame=args.points_per_frame, max_gaussians=args.max_gaussians,
                            seed=args.seed, progress=not args.no_progress)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    score = fitter.evaluate(held)
    out = save_checkpoint(fitter.scene(), args.out, iteration=fitter.step)
    report = {
        "command": "python -m framegraph.renderers.gaussians4d.demo "
                   + " ".join(sys.argv[1:] if argv is None else list(argv)),
        "seed": args.seed, "steps": fitter.step, "frames": args.frames, "cameras": args.cameras,
        "size": [width, height], "n_gaussians": fitter.n, "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
        "held_out": {k: round(v, 3) if isinstance(v, float) else v for k, v in score.items()},
        "file_bytes": out.stat().st_size, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "history": fitter.history,
    }
    write_json(Path(out).with_suffix(".report.json"), report, indent=1)
    print(f"wrote {out}: {fitter.n} 4D Gaussians, {out.stat().st_size / 2**20:.2f} MiB; held-out PSNR "
          f"{score['psnr']:.2f} dB (worst frame {score['psnr_worst_frame']:.2f} dB); {cpu_s:.0f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
