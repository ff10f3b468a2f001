"""``framegraph fit-nerf``: train a NeRF directory from a ``transforms.json``.

The file may come from instant-ngp, nerfstudio or Blender.

    framegraph fit-nerf data/fox/transforms.json --out out/fox --downscale 8 --steps 2000
    framegraph fit-nerf data/fox/transforms.json --out out/fox --downscale 8 --steps 4000 --resume

The file is read by the loader ``fit`` uses too, ``renderers/posed_images.py``. Frames without their image are
skipped with a warning. Lens distortion is undone. The scene box is instant-ngp's when the file sets
``aabb_scale`` / ``scale`` / ``offset`` / ``aabb``. Otherwise it is a cube around the point the cameras look at,
or ``--aabb``. Every ``--hold-out``-th frame is kept out of training and scored at the end.

``OUT/`` receives three things:

- the NeRF: ``config.json`` + ``model.safetensors``. Render it with ``framegraph render --scene OUT``.
- the checkpoint ``--resume`` continues from: ``fit.fit.json`` + ``fit.fit.safetensors``. It is saved every
  ``--checkpoint-every`` steps, at the end and on Ctrl-C.
- the JSON report: ``report.json`` unless ``--report`` says otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from framegraph.renderers.nerf import NerfModel, load_transforms
from framegraph.renderers.nerf.cli import config_from_args, resolve_defaults
from framegraph.renderers.nerf.fit import NerfFitConfig, NerfFitter
from framegraph.stream.files import write_json

from .fit import report_header, start_device


def run(args: argparse.Namespace) -> int:
    if args.hold_out < 0:
        raise ValueError(f"--hold-out {args.hold_out}: expected 0 (train on all) or a positive N")
    device = start_device(args)
    resolve_defaults(args, device)
    data = load_transforms(args.transforms, downscale=args.downscale, background=args.background,
                           min_images=2 if args.hold_out else 1)
    train, held = data.split(args.hold_out)
    if len(train) == 0:
        raise ValueError(f"{args.transforms}: no training frames left after holding out every {args.hold_out}-th "
                         f"of {len(data)}")
    prefix = os.path.join(args.out, "fit")
    if args.resume:
        fitter = NerfFitter.load(prefix, train, device=device, steps=args.steps)
        print(f"resuming {args.out} at step {fitter.step}", file=sys.stderr)
    else:
        aabb = args.aabb or data.suggested_aabb()
        config = config_from_args(args, aabb, args.background, occupancy_decay=args.occupancy_decay)
        fit_config = NerfFitConfig(steps=args.steps, batch_rays=args.batch_rays, lr=args.lr, loss=args.loss,
                                   seed=args.seed)
        fitter = NerfFitter(NerfModel(config, seed=args.seed, device=device), train, fit_config)
    box = fitter.model.config.aabb
    print(f"fitting {len(train)} views {train.width}x{train.height} from {train.source} on {device}: "
          f"{args.steps} steps of {args.batch_rays} rays, box [{', '.join(f'{v:.3g}' for v in box[:3])}] to "
          f"[{', '.join(f'{v:.3g}' for v in box[3:])}]", file=sys.stderr)
    t0, cpu0 = time.perf_counter(), time.process_time()
    # Ctrl-C: the step in flight finishes, the checkpoint is saved, KeyboardInterrupt reaches main()
    fitter.run(args.steps, progress=not args.no_progress, checkpoint=prefix, checkpoint_every=args.checkpoint_every,
               desc=f"fit-nerf {os.path.basename(os.path.normpath(args.out))}")
    run_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0

    report = report_header(device)
    report.update({
        "out": args.out, "data": train.source, "device": str(device), "seed": fitter.cfg.seed, "steps": fitter.step,
        "batch_rays": fitter.cfg.batch_rays, "size": [train.width, train.height], "train_views": len(train),
        "held_out_views": len(held), "aabb": list(box), "occupied_fraction": fitter.model.occupancy.occupied_fraction,
        "wall_s": round(fitter.wall_s, 2), "wall_s_this_run": round(run_s, 2), "cpu_s_this_run": round(cpu_s, 2),
    })
    if len(held):
        print(f"rendering {len(held)} held-out views ({held.width}x{held.height}) to score them", file=sys.stderr)
        t1 = time.perf_counter()
        ev = fitter.evaluate(held, progress=not args.no_progress)
        report["held_out"] = {**ev, "wall_s": round(time.perf_counter() - t1, 2)}
        print(f"held-out PSNR {ev['psnr']:.2f} dB over {ev['n_views']} views", file=sys.stderr)
    report_path = args.report or os.path.join(args.out, "report.json")
    write_json(report_path, report, indent=1)
    print(f"wrote {args.out}: {fitter.step} steps in {fitter.wall_s:.0f} s (report {report_path})", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0
