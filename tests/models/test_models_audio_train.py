"""Training the audio encoder to predict mouth parameters (models/audio/train.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from framegraph.models.audio import AudioEncoder, default_encoder, extract_features
from framegraph.models.audio.train import clip_tensors, correlations, load_clip_targets, train_audio_encoder

FPS = 25


def small_encoder(seed=0) -> AudioEncoder:
    return default_encoder(seed, channels=32, feature_dim=32, dilations=(1, 2, 4))


def syllable_clip(seed: int, seconds: float = 4.0):
    """A voiced 'syllable' signal whose loudness follows a random smooth envelope; the target mouth
    parameter of each video frame is that envelope at the frame's time (what a jaw does with speech)."""
    rng = np.random.default_rng(seed)
    sr = 16000
    n = int(seconds * sr)
    knots = rng.uniform(0, 1, size=int(seconds * 5) + 2) * (rng.uniform(size=int(seconds * 5) + 2) > 0.3)
    env = np.interp(np.arange(n) / sr, np.linspace(0, seconds, len(knots)), knots)
    f0 = rng.uniform(100, 220)
    t = np.arange(n) / sr
    voice = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in range(1, 8))
    audio = (0.2 * 32767 * env * voice / 2.6).astype(np.int16)
    frames = int(seconds * FPS)
    target = torch.tensor(np.interp((np.arange(frames) + 0.5) / FPS, t, env), dtype=torch.float32)[:, None]
    return audio, target


def test_the_training_windows_give_the_features_extract_features_gives():
    enc = small_encoder()
    audio, target = syllable_clip(0, 2.0)
    clip = clip_tensors(enc, audio, FPS, target)
    with torch.no_grad():
        full = enc(clip.mel[None])[0][:, clip.index].T
    assert torch.allclose(full, extract_features(enc, audio, FPS)[:full.shape[0]], atol=1e-5)


def test_the_encoder_learns_what_the_mouth_does_and_generalises(tmp_path):
    enc = small_encoder()
    clips = [clip_tensors(enc, a, FPS, y, name=f"c{s}") for s, (a, y) in ((s, syllable_clip(s)) for s in range(7))]
    report = train_audio_encoder(clips, tmp_path, model=enc, steps=120, batch=8, window=25, lr=3e-3, holdout=2,
                                 progress=False)
    before, after = report["heldout_before"]["corr"][0], report["heldout_after"]["corr"][0]
    assert after > 0.7 and after > (before or 0) + 0.2, (before, after)
    assert report["loss_last"] < 0.5 * report["loss_first"]
    saved = json.loads((tmp_path / "train_report.json").read_text())
    assert saved["heldout_after"]["corr"][0] == after
    again = AudioEncoder.from_pretrained(tmp_path)
    audio, _ = syllable_clip(99)
    assert torch.allclose(extract_features(again, audio, FPS), extract_features(enc, audio, FPS), atol=1e-6)
    assert torch.equal(clips[0].targets, syllable_clip(0)[1])  # the caller's targets are left as they were


def test_targets_come_from_ground_truth_json_and_bad_settings_are_refused(tmp_path):
    truth = {"frames": [{"jaw_open": 0.1 * i, "lip_width": 0.0, "lip_round": 0.2, "teeth": 0.3} for i in range(5)]}
    y = load_clip_targets(truth)
    assert y.shape == (5, 4) and abs(float(y[3, 0]) - 0.3) < 1e-6
    assert load_clip_targets({"frames": [{"index": 0}]}) is None  # a user's video: no mouth ground truth
    with pytest.raises(ValueError, match="no clips"):
        train_audio_encoder([], tmp_path, model=small_encoder())
    with pytest.raises(ValueError, match="steps=0"):
        audio, y = syllable_clip(0, 1.0)
        train_audio_encoder([clip_tensors(small_encoder(), audio, FPS, y)], tmp_path, model=small_encoder(), steps=0)
    assert correlations(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[2.0], [4.0], [7.0]]))[0] > 0.95
