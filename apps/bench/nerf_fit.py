"""``framegraph bench nerf_fit``: how fast ``fit-nerf`` learns a real capture — held-out PSNR against training time.

    framegraph bench nerf_fit --transforms fox/transforms.json --downscale 8 --aabb -1.5 -1.5 -1.5 1.5 1.5 1.5 \\
        --out benchmarks/results/cpu/nerf_fit_fox.json

It fits a NeRF exactly as ``framegraph fit-nerf`` does. It uses the same loader and the same per-device default
sizes. The hold-out is the same: every ``--hold-out``-th frame. Every ``--eval-every`` steps it renders the
held-out frames and scores them in PSNR, dB. The training clock stops while it evaluates. So ``train_s`` is the
time a plain ``fit-nerf`` run would have spent. This process's CPU time is recorded beside it. On a shared
machine the wall time depends on the other work, so the load average is recorded too. The JSON names the
dataset and holds no images.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from framegraph.renderers.nerf.cli import config_from_args, resolve_defaults
from framegraph.renderers.nerf.dataset import load_transforms
from framegraph.renderers.nerf.fit import fit
from framegraph.renderers.nerf.model import NerfModel
from framegraph.stream.quality import psnr

from .meta import bench_metadata, write_result


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    resolve_defaults(args, args.device)
    data = load_transforms(args.transforms, downscale=args.downscale, background=args.background)
    n, H, W = data.images.shape[:3]
    test = [i for i in range(n) if args.hold_out and i % args.hold_out == 0 and n > 1]
    train = [i for i in range(n) if i not in test]
    if not test:
        raise SystemExit("bench nerf_fit: no held-out frames (need --hold-out >= 2 and at least 2 frames)")
    aabb = args.aabb or data.suggested_aabb()
    config = config_from_args(args, aabb, args.background, occupancy_decay=args.occupancy_decay)
    model = NerfModel(config, seed=args.seed, device=args.device)

    curve: list[dict] = []
    clock = {"paused_s": 0.0, "start": 0.0, "cpu_paused_s": 0.0, "cpu_start": 0.0}

    def evaluate(step: int) -> None:
        t, c = time.perf_counter(), time.process_time()
        train_s, train_cpu_s = t - clock["start"] - clock["paused_s"], c - clock["cpu_start"] - clock["cpu_paused_s"]
        model.eval()
        with torch.no_grad():
            scores = [psnr(model.render(data.viewmats[i], data.Ks[i], W, H).cpu(), data.images[i]) for i in test]
        model.train()
        point = {"step": step + 1, "train_s": round(train_s, 1), "train_cpu_s": round(train_cpu_s, 1),
                 "held_out_psnr_db": round(sum(scores) / len(scores), 2),
                 "occupied_fraction": round(model.occupancy.occupied_fraction, 4),
                 "eval_s": round(time.perf_counter() - t, 1), "load_average_1min": round(os.getloadavg()[0], 2)}
        curve.append(point)
        print(f"bench nerf_fit: step {point['step']:5d}  {train_s:6.1f} s  held-out {point['held_out_psnr_db']:5.2f} dB"
              f"  occupied {point['occupied_fraction']:.3f}", flush=True)
        clock["paused_s"] += time.perf_counter() - t
        clock["cpu_paused_s"] += time.process_time() - c

    def callback(step: int, loss: float) -> None:
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            evaluate(step)

    clock["start"], clock["cpu_start"] = time.perf_counter(), time.process_time()
    report = fit(model, data.images[train], data.viewmats[train], data.Ks[train], steps=args.steps,
                 batch_rays=args.batch_rays, seed=args.seed, callback=callback)
    if not curve or curve[-1]["step"] != args.steps:
        evaluate(args.steps - 1)
    reached = next((p for p in curve if p["held_out_psnr_db"] >= args.target_db), None)
    final = curve[-1]
    result = bench_metadata("nerf_fit")
    result.update({
        "dataset": {"transforms": os.path.abspath(args.transforms), "frames": n, "train_frames": len(train),
                    "held_out_frames": len(test), "image_hw": [H, W], "downscale": args.downscale},
        "threads": torch.get_num_threads(),
        "config": {"aabb": list(aabb), "steps": args.steps, "batch_rays": args.batch_rays,
                   "nerf": model.config.to_dict()},
        "steps_per_s": round(args.steps / max(1e-9, final["train_s"]), 3),
        "samples_per_ray": round(report.samples_per_ray, 2),
        "curve": curve,
        "final_held_out_psnr_db": final["held_out_psnr_db"],
        "train_s": final["train_s"],
        "target": {"held_out_psnr_db": args.target_db, "within_s": args.budget_s,
                   "reached_at_s": reached["train_s"] if reached else None,
                   "met": bool(reached and reached["train_s"] <= args.budget_s)},
    })
    png = write_result(result, args.out, figure)
    print(f"bench nerf_fit: {result['steps_per_s']} steps/s, held-out {final['held_out_psnr_db']} dB after "
          f"{final['train_s']} s; target {args.target_db} dB within {args.budget_s:.0f} s "
          f"{'met' if result['target']['met'] else 'missed'} -> {args.out} (+ {png})")
    return 0


def figure(data: dict, plt):
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["train_s"] for p in data["curve"]], [p["held_out_psnr_db"] for p in data["curve"]], "o-",
            label="held-out PSNR")
    t = data["target"]
    ax.axhline(t["held_out_psnr_db"], color="gray", ls="--", lw=1, label=f"target {t['held_out_psnr_db']} dB")
    ax.axvline(t["within_s"], color="gray", ls=":", lw=1, label=f"{t['within_s']:.0f} s")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("PSNR (dB)")
    name = os.path.basename(os.path.dirname(data["dataset"]["transforms"]))
    ax.set_title(f"fit-nerf on {name} (/{data['dataset']['downscale']}), {data['device']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
