"""int8 against float32 ONNX Runtime, per model of the shipped avatar: speed and quality, and the decision.

    framegraph bench avatar_int8 --out benchmarks/results/cpu/avatar_int8.json

For each ``--modes`` entry (``static``, ``dynamic``: ``models/onnx/quantize.py``) the shipped bundle is
exported and quantized (into a temporary folder), then each model — audio encoder, DiT, VAE decoder — is
run **alone** in int8 (the others float32) and compared with the float32 ORT export:

- **quality**: ``avatar eval``'s openness correlation (generated mouth vs the ground-truth jaw) and identity
  SSIM (vs the portrait outside the mouth) on held-out synthetic clips (``--clips``, default: the three clips
  of ``avatar synth --clips 3 --seconds 6 --seed 1000``, the shipped figures' clips — see the bundle's
  PROVENANCE.md), means over the clips (``models/avatar/evaluate.py``, ``real_measures=False``);
- **speed**: the steady run of ``bench avatar`` (speech pushed at once, fast clock, one intra-op thread per
  stage as the server runs): FPS and per-stage ``process()`` p50. The variants are measured in turns,
  ``--rounds`` times, and each figure is the median over the rounds, so a change of the machine's load
  touches them all alike.

A model keeps int8 when both quality figures stay within 0.01 of float32 and its stage's p50 is lower
(:func:`~framegraph.models.onnx.quantize.choose_int8`); the decision (mode and models) is what
``framegraph export --int8`` uses by default (``quantize.DEFAULT_MODE`` / ``DEFAULT_INT8``, checked against
this JSON by the tests). When more than one model holds, they are measured together too.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from .avatar import DEFAULT_AVATAR, _shown_path
from .avatar_measure import measure_steady
from .meta import add_out_argument, bench_metadata, write_result
from .speech import speech

STAGE = {"audio": "audio_features", "dit": "denoiser", "vae": "vae_decode"}  # the stage each model runs in


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_out_argument(p)
    p.add_argument("--avatar", default=DEFAULT_AVATAR, help="the bundle (default assets/avatars/astronaut)")
    p.add_argument("--clips", default=None,
                   help="a folder of held-out synthetic clips (clip_NNNNN.mp4 + .json, from `framegraph avatar synth`); "
                        "default: synthesize --clip-count clips of 6 s with seed 1000 (the shipped figures' clips)")
    p.add_argument("--clip-count", type=int, default=3, help="held-out clips to use (default 3)")
    p.add_argument("--modes", default="static,dynamic", help="int8 modes to measure (default static,dynamic)")
    p.add_argument("--seconds", type=float, default=6.0, help="speech for each steady speed run (default 6)")
    p.add_argument("--rounds", type=int, default=2, help="speed runs per variant, in turns (default 2)")
    p.add_argument("--torch-threads", type=int, default=1, help="intra-op threads per stage (default 1)")


def _clips(args, tmp: str) -> list[tuple[str, str]]:
    folder = args.clips
    if folder is None:
        from framegraph.models.synth import load_portrait, make_clip

        folder = os.path.join(tmp, "heldout")
        portrait = load_portrait()
        for i in range(args.clip_count):
            make_clip(folder, i, seconds=6.0, fps=25, portrait=portrait, seed=1000)
    pairs = []
    for i in range(args.clip_count):
        stem = os.path.join(folder, f"clip_{i:05d}")
        if not (os.path.isfile(stem + ".mp4") and os.path.isfile(stem + ".json")):
            raise ValueError(f"--clips {folder!r}: {stem}.mp4 / .json missing (expected `framegraph avatar synth` "
                             f"output with at least {args.clip_count} clips)")
        pairs.append((stem + ".mp4", stem + ".json"))
    return pairs


def _quality(avatar, clips, kw: dict) -> dict:
    from framegraph.models.avatar.evaluate import evaluate_avatar

    per = []
    for clip, truth in clips:
        m = evaluate_avatar(avatar, clip, truth, real_measures=False, **kw)
        per.append({"clip": os.path.basename(clip), "openness_corr": m["openness_corr"],
                    "identity_ssim": m["identity_ssim"], "identity_psnr_db": m["identity_psnr_db"]})
    return {"openness_corr": float(np.mean([p["openness_corr"] for p in per])),
            "identity_ssim": float(np.mean([p["identity_ssim"] for p in per])), "per_clip": per}


def _speed(runs: list[dict]) -> dict:
    """Medians over the rounds: FPS and each stage's p50 (ms)."""
    stages = runs[0]["stages_host_ms"].keys()
    return {"fps": float(np.median([r["fps"] for r in runs])),
            "stage_p50_ms": {s: float(np.median([r["stages_host_ms"][s]["p50_ms"] for r in runs])) for s in stages},
            "rounds": [{"fps": r["fps"], "stage_p50_ms": {s: r["stages_host_ms"][s]["p50_ms"] for s in stages}}
                       for r in runs]}


