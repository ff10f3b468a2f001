"""Evaluate an avatar on a clip it was not trained on: ``evaluate_avatar(avatar, clip, truth)``.

**Mouth openness in a frame** (:func:`mouth_openness`): inside the *search box* — the portrait's rest
mouth box (ground truth / bundle) widened by 15 % each side and grown downwards by the largest jaw drop
the renderer draws (0.32 × mouth width) plus the head-motion margin — count the *inner-mouth* pixels:
luminance below ``dark_fraction`` (0.55) of the median luminance of the same box in the reference
portrait (lips and skin are far brighter than the open mouth's cavity). Openness = inner-mouth pixels
/ mouth width in px, i.e. the mean vertical extent (px) of the dark opening per column of the mouth.
It needs no model; :func:`estimator_check` shows on the real clip itself how well it tracks the ground
truth ``jaw_open`` (the ``estimator_corr`` number of the report).

**Metrics** (JSON): ``openness_corr`` — Pearson correlation of the generated frames' openness with the
ground-truth ``jaw_open``; ``estimator_corr`` — the same estimator on the real clip's frames vs the
ground truth; ``silence`` — openness on frames whose ground truth is not ``speaking`` and whose jaw is
shut (``jaw_open < 0.05``), generated vs real, and the share of those generated frames with
openness ≤ the real clip's 95th percentile there + 0.5 px (``lips_closed_fraction``); ``identity_ssim``
— SSIM (7 px Gaussian window, on [-1, 1] RGB) between each generated frame and the reference portrait
inside the face crop box, outside the mouth search box, averaged over frames (the real clip's value,
which head motion and blinks also lower, is given as ``identity_ssim_real``).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from .bundle import Avatar

DARK_FRACTION = 0.55
MAX_JAW_DROP = 0.32


def _luma(frames: torch.Tensor) -> torch.Tensor:
    f = frames.float()
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def search_box(mouth_box, image_hw, margin: float = 4.0) -> tuple[int, int, int, int]:
    """Integer ``(x0, y0, x1, y1)`` where the mouth opening can be (see the module docstring)."""
    x, y, w, h = (float(v) for v in mouth_box)
    x0 = math.floor(x - 0.15 * w - margin)
    x1 = math.ceil(x + 1.15 * w + margin)
    y0 = math.floor(y - margin)
    y1 = math.ceil(y + h + MAX_JAW_DROP * w + 2 * margin)
    H, W = image_hw
    return max(0, x0), max(0, y0), min(W, x1), min(H, y1)


def mouth_openness(frames: torch.Tensor, mouth_box, reference: torch.Tensor, *,
                   dark_fraction: float = DARK_FRACTION) -> np.ndarray:
    """Per-frame openness (px) of ``frames uint8 [T, H, W, 3]``; ``mouth_box`` rest box (x, y, w, h) px,
    ``reference uint8 [H, W, 3]`` the portrait (sets the darkness threshold)."""
    x0, y0, x1, y1 = search_box(mouth_box, frames.shape[1:3])
    ref_l = _luma(reference[y0:y1, x0:x1])
    thr = dark_fraction * float(ref_l.median())
    dark = (_luma(frames[:, y0:y1, x0:x1]) < thr).float()
    return (dark.sum(dim=(1, 2)) / float(mouth_box[2])).numpy()


def pearson(a, b) -> float | None:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def identity_ssim(frames: torch.Tensor, reference: torch.Tensor, crop_box, mouth_box) -> np.ndarray:
    """Per-frame SSIM vs ``reference`` inside ``crop_box``, outside the mouth search box."""
    from framegraph.models.vae import ssim_map, uint8_to_frames

    x, y, s, _ = (int(v) for v in crop_box)
    a = uint8_to_frames(frames[:, y:y + s, x:x + s])
    b = uint8_to_frames(reference[y:y + s, x:x + s])[None].expand_as(a)
    out = []
    win = 7
    mask = torch.ones(s, s)
    mx0, my0, mx1, my1 = search_box(mouth_box, reference.shape[:2])
    mask[max(0, my0 - y):max(0, my1 - y), max(0, mx0 - x):max(0, mx1 - x)] = 0.0
    mask = mask[win // 2:s - win // 2, win // 2:s - win // 2]  # valid-convolution centres
    for i in range(0, a.shape[0], 16):
        m = ssim_map(a[i:i + 16].contiguous(), b[i:i + 16].contiguous()).mean(dim=1)  # [N, s-6, s-6]
        out.append(((m * mask).sum(dim=(1, 2)) / mask.sum()).numpy())
    return np.concatenate(out)


def generate_clip(avatar: Avatar, audio_path, out_mp4, *, steps: int | None = None, vad: bool | None = None,
                  seed: int = 0, progress: bool = False) -> dict:
    """Run the avatar graph on ``audio_path`` (any file with audio) into ``out_mp4``; returns
    ``read_video`` of the result."""
    from framegraph.stream.media import AudioFileSource, read_video

    from .graph import build_avatar_graph

    ag = build_avatar_graph(avatar, AudioFileSource(audio_path), out=os.fspath(out_mp4), steps=steps, vad=vad,
                            seed=seed)
    if progress:
        from framegraph.apps.runner import run_with_progress

        run_with_progress(ag.graph, ag.sink, None, desc="generate")
    else:
        ag.graph.run()
    return read_video(out_mp4)


def evaluate_avatar(avatar: Avatar, clip, truth, *, out_video=None, steps: int | None = None, seed: int = 0,
                    progress: bool = False) -> dict:
    """Generate from ``clip``'s audio and measure it against ``truth`` (see the module docstring)."""
    from framegraph.stream.media import read_video

    truth = json.loads(Path(truth).read_text()) if not isinstance(truth, dict) else truth
    frames_gt = truth.get("frames") or []
    if not frames_gt:
        raise ValueError(f"evaluate_avatar: the ground truth has no per-frame entries ('frames')")
    portrait = avatar.portrait
    mouth_box = avatar.mouth_box or (truth.get("portrait") or {}).get("mouth_box")
    if mouth_box is None:
        raise ValueError("evaluate_avatar: no mouth box in the bundle or the ground truth")
    real = torch.from_numpy(read_video(clip)["frames"])
    if tuple(real.shape[1:3]) != tuple(portrait.shape[:2]):
        raise ValueError(f"evaluate_avatar: the clip is {real.shape[2]}x{real.shape[1]} but the avatar's portrait is "
                         f"{portrait.shape[1]}x{portrait.shape[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        target = os.fspath(out_video) if out_video else os.path.join(tmp, "generated.mp4")
        gen_info = generate_clip(avatar, clip, target, steps=steps, seed=seed, progress=progress)
    gen = torch.from_numpy(gen_info["frames"])
    n = min(len(frames_gt), gen.shape[0], real.shape[0])
    jaw = np.array([float(f.get("jaw_open", 0.0)) for f in frames_gt[:n]])
    states = [f.get("state") for f in frames_gt[:n]]
    o_gen = mouth_openness(gen[:n], mouth_box, portrait)
    o_real = mouth_openness(real[:n], mouth_box, portrait)
    silent = np.array([s != "speaking" and j < 0.05 for s, j in zip(states, jaw)])
    sil = None
    if silent.any():
        limit = float(np.percentile(o_real[silent], 95)) + 0.5
        sil = {"frames": int(silent.sum()), "openness_generated_mean": round(float(o_gen[silent].mean()), 3),
               "openness_real_mean": round(float(o_real[silent].mean()), 3), "closed_limit_px": round(limit, 3),
               "lips_closed_fraction": round(float((o_gen[silent] <= limit).mean()), 4)}
    speaking = ~silent
    ssim_gen = identity_ssim(gen[:n], portrait, avatar.crop_box, mouth_box)
    ssim_real = identity_ssim(real[:n], portrait, avatar.crop_box, mouth_box)
    r = lambda v: None if v is None else round(v, 4)  # noqa: E731
    return {
        "clip": os.fspath(clip), "frames": int(n), "frames_generated": int(gen.shape[0]),
        "audio_in_output": gen_info["audio"] is not None, "steps": steps or avatar.steps,
        "openness_estimator": "inner-mouth (dark) pixels / mouth width, px; see models/avatar/evaluate.py",
        "openness_corr": r(pearson(o_gen, jaw)), "estimator_corr": r(pearson(o_real, jaw)),
        "openness_corr_vs_real_estimate": r(pearson(o_gen, o_real)),
        "openness_generated_speaking_mean": round(float(o_gen[speaking].mean()), 3) if speaking.any() else None,
        "openness_real_speaking_mean": round(float(o_real[speaking].mean()), 3) if speaking.any() else None,
        "silence": sil, "identity_ssim": round(float(ssim_gen.mean()), 4),
        "identity_ssim_min": round(float(ssim_gen.min()), 4), "identity_ssim_real": round(float(ssim_real.mean()), 4),
    }


def estimator_check(clip, truth) -> dict:
    """The openness estimator on a real clip vs its ground truth (no model involved)."""
    from framegraph.stream.media import read_video

    truth = json.loads(Path(truth).read_text()) if not isinstance(truth, dict) else truth
    from framegraph.models.synth import load_portrait  # noqa: F401  (portrait geometry comes from the JSON)

    frames = torch.from_numpy(read_video(clip)["frames"])
    p = truth["portrait"]
    reference = frames[0] if p.get("name") != "astronaut" else None
    if reference is None:
        from framegraph.models.synth import astronaut_portrait

        reference = torch.from_numpy(np.array(astronaut_portrait().image, copy=True))
    n = min(len(truth["frames"]), frames.shape[0])
    jaw = [float(f["jaw_open"]) for f in truth["frames"][:n]]
    o = mouth_openness(frames[:n], p["mouth_box"], reference)
    return {"frames": n, "corr": pearson(o, jaw), "openness": o.tolist(), "jaw_open": jaw}


__all__ = ["DARK_FRACTION", "mouth_openness", "search_box", "pearson", "identity_ssim", "generate_clip",
           "evaluate_avatar", "estimator_check"]
