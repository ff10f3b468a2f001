"""Train the shipped demo NeRF from images we render ourselves, and record how it went.

    python -m framegraph.renderers.nerf.demo --out assets/nerf/spheres

It renders ``--views`` training images of :func:`spheres.demo_scene`, from cameras around it. That scene is
analytic spheres on a white background. It fits a :class:`NerfModel` with :func:`fit`. It measures PSNR on
``--held-out`` cameras never trained on. It writes into ``--out``:

- ``config.json`` and ``model.safetensors``: the NeRF.
- ``train_report.json``: command, seed, steps, wall time, PSNR, versions.
- ``preview.png``: held-out ground truth above the NeRF's renders.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from framegraph.stream.files import write_json
from framegraph.stream.quality import psnr

from .cli import add_model_arguments, config_from_args
from .fit import fit
from .model import WEIGHTS_NAME, NerfModel
from .spheres import demo_scene, sphere_views


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m framegraph.renderers.nerf.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output NeRF directory")
    p.add_argument("--steps", type=int, default=1000, help="optimisation steps (default 1000)")
    p.add_argument("--size", type=int, default=64, help="training / test image size in pixels, square (default 64)")
    p.add_argument("--views", type=int, default=30, help="training views (default 30)")
    p.add_argument("--held-out", type=int, default=6, help="held-out test views (default 6)")
    p.add_argument("--batch-rays", type=int, default=1024, help="rays per step (default 1024)")
    add_model_arguments(p, levels=16, log2_table=15, finest=256, occupancy=64, steps_per_diagonal=128)
    p.add_argument("--occupancy-decay", type=float, default=0.7,
                   help="occupancy EMA decay per update (default 0.7: every cell is re-measured at each update "
                        "here, so a short memory is safe and prunes empty space early)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    scene = demo_scene()
    W = H = args.size
    train = sphere_views(args.views, width=W, height=H)
    test = sphere_views(args.held_out, width=W, height=H, start_deg=17.0, elevations_deg=(5.0, 30.0))
    images = torch.stack([scene.render(v, k, W, H) for v, k in zip(train.viewmats, train.Ks)])
    truth = torch.stack([scene.render(v, k, W, H) for v, k in zip(test.viewmats, test.Ks)])

    config = config_from_args(args, tuple(scene.aabb), scene.background, occupancy_decay=args.occupancy_decay)
    model = NerfModel(config, seed=args.seed, device=args.device)
    report = fit(model, images, train.viewmats, train.Ks, steps=args.steps, batch_rays=args.batch_rays,
                 occupancy_warmup=32, occupancy_cells=args.occupancy ** 3, seed=args.seed,
                 log_every=max(1, args.steps // 20))

    t0 = time.perf_counter()
    with torch.no_grad():
        renders = torch.stack([model.render(v, k, W, H).cpu() for v, k in zip(test.viewmats, test.Ks)])
    render_s = (time.perf_counter() - t0) / len(renders)
    scores = [psnr(r, t) for r, t in zip(renders, truth)]
    out = model.save(args.out)
    _write_preview(out / "preview.png", truth, renders)
    doc = {
        "command": "python -m framegraph.renderers.nerf.demo " + " ".join(sys.argv[1:] if argv is None else argv),
        "seed": args.seed, "steps": args.steps, "batch_rays": args.batch_rays, "train_views": args.views,
        "image_size": [W, H], "train_wall_s": round(report.wall_s, 1),
        "train_cpu_s": round(report.cpu_s, 1),
        "final_loss": report.losses[-1] if report.losses else None,
        "samples_per_ray_mean": round(report.samples_per_ray, 2),
        "occupied_fraction": round(report.occupied_fraction, 4),
        "held_out_psnr_db": [round(s, 2) for s in scores],
        "held_out_psnr_mean_db": round(sum(scores) / len(scores), 2),
        "render_s_per_frame": round(render_s, 3),
        "weights_bytes": (out / WEIGHTS_NAME).stat().st_size,
        "device": args.device, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
    }
    write_json(out / "train_report.json", doc)
    print(json.dumps(doc, indent=2))
    return 0


def _write_preview(path: Path, truth: torch.Tensor, renders: torch.Tensor) -> None:
    from PIL import Image

    top = torch.cat(list(truth), dim=1)
    bottom = torch.cat(list(renders), dim=1)
    img = (torch.cat([top, bottom], dim=0).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()
    Image.fromarray(img).save(path)


if __name__ == "__main__":
    sys.exit(main())
