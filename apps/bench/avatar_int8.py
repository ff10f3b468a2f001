"""int8 against float32 ONNX Runtime, per model of the shipped avatar: speed and quality, and the decision.

    framegraph bench avatar_int8 --out benchmarks/results/cpu/avatar_int8.json

For each ``--modes`` entry, the shipped bundle is exported and quantized into a temporary folder. The modes are
``static`` and ``dynamic``, from ``models/avatar/int8.py``. Then each model is run **alone** in int8, the others
in float32. The models are the audio encoder, the DiT and the VAE decoder. Each is compared with the float32
ORT export:

- **quality**: ``avatar eval``'s openness correlation and identity SSIM. Openness compares the generated mouth
  with the ground-truth jaw. Identity compares with the portrait outside the mouth. Both use held-out
  synthetic clips, ``--clips``. The default is the three clips of
  ``avatar synth --clips 3 --seconds 6 --seed 1000``. Those are the shipped figures' clips; see the bundle's
  PROVENANCE.md. The figures are means over the clips, from ``models/avatar/eval/synthetic.py`` with
  ``real_measures=False``.
- **speed, per model**: the float32 and the int8 session of each of the model's files run *side by side*.
  They take turns call by call, on the same inputs. The inputs are recorded from the float32 stages on
  ``--seconds`` of speech, with :func:`~framegraph.models.avatar.int8.record_inputs`. Each uses ``--threads``
  intra-op threads. It records p50 per call, and the model's time per video frame. That is p50 × calls per
  frame, summed over its files. Taking turns keeps the comparison fair on a machine whose load changes.
- **speed, in the graph**: ``bench avatar``'s steady run of each variant, with speech pushed at once on a fast
  clock. It records FPS and per-stage ``process()`` p50. The variants take turns, ``--rounds`` times, and the
  figures are medians. These move with the machine's load more than the side-by-side figures do.

A model keeps int8 when both quality figures stay within 0.01 of float32. It must also take less time per
frame. See :func:`~framegraph.models.avatar.int8.choose_int8`. The decision, mode and models, is what
``framegraph export --int8`` uses by default. It is ``quantize.DEFAULT_MODE`` / ``DEFAULT_INT8``, which the tests
check against this JSON. When more than one model holds, they are measured together too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

from framegraph.models.avatar import RunSettings, load_avatar
from framegraph.models.avatar.eval.synthetic import evaluate_avatar
from framegraph.models.avatar.int8 import (
    MODES,
    TOLERANCE,
    choose_int8,
    quantize_export,
    record_inputs,
    variant_dir,
)
from framegraph.models.avatar.portrait.onnx import MODELS, PARTS, export_avatar
from framegraph.models.onnx import OrtGraph
from framegraph.models.onnx.quantize import FeedReader
from framegraph.models.synth import load_portrait, make_clip

from .avatar import _shown_path
from .avatar_measure import measure_steady
from .meta import bench_metadata, write_result
from .speech import speech

STAGE = {"audio": "audio_features", "dit": "denoiser", "vae": "vae_decode"}  # the stage each model runs in

QUALITY_MEASURE = ("avatar eval (models/avatar/eval/synthetic.py, real_measures=False): openness_corr and "
                   "identity_ssim, means over the clips")
SPEED_MEASURE = {
    "side_by_side": "float32 and int8 session of each file in turns call by call on the inputs "
    "recorded from the float32 stages; p50 per call; per model: p50 x calls "
    "per frame summed over its files (the decision's figure)",
    "graph": "bench avatar's steady run per variant (fast clock, speech at once): FPS and "
    "per-stage process() p50, median over the rounds",
}


def _clips(args, tmp: str) -> list[tuple[str, str]]:
    folder = args.clips
    if folder is None:
        folder = os.path.join(tmp, "heldout")
        portrait = load_portrait()
        for i in range(args.clip_count):
            make_clip(folder, i, seconds=6.0, fps=25, portrait=portrait, seed=1000)
    pairs = []
    for i in range(args.clip_count):
        stem = os.path.join(folder, f"clip_{i:05d}")
        if not (os.path.isfile(stem + ".mp4") and os.path.isfile(stem + ".json")):
            raise ValueError(
                f"--clips {folder!r}: {stem}.mp4 / .json missing (expected `framegraph avatar synth` "
                f"output with at least {args.clip_count} clips)"
            )
        pairs.append((stem + ".mp4", stem + ".json"))
    return pairs


def _quality(avatar, clips, kw: dict) -> dict:
    per = []
    for clip, truth in clips:
        m = evaluate_avatar(avatar, clip, truth, RunSettings(**kw), real_measures=False)
        per.append(
            {
                "clip": os.path.basename(clip),
                "openness_corr": m["openness_corr"],
                "identity_ssim": m["identity_ssim"],
                "identity_psnr_db": m["identity_psnr_db"],
            }
        )
    return {
        "openness_corr": float(np.mean([p["openness_corr"] for p in per])),
        "identity_ssim": float(np.mean([p["identity_ssim"] for p in per])),
        "per_clip": per,
    }


def _speed(runs: list[dict]) -> dict:
    """Medians over the rounds: FPS and each stage's p50 (ms)."""
    stages = runs[0]["stages_host_ms"].keys()
    return {
        "fps": float(np.median([r["fps"] for r in runs])),
        "stage_p50_ms": {s: float(np.median([r["stages_host_ms"][s]["p50_ms"] for r in runs])) for s in stages},
        "rounds": [
            {"fps": r["fps"], "stage_p50_ms": {s: r["stages_host_ms"][s]["p50_ms"] for s in stages}} for r in runs
        ],
    }