def run(args: argparse.Namespace) -> int:
    from framegraph.models.avatar import load_avatar
    from framegraph.models.onnx.export import export_avatar
    from framegraph.models.onnx.quantize import MODES, TOLERANCE, choose_int8, quantize_export, variant_dir

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(f"--modes {args.modes!r}: expected a comma-separated list of {', '.join(MODES)}")
    if args.rounds < 1 or args.clip_count < 1:
        raise ValueError("--rounds and --clip-count must be >= 1")
    result = bench_metadata("avatar_int8")
    avatar = load_avatar(args.avatar)
    audio, audio_info = speech(args.seconds, seed=0)
    with tempfile.TemporaryDirectory(prefix="fg-bench-int8-") as tmp:
        clips = _clips(args, tmp)
        fp32 = os.path.join(tmp, "fp32")
        export_avatar(avatar, fp32)
        variants = {"fp32": {"backend": "onnx", "onnx_dir": fp32, "mode": None, "models": []}}
        quantize_s = {}
        for mode in modes:
            full = os.path.join(tmp, mode)
            shutil.copytree(fp32, full)
            t = time.perf_counter()
            quantize_export(avatar, full, mode, models=[], log=print)
            quantize_s[mode] = time.perf_counter() - t
            for model in STAGE:
                variants[f"{mode}:{model}"] = {"backend": "onnx-int8", "mode": mode, "models": [model],
                                               "onnx_dir": variant_dir(full, os.path.join(tmp, f"{mode}-{model}"),
                                                                       avatar, [model])}
        measured = _measure(avatar, variants, clips, audio, args)
        decisions = {}
        for mode in modes:
            per = {model: {**measured[f"{mode}:{model}"]["quality"], **measured[f"{mode}:{model}"]["speed"],
                           "stage": STAGE[model]} for model in STAGE}
            ref = {**measured["fp32"]["quality"], **measured["fp32"]["speed"]}
            decisions[mode] = choose_int8(ref, per, TOLERANCE)
        best = max(modes, key=lambda m: len(decisions[m]["models"]))
        kept = decisions[best]["models"]
        if len(kept) > 1:  # the models that hold, together
            name = f"{best}:{'+'.join(kept)}"
            variants = {name: {"backend": "onnx-int8", "mode": best, "models": kept,
                               "onnx_dir": variant_dir(os.path.join(tmp, best), os.path.join(tmp, "kept"), avatar,
                                                       kept)}}
            measured.update(_measure(avatar, variants, clips, audio, args))
    result.update({
        "avatar": _shown_path(args.avatar),
        "settings": {"modes": modes, "rounds": args.rounds, "seconds": args.seconds, "torch_threads": args.torch_threads,
                     "clips": [os.path.basename(c) for c, _ in clips],
                     "clips_source": args.clips or "framegraph avatar synth --clips 3 --seconds 6 --seed 1000 "
                                                   "(made by the bench)",
                     "tolerance": TOLERANCE, "audio": {**audio_info, "seconds": args.seconds}},
        "quality_measure": "avatar eval (models/avatar/evaluate.py, real_measures=False): openness_corr and "
                           "identity_ssim, means over the clips",
        "speed_measure": "bench avatar's steady run (fast clock, speech at once); per-stage process() p50 and FPS, "
                         "median over the rounds (variants measured in turns)",
        "quantize_seconds": quantize_s,
        "variants": measured,
        "decisions": decisions,
        "decision": {"mode": best if kept else None, "models": kept,
                     "summary": (f"int8 ({best}) kept for {', '.join(kept)}" if kept else
                                 "no model holds quality and speed in int8: the export's default keeps float32")},
    })
    png = write_result(result, args.out, figure)
    for line in summary_lines(result):
        print(line)
    print(f"wrote {args.out} and {png}")
    return 0


