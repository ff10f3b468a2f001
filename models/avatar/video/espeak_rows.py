"""Typed text on a real person's avatar: eSpeak NG sentences whose mouth shapes are known from their phonemes.

The shape head learns from the person's own voice. Typed text reaches it as eSpeak NG's voice. That is the TTS of the
demo and of the Pipecat bot. Their video never held that voice. A regression answers speech it never heard with whatever
its weights make of it. On eSpeak its openness can run well above the person's own. So the head's fit also gets a few
eSpeak sentences as ``known`` rows (:func:`~.lipsync.fit_shape_head`). Their shapes are set from their phonemes:

    text ─▶ eSpeak NG ─▶ audio ─▶ what the head hears ─▶ features [T, D]
                    └─▶ phonemes ─▶ visemes' jaw [T] (mouth_curves) ─▶ standardised over the speech frames
                                    ─▶ × the person's speech-frame openness std + their mean ─▶ openness [T]

Frames the voice detector calls silent answer the rest shape. The other shape numbers follow openness along the person's
own lines (:func:`~.lipsync.openness_lines`). The check, :func:`typed_check`, measures the fitted head on other
sentences, the way a user meets it. It measures how well its openness follows their phonemes' jaw. It measures how wide
it opens. ``TYPED_SENTENCES`` is 6, chosen by measurement on two people. benchmarks/README.md has the figures.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from framegraph.models.audio import AudioEncoder
from framegraph.models.audio.features import extract_features
from framegraph.models.audio.per_frame import speech_per_frame
from framegraph.models.synth import mouth_curves
from framegraph.models.synth.espeak import EspeakError, EspeakNotFound, synthesize
from framegraph.models.synth.plan import VOICES, make_sentence
from framegraph.stream.quality import pearson

from .lipsync import ShapeHead, context_windows, openness_lines

TYPED_SENTENCES = 6  # eSpeak sentences in the shape head's fit (0: none)
CHECK_SENTENCES = 4  # other sentences the fitted head is measured on
CHECK_SEED = 7919  # their seed: not a training seed in practice (those are --seed, 0 by default)
RATES_WPM = (150, 165, 180)  # around the demo's 165

Hear = Callable[[np.ndarray, float], torch.Tensor]  # (audio int16 16 kHz, fps) -> features [T, D]


def hearing(hear) -> Hear:
    """``hear`` as a function of (audio, fps).

    An :class:`~framegraph.models.audio.AudioEncoder` is heard through
    :func:`~framegraph.models.audio.features.extract_features`."""
    if isinstance(hear, AudioEncoder):
        encoder = hear
        return lambda audio, fps: extract_features(encoder, audio, fps)
    return hear


def typed_sentences(hear: Hear, fps: float, count: int, seed: int) -> list[tuple[torch.Tensor, np.ndarray, np.ndarray]]:
    """``count`` random sentences in the demo's voices: ``(features [T, D], jaw [T] in 0..1, speech [T] bool)``.

    ``hear(audio int16, fps)`` gives the features the head reads, as ``VideoAvatar.hear`` does. An
    ``AudioEncoder`` is heard through :func:`~framegraph.models.audio.features.extract_features`."""
    hear = hearing(hear)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        said = synthesize(make_sentence(rng), voice=VOICES[i % len(VOICES)], rate_wpm=RATES_WPM[i % len(RATES_WPM)])
        with torch.no_grad():
            feats = hear(said.samples, fps)[:int(len(said.samples) / said.sample_rate * fps)]
        n = len(feats)
        times_ms = (np.arange(n) + 0.5) / fps * 1000.0
        jaw = mouth_curves([(e.time_ms, e.name) for e in said.phonemes], said.duration_ms, times_ms)[:, 0]
        out.append((feats, jaw.astype(np.float64), speech_per_frame(said.samples, n, fps) >= 0.5))
    return out


def speaking_range(shapes: torch.Tensor, speech: np.ndarray | None) -> tuple[float, float]:
    """The person's openness while they speak: mean and std.

    Openness is the first shape number of ``shapes [T, P]``, standardised. The frames are those where the voice
    detector hears speech. ``speech [≥ T]`` holds the probabilities; None means all frames."""
    o = shapes[:, 0].double().numpy()
    if speech is not None and (speaking := np.asarray(speech[:len(o)]) >= 0.5).sum() >= 25:
        o = o[speaking]
    return float(o.mean()), float(o.std())


def typed_rows(hear: Hear, shapes: torch.Tensor, speech: np.ndarray | None, rest: torch.Tensor,
               fps: float, *, sentences: int = TYPED_SENTENCES, seed: int = 0) -> tuple[list, dict]:
    """``known`` rows for :func:`~.lipsync.fit_shape_head` from ``sentences`` eSpeak sentences.

    They are on the scale of the person's training ``shapes [T, P]``. See the module docstring. Returns the rows
    ``[(features [T_i, D], shapes [T_i, P])]`` and a report. There are no rows when eSpeak NG is missing or
    ``sentences`` is 0. The report then says why."""
    if sentences <= 0:
        return [], {"sentences": 0}
    try:
        said = typed_sentences(hear, fps, sentences, seed)
    except (EspeakNotFound, EspeakError) as exc:
        return [], {"sentences": 0, "skipped": str(exc)}
    mean, std = speaking_range(shapes, speech)
    slope, intercept = openness_lines(shapes)
    jaw_speaking = np.concatenate([jaw[speaking] for _, jaw, speaking in said])
    if len(jaw_speaking) < 2:
        return [], {"sentences": 0, "skipped": "the voice detector heard no speech in eSpeak NG's sentences"}
    jaw_mean, jaw_std = jaw_speaking.mean(), max(jaw_speaking.std(), 1e-6)
    rows = []
    for feats, jaw, speaking in said:
        o = torch.from_numpy(mean + std * (jaw - jaw_mean) / jaw_std)[:, None]
        target = torch.cat([o, o * slope + intercept], 1).float()
        target[torch.from_numpy(~speaking)] = rest.float()
        rows.append((feats, target))
    return rows, {"sentences": sentences, "frames": sum(len(f) for f, _ in rows), "seed": seed,
                  "person_speaking_openness": {"mean": round(mean, 4), "std": round(std, 4)}}


def typed_check(head: ShapeHead, hear: Hear, fps: float, *, sentences: int = CHECK_SENTENCES,
                seed: int = CHECK_SEED) -> dict:
    """The head on eSpeak sentences it was not fitted on.

    Returns the correlation of its openness with their phonemes' jaw. Returns its openness mean and std over
    their speech frames. Those are in the person's standardised units, beside :func:`typed_rows`'
    ``person_speaking_openness``. Returns ``{}`` when eSpeak NG is missing."""
    try:
        said = typed_sentences(hear, fps, sentences, seed)
    except (EspeakNotFound, EspeakError):
        return {}
    k = head.config.context
    with torch.no_grad():
        pred = np.concatenate([head(context_windows(f, k))[:, 0].double().numpy() for f, _, _ in said])
    jaw = np.concatenate([j for _, j, _ in said])
    speaking = np.concatenate([s for _, _, s in said])
    return {"sentences": sentences, "frames": len(pred), "seed": seed,
            "openness_vs_phoneme_jaw_corr": pearson(pred, jaw, digits=4),
            "speaking_openness": {"mean": round(float(pred[speaking].mean()), 4),
                                  "std": round(float(pred[speaking].std()), 4)}}