def run(args: argparse.Namespace) -> int:
    modes = _modes(args)
    result = bench_metadata("avatar_int8")
    avatar = load_avatar(args.avatar)
    audio, audio_info = speech(args.seconds, seed=0)
    with tempfile.TemporaryDirectory(prefix="fg-bench-int8-") as tmp:
        clips = _clips(args, tmp)
        fp32 = os.path.join(tmp, "fp32")
        export_avatar(avatar, fp32)
        variants, quantize_s = _variants(avatar, tmp, fp32, modes)
        feeds = record_inputs(avatar, fp32, audio)
        frames = len(feeds["dit_commit"]) * avatar.chunk_frames
        side = {
            mode: side_by_side(fp32, os.path.join(tmp, mode), feeds, frames, args.torch_threads, args.repeats)
            for mode in modes
        }
        measured = _measure(avatar, variants, clips, audio, args)
        decisions = _decisions(modes, measured, side)
        best = max(modes, key=lambda m: len(decisions[m]["models"]))
        kept = decisions[best]["models"]
        if len(kept) > 1:  # the models that hold, together
            name = f"{best}:{'+'.join(kept)}"
            variants = {
                name: {
                    "backend": "onnx-int8",
                    "mode": best,
                    "models": kept,
                    "onnx_dir": variant_dir(os.path.join(tmp, best), os.path.join(tmp, "kept"), avatar, kept),
                }
            }
            measured.update(_measure(avatar, variants, clips, audio, args))
    result.update(
        {
            "avatar": _shown_path(args.avatar),
            "settings": _settings(args, modes, clips, audio_info),
            "quality_measure": QUALITY_MEASURE,
            "speed_measure": SPEED_MEASURE,
            "quantize_seconds": quantize_s,
            "side_by_side": side,
            "variants": measured,
            "decisions": decisions,
            "decision": _decision(best, kept),
        }
    )
    png = write_result(result, args.out, figure)
    for line in summary_lines(result):
        print(line)
    print(f"wrote {args.out} and {png}")
    return 0


def _modes(args: argparse.Namespace) -> list[str]:
    """The ``--modes`` asked for, checked, with ``--rounds`` and ``--clip-count``."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(f"--modes {args.modes!r}: expected a comma-separated list of {', '.join(MODES)}")
    if args.rounds < 1 or args.clip_count < 1:
        raise ValueError("--rounds and --clip-count must be >= 1")
    return modes


def _variants(avatar, tmp: str, fp32: str, modes: list[str]) -> tuple[dict, dict]:
    """The float32 export at ``fp32`` quantized whole per mode, into ``tmp``, and the variants measured.

    The variants are float32 and, per mode, each model alone in int8. Returns the variants and the seconds each
    mode's quantization took."""
    variants = {"fp32": {"backend": "onnx", "onnx_dir": fp32, "mode": None, "models": []}}
    quantize_s = {}
    for mode in modes:
        full = os.path.join(tmp, mode)
        shutil.copytree(fp32, full)
        t = time.perf_counter()
        quantize_export(avatar, full, mode, models=[], log=print)
        quantize_s[mode] = time.perf_counter() - t
        for model in STAGE:
            variants[f"{mode}:{model}"] = {
                "backend": "onnx-int8",
                "mode": mode,
                "models": [model],
                "onnx_dir": variant_dir(full, os.path.join(tmp, f"{mode}-{model}"), avatar, [model]),
            }
    return variants, quantize_s


def _decisions(modes: list[str], measured: dict, side: dict) -> dict:
    """Per mode, :func:`choose_int8` on each model's quality in int8 and its side-by-side time per frame."""
    decisions = {}
    for mode in modes:
        per = {
            model: {**measured[f"{mode}:{model}"]["quality"], "ms_per_frame": side[mode]["ms_per_frame"][model]}
            for model in STAGE
        }
        decisions[mode] = choose_int8(measured["fp32"]["quality"], per, TOLERANCE)
    return decisions


def _settings(args: argparse.Namespace, modes: list[str], clips, audio_info: dict) -> dict:
    """The result's ``settings``: what the run measured, and on what."""
    return {
        "modes": modes,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "torch_threads": args.torch_threads,
        "clips": [os.path.basename(c) for c, _ in clips],
        "clips_source": args.clips or "framegraph avatar synth --clips 3 --seconds 6 --seed 1000 (made by the bench)",
        "tolerance": TOLERANCE,
        "audio": {**audio_info, "seconds": args.seconds},
    }


