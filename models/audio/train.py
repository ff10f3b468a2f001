"""Teach the audio encoder what the mouth does: ``train_audio_encoder(clips, out_dir, ...)``.

An untrained encoder gives the denoiser random projections of the log-mel.
The denoiser can still learn from them, but slowly and poorly.
Training clips may carry per-frame mouth parameters.
``framegraph avatar synth`` writes this ground truth: ``jaw_open``, ``lip_width``, ``lip_round``, ``teeth``.
The encoder is then first trained to predict them.
A linear head does the prediction and is thrown away afterwards::

    audio (16 kHz) ─▶ log-mel ─▶ AudioEncoder ─▶ features [T, D] (one per video frame, as extract_features)
                                                      └─▶ Linear(D, 4) ─▶ mouth parameters, MSE vs truth

The features are computed exactly as :func:`~.features.extract_features` computes them.
That means silence before the start, the same mel frame per video frame and the same look-ahead.
So what the encoder learns here is what the streaming stage gives the denoiser.
Windows of ``window`` video frames are cut at random from the clips.
Each window's audio gets a random gain of ``±gain_db`` and a little noise.
So loud, quiet and slightly noisy speech give the same features.

Output in ``out_dir``: the encoder, saved with ``save_pretrained``, and ``train_report.json``.
The report holds the held-out correlation of the head's prediction with the truth, per parameter.
It says how much of the mouth the audio features explain.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from framegraph.stream.files import write_json
from framegraph.stream.quality import pearson

from ..training import REPORT
from .encoder import AudioEncoder
from .features import FrameTiming, as_float_audio

MOUTH_PARAMS = ("jaw_open", "lip_width", "lip_round", "teeth")


@dataclass
class AudioClip:
    """One clip's training tensors.

    ``mel float32 [n_mels, M]`` includes the silence prefix.
    Per video frame ``k``, ``index[k]`` is the encoder output column of its features.
    ``targets[k]`` is ``[P]``.
    """

    name: str
    mel: torch.Tensor
    index: torch.Tensor
    targets: torch.Tensor


def clip_tensors(model: AudioEncoder, samples, fps, targets: torch.Tensor, name: str = "clip") -> AudioClip:
    """Log-mel of a whole clip with the silence prefix, and the output column of each video frame."""
    timing = FrameTiming.of(model, fps)
    x = as_float_audio(samples)
    k = min(timing.n_frames(len(x)), targets.shape[0])
    if k == 0:
        raise ValueError(f"{name}: no video frames with audio")
    need = timing.required_samples(k - 1)
    x = torch.nn.functional.pad(x, (0, max(0, need - len(x))))[:need]
    with torch.no_grad():
        mel = torch.cat([model.silence(model.receptive_field - 1), model.mel(x)], dim=1)
    index = torch.tensor([timing.mel_index(i) for i in range(k)])
    return AudioClip(name, mel.float(), index, targets[:k].float())


def _windows(clips: list[AudioClip], model: AudioEncoder, batch: int, window: int, gen: torch.Generator):
    """Random windows → mel ``[B, n_mels, L]``, columns ``[B, W]`` into each window's output, targets ``[B, W, P]``.
    """
    r = model.receptive_field
    lengths = torch.tensor([c.targets.shape[0] for c in clips], dtype=torch.float64)
    w = int(min(window, lengths.min().item()))
    picks = torch.multinomial(lengths, batch, replacement=True, generator=gen).tolist()
    mels, cols, ys = [], [], []
    span = None
    for i in picks:
        c = clips[i]
        s = int(torch.randint(0, c.targets.shape[0] - w + 1, (1,), generator=gen))
        lo = int(c.index[s])  # first output column of the window = first padded mel column it needs
        hi = int(c.index[s + w - 1]) + r  # one past the last padded mel column
        mels.append(c.mel[:, lo:hi])
        cols.append(c.index[s:s + w] - lo)
        ys.append(c.targets[s:s + w])
        span = max(span or 0, hi - lo)
    mel = torch.stack([torch.nn.functional.pad(m, (0, span - m.shape[1]), value=float(m[0, -1])) for m in mels])
    return mel, torch.stack(cols), torch.stack(ys)


def _augment_mel(model: AudioEncoder, mel: torch.Tensor, gen: torch.Generator, gain_db: float,
                 noise_db: float) -> torch.Tensor:
    """A random gain per window and a noise floor ``noise_db`` below full scale.

    The gain adds ``2·log(gain)`` to the log power. The noise is mixed in the power domain.
    This is what a quieter, louder or noisier microphone does to log-mel.
    """
    b = mel.shape[0]
    gain = (torch.rand(b, 1, 1, generator=gen) * 2 - 1) * gain_db
    shifted = mel + gain * math.log(10) / 10  # log power: +g dB = +g/10·ln 10
    floor = math.log(10 ** (-noise_db / 10)) + torch.rand(b, 1, 1, generator=gen) * 2.0
    return torch.logaddexp(shifted, floor.expand_as(shifted))


def correlations(pred: torch.Tensor, truth: torch.Tensor) -> list[float | None]:
    """Pearson correlation per parameter of ``[N, P]`` predictions vs truth. None where constant."""
    return [pearson(pred[:, j], truth[:, j], digits=4) for j in range(truth.shape[1])]


def _predict(model: AudioEncoder, head: torch.nn.Linear, clip: AudioClip) -> torch.Tensor:
    out = model(clip.mel[None])[0]  # [D, M]
    return head(out[:, clip.index].T)


def train_audio_encoder(clips: list[AudioClip], out_dir, *, model: AudioEncoder, steps: int = 400,
                        batch: int = 16, window: int = 50, lr: float = 2e-3, gain_db: float = 12.0,
                        noise_db: float = 60.0, holdout: int = 1, seed: int = 0,
                        progress: bool = True) -> dict:
    """Train ``model`` in place to predict the clips' mouth parameters. Write it and a report to ``out_dir``.

    The last ``holdout`` clips are kept out and measured. Returns the report.
    """
    from tqdm import tqdm

    if not clips:
        raise ValueError("train_audio_encoder: no clips")
    if steps < 1 or batch < 1 or window < 1:
        raise ValueError(f"train_audio_encoder: steps={steps}, batch={batch}, window={window} must be >= 1")
    n_held = holdout if 0 < holdout < len(clips) else 0
    all_y = torch.cat([c.targets for c in clips[:len(clips) - n_held]])
    mean, std = all_y.mean(0), all_y.std(0).clamp_min(1e-3)
    scaled = [replace(c, targets=(c.targets - mean) / std) for c in clips]  # unit-variance targets
    train, held = scaled[:len(scaled) - n_held], scaled[len(scaled) - n_held:]
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = torch.nn.Linear(model.feature_dim, all_y.shape[1])
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)

    def evaluate() -> dict:
        if not held:
            return {}
        model.eval()
        with torch.no_grad():
            pred = torch.cat([_predict(model, head, c) for c in held])
        truth = torch.cat([c.targets for c in held])
        model.train()
        return {"mse": round(float((pred - truth).pow(2).mean()), 4), "corr": correlations(pred, truth)}

    t0 = time.monotonic()
    before = evaluate()
    model.train()
    history = []
    bar = tqdm(range(steps), desc="train audio encoder", disable=not progress, dynamic_ncols=True)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr * (step + 1) / 20 if step < 20 else lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        mel, cols, y = _windows(train, model, batch, window, gen)
        mel = _augment_mel(model, mel, gen, gain_db, noise_db)
        feats = model(mel)  # [B, D, L - r + 1]
        picked = torch.gather(feats, 2, cols[:, None, :].expand(-1, feats.shape[1], -1)).transpose(1, 2)
        loss = (head(picked) - y).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append(round(float(loss.detach()), 5))
        bar.set_postfix(loss=f"{history[-1]:.4f}")
    bar.close()
    model.eval().requires_grad_(False)
    after = evaluate()
    report = {"steps": steps, "batch": batch, "window_frames": window, "lr": lr, "gain_db": gain_db,
              "noise_db": noise_db, "seed": seed, "params": list(MOUTH_PARAMS)[:all_y.shape[1]],
              "train_clips": len(train), "heldout_clips": len(held),
              "heldout_before": before, "heldout_after": after,
              "loss_first": round(sum(history[:10]) / len(history[:10]), 4),
              "loss_last": round(sum(history[-10:]) / len(history[-10:]), 4),
              "seconds": round(time.monotonic() - t0, 1)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write_json(out / REPORT, report)
    return report


def load_clip_targets(truth: dict, params=MOUTH_PARAMS) -> torch.Tensor | None:
    """``float32 [T, P]`` mouth parameters from a clip's ground-truth JSON, or None when it has none."""
    frames = truth.get("frames") or []
    if not frames or any(p not in frames[0] for p in params):
        return None
    return torch.tensor(np.array([[float(f.get(p, 0.0)) for p in params] for f in frames], np.float32))


__all__ = ["MOUTH_PARAMS", "AudioClip", "clip_tensors", "correlations", "train_audio_encoder", "load_clip_targets"]