def _measure(avatar, variants: dict, clips, audio, args) -> dict:
    out = {}
    for name, v in variants.items():
        kw = {"backend": v["backend"], "onnx_dir": v["onnx_dir"]}
        print(f"[{name}] quality on {len(clips)} held-out clips", flush=True)
        out[name] = {"mode": v["mode"], "models": v["models"], "quality": _quality(avatar, clips, kw)}
        print(f"[{name}] openness corr. {out[name]['quality']['openness_corr']:.4f}, identity SSIM "
              f"{out[name]['quality']['identity_ssim']:.4f}", flush=True)
    runs = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, v in variants.items():
            kw = {"backend": v["backend"], "onnx_dir": v["onnx_dir"]}
            runs[name].append(measure_steady(avatar, audio, "cpu", args.torch_threads, 10, graph_kw=kw))
            print(f"[{name}] speed round {r + 1}: {runs[name][-1]['fps']:.1f} fps", flush=True)
    for name in variants:
        out[name]["speed"] = _speed(runs[name])
    return out


def summary_lines(result: dict) -> list[str]:
    ref = result["variants"]["fp32"]
    lines = [f"device {result['device']}, load {result['load_average_1_5_15min']}"]
    for name, v in result["variants"].items():
        q, s = v["quality"], v["speed"]
        lines.append(f"{name:>14}: openness corr. {q['openness_corr']:.4f} ({q['openness_corr'] - ref['quality']['openness_corr']:+.4f}), "
                     f"identity SSIM {q['identity_ssim']:.4f} ({q['identity_ssim'] - ref['quality']['identity_ssim']:+.4f}), "
                     f"{s['fps']:.1f} fps; p50 ms " + ", ".join(f"{k} {t:.2f}" for k, t in s["stage_p50_ms"].items()
                                                                if k in STAGE.values()))
    for mode, d in result["decisions"].items():
        for model, why in d["why"].items():
            lines.append(f"{mode} {model}: {why}")
    lines.append("decision: " + result["decision"]["summary"])
    return lines


def figure(result: dict, plt):
    """Per variant: quality change vs float32 (openness corr., identity SSIM) and the stages' p50."""
    names = list(result["variants"])
    ref = result["variants"]["fp32"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    ax = axes[0]
    xs = np.arange(len(names))
    d_open = [result["variants"][n]["quality"]["openness_corr"] - ref["quality"]["openness_corr"] for n in names]
    d_ssim = [result["variants"][n]["quality"]["identity_ssim"] - ref["quality"]["identity_ssim"] for n in names]
    ax.bar(xs - 0.2, d_open, 0.4, label="openness corr. − float32", color="#4477aa")
    ax.bar(xs + 0.2, d_ssim, 0.4, label="identity SSIM − float32", color="#ee6677")
    tol = result["settings"]["tolerance"]
    ax.axhline(-tol, color="k", ls="--", lw=0.8, label=f"−{tol:g}: the most int8 may lose")
    ax.axhline(0, color="#999999", lw=0.5)
    ax.set_xticks(xs, names, rotation=30, fontsize=8)
    ax.set_title(f"quality vs float32 ORT ({len(result['settings']['clips'])} held-out clips)", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1]
    stages = list(STAGE.values())
    width = 0.8 / len(stages)
    for j, s in enumerate(stages):
        ax.bar(xs + (j - 1) * width, [result["variants"][n]["speed"]["stage_p50_ms"][s] for n in names], width,
               label=s, color=f"C{j}")
    ax.set_xticks(xs, names, rotation=30, fontsize=8)
    ax.set_ylabel("ms per process() call, p50")
    ax.set_title(f"stage p50 — {result['device']}; decision: {result['decision']['summary']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["add_arguments", "run", "figure", "summary_lines", "STAGE"]