def _decision(best: str, kept: list[str]) -> dict:
    """The result's ``decision``: the mode and the models kept in int8 (none: float32)."""
    return {
        "mode": best if kept else None,
        "models": kept,
        "summary": (
            f"int8 ({best}) kept for {', '.join(kept)}"
            if kept
            else "no model holds quality and speed in int8: the export's default keeps float32"
        ),
    }


def side_by_side(fp32_dir: str, int8_dir: str, feeds: dict, frames: int, threads: int, repeats: int) -> dict:
    """Each file's float32 and int8 sessions called in turns on the same recorded inputs.

    See the module docstring. Returns ``{"parts": {part: {...}}, "ms_per_frame": {model: {"fp32", "int8"}}}``."""
    with open(os.path.join(int8_dir, "manifest.json")) as f:
        manifest = json.load(f)
    parts = {}
    for part in PARTS:
        g32 = OrtGraph(os.path.join(fp32_dir, manifest["files"][part]["file"]), threads)
        g8 = OrtGraph(os.path.join(int8_dir, manifest["int8"]["files"][part]["file"]), threads)
        calls = FeedReader(feeds[part], limit=24).feeds
        times = {"fp32": [], "int8": []}
        for g in (g32, g8):
            g.session.run(None, calls[0])  # warm up
        for _ in range(repeats):
            for feed in calls:
                for key, g in (("fp32", g32), ("int8", g8)):
                    t = time.perf_counter()
                    g.session.run(None, feed)
                    times[key].append(1000 * (time.perf_counter() - t))
        parts[part] = {
            "calls_per_frame": len(feeds[part]) / frames,
            "calls_timed": len(times["fp32"]),
            **{f"{k}_p50_ms": float(np.median(v)) for k, v in times.items()},
        }
    per_frame = {
        m: {k: sum(parts[p][f"{k}_p50_ms"] * parts[p]["calls_per_frame"] for p in ps) for k in ("fp32", "int8")}
        for m, ps in MODELS.items()
    }
    return {"threads": threads, "frames_recorded": frames, "parts": parts, "ms_per_frame": per_frame}


def _graph_kw(variant: dict) -> dict:
    """The :class:`~framegraph.models.avatar.RunSettings` fields of a variant (its runtime, its export)."""
    return {"runtime": variant["backend"], "onnx_dir": variant["onnx_dir"]}


def _measure(avatar, variants: dict, clips, audio, args) -> dict:
    out = {}
    for name, v in variants.items():
        kw = _graph_kw(v)
        print(f"[{name}] quality on {len(clips)} held-out clips", flush=True)
        out[name] = {"mode": v["mode"], "models": v["models"], "quality": _quality(avatar, clips, kw)}
        print(
            f"[{name}] openness corr. {out[name]['quality']['openness_corr']:.4f}, identity SSIM "
            f"{out[name]['quality']['identity_ssim']:.4f}",
            flush=True,
        )
    runs = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, v in variants.items():
            kw = _graph_kw(v)
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
        lines.append(
            f"{name:>14}: openness corr. {q['openness_corr']:.4f} "
            f"({q['openness_corr'] - ref['quality']['openness_corr']:+.4f}), "
            f"identity SSIM {q['identity_ssim']:.4f} ({q['identity_ssim'] - ref['quality']['identity_ssim']:+.4f}), "
            f"{s['fps']:.1f} fps; p50 ms "
            + ", ".join(f"{k} {t:.2f}" for k, t in s["stage_p50_ms"].items() if k in STAGE.values())
        )
    for mode, side in result["side_by_side"].items():
        lines.append(
            f"{mode} side by side, ms per frame float32 → int8: "
            + ", ".join(f"{m} {v['fp32']:.2f} → {v['int8']:.2f}" for m, v in side["ms_per_frame"].items())
        )
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
    models = list(STAGE)
    modes = list(result["side_by_side"])
    xm = np.arange(len(models))
    width = 0.8 / (1 + len(modes))
    first = result["side_by_side"][modes[0]]["ms_per_frame"]
    ax.bar(xm, [first[m]["fp32"] for m in models], width, label="float32", color="#999999")
    for j, mode in enumerate(modes):
        ax.bar(
            xm + (j + 1) * width,
            [result["side_by_side"][mode]["ms_per_frame"][m]["int8"] for m in models],
            width,
            label=f"int8 {mode}",
            color=f"C{j}",
        )
    ax.set_xticks(xm + width * len(modes) / 2, [f"{m} ({STAGE[m]})" for m in models], fontsize=8)
    ax.set_ylabel("session ms per video frame (p50, side by side)")
    ax.set_title(f"{result['device']}; decision: {result['decision']['summary']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["run", "figure", "summary_lines", "STAGE"]
