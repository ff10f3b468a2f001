"""Phonemes → mouth shapes: a viseme table and coarticulation.

Each eSpeak phoneme maps to a viseme target of four mouth parameters:

==========  =====================================================================
jaw_open    0 = lips together .. 1 = wide open, as in "father"
lip_width   -1 = narrow, puckered .. 0 = neutral .. 1 = stretched, as in "see"
lip_round   0 = flat .. 1 = rounded / protruded, as in "who"
teeth       0 = hidden .. 1 = clearly visible: inner-mouth darkness with a teeth band
==========  =====================================================================

Diphthongs glide between two targets.
Coarticulation follows the dominance model of Cohen & Massaro, 1993.
Every phoneme pulls the mouth toward its target.
Its weight decays exponentially away from the phoneme's centre.
The shape at time t is the weighted mean.
Bilabials (p, b, m) dominate strongly, so the lips really close.
h and the alveolars barely dominate, so they take the shape of neighbouring vowels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PARAMS = ("jaw_open", "lip_width", "lip_round", "teeth")
REST = (0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Viseme:
    """A mouth target in ``PARAMS`` order, and an optional second target that diphthongs glide to.

    ``strength`` is the dominance, 0..1. ``reach_ms`` is how far its influence extends.
    """

    target: tuple[float, float, float, float]
    glide_to: tuple[float, float, float, float] | None = None
    strength: float = 0.5
    reach_ms: float = 45.0


def _v(jaw, width, rnd, teeth, strength=0.5, reach=45.0, glide=None):
    return Viseme((jaw, width, rnd, teeth), glide, strength, reach)


_A = (0.85, 0.15, 0.0, 0.45)  # "father"
_AE = (0.75, 0.35, 0.0, 0.5)  # "cat"
_E = (0.55, 0.4, 0.0, 0.55)  # "bed"
_I = (0.3, 0.7, 0.0, 0.65)  # "see"
_IH = (0.35, 0.45, 0.0, 0.55)  # "sit"
_SCHWA = (0.4, 0.05, 0.0, 0.35)
_O = (0.65, -0.35, 0.65, 0.2)  # "thought"
_OH = (0.5, -0.45, 0.75, 0.15)  # "go"
_U = (0.25, -0.65, 0.95, 0.05)  # "who"
_UH = (0.35, -0.35, 0.55, 0.15)  # "book"
_V = (0.6, 0.1, 0.0, 0.4)  # "cup"

# eSpeak NG (English) phoneme mnemonics → visemes.
VISEMES: dict[str, Viseme] = {
    # pauses
    "_": _v(*REST, strength=0.7, reach=60), "_:": _v(*REST, strength=0.9, reach=80),
    "_!": _v(*REST, strength=0.7, reach=60), "_|": _v(*REST, strength=0.7, reach=60),
    # bilabials: lips closed, strongly dominant
    "p": _v(0.0, 0.0, 0.0, 0.0, 1.0, 30), "b": _v(0.0, 0.0, 0.0, 0.0, 1.0, 30), "m": _v(0.0, 0.0, 0.0, 0.0, 1.0, 30),
    # labiodentals: lower lip to upper teeth
    "f": _v(0.12, 0.1, 0.0, 0.8, 0.85, 30), "v": _v(0.12, 0.1, 0.0, 0.8, 0.85, 30),
    # dentals
    "T": _v(0.2, 0.15, 0.0, 0.85, 0.6, 35), "D": _v(0.2, 0.15, 0.0, 0.85, 0.5, 35),
    # alveolars: take the vowel's shape
    "t": _v(0.2, 0.2, 0.0, 0.6, 0.35), "d": _v(0.2, 0.2, 0.0, 0.6, 0.35), "n": _v(0.2, 0.15, 0.0, 0.5, 0.3),
    "l": _v(0.3, 0.15, 0.0, 0.5, 0.3), "s": _v(0.12, 0.35, 0.0, 0.95, 0.6, 35),
    "z": _v(0.12, 0.35, 0.0, 0.95, 0.6, 35),
    # postalveolars: slightly rounded, teeth showing
    "S": _v(0.18, -0.25, 0.6, 0.75, 0.7, 35), "Z": _v(0.18, -0.25, 0.6, 0.75, 0.7, 35),
    "tS": _v(0.18, -0.25, 0.6, 0.75, 0.7, 35), "dZ": _v(0.18, -0.25, 0.6, 0.75, 0.7, 35),
    "r": _v(0.2, -0.25, 0.5, 0.3, 0.5), "j": _v(0.2, 0.45, 0.0, 0.5, 0.35),
    "w": _v(0.12, -0.7, 0.95, 0.0, 0.85, 40),
    # velars, glottals: follow the vowels
    "k": _v(0.3, 0.1, 0.0, 0.35, 0.25), "g": _v(0.3, 0.1, 0.0, 0.35, 0.25), "N": _v(0.25, 0.1, 0.0, 0.3, 0.25),
    "x": _v(0.3, 0.1, 0.0, 0.3, 0.25), "h": _v(0.35, 0.0, 0.0, 0.3, 0.1), "?": _v(0.2, 0.0, 0.0, 0.2, 0.2),
    # monophthongs
    "a": _v(*_AE), "a#": _v(*_A), "a2": _v(*_SCHWA), "aa": _v(*_A), "A:": _v(*_A), "A@": _v(*_A), "A#": _v(*_A),
    "@": _v(*_SCHWA, strength=0.4), "@2": _v(*_SCHWA, strength=0.4), "@5": _v(*_SCHWA, strength=0.4),
    "@L": _v(*_SCHWA, strength=0.4), "3": _v(*_SCHWA), "3:": _v(0.4, 0.1, 0.2, 0.35),
    "e": _v(*_E), "E": _v(*_E), "E2": _v(*_E), "i": _v(*_I), "i:": _v(*_I), "I": _v(*_IH), "I#": _v(*_IH),
    "I2": _v(*_IH), "0": _v(*_O), "O": _v(*_O), "O:": _v(*_O), "O@": _v(*_O), "o@": _v(*_OH),
    "u:": _v(*_U), "U": _v(*_UH), "V": _v(*_V),
    # diphthongs
    "aI": _v(*_A, glide=_I), "aU": _v(*_A, glide=_U), "eI": _v(*_E, glide=_I), "oU": _v(*_OH, glide=_U),
    "OI": _v(*_O, glide=_I), "i@": _v(*_I, glide=_SCHWA), "e@": _v(*_E, glide=_SCHWA),
    "U@": _v(*_UH, glide=_SCHWA), "aI@": _v(*_A, glide=_SCHWA), "aU@": _v(*_A, glide=_SCHWA),
}

_VOWEL_FALLBACK = _v(*_SCHWA)
_CONSONANT_FALLBACK = _v(0.2, 0.1, 0.0, 0.4, 0.3)


def viseme_for(phoneme: str) -> Viseme:
    """The viseme of an eSpeak phoneme mnemonic.

    Stress marks and eSpeak's variant suffixes fall back to the base phoneme: ``t#``, ``n-``, ``l/``, ``r-``,
    ``@2``...
    Unknown names fall back to a neutral vowel or consonant shape.
    """
    name = phoneme.strip().lstrip("'\",%=")
    if name in VISEMES:
        return VISEMES[name]
    for cut in range(len(name) - 1, 0, -1):
        if name[:cut] in VISEMES:
            return VISEMES[name[:cut]]
    if name.startswith("_") or not name:
        return VISEMES["_"]
    return _VOWEL_FALLBACK if any(c in "aeiouAEIOUV@30" for c in name) else _CONSONANT_FALLBACK


def mouth_curves(phonemes: list[tuple[float, str]], end_ms: float, times_ms: np.ndarray) -> np.ndarray:
    """Coarticulated mouth parameters at ``times_ms``.

    Args:
        phonemes: ``(start_ms, name)`` in time order. Each lasts until the next one starts; the last until ``end_ms``.
        end_ms: end of the utterance in ms. Outside ``[first start, end_ms]`` the mouth is at rest.
        times_ms: ``float [N]`` query times in ms.
    Returns:
        ``float32 [N, 4]`` in ``PARAMS`` order.
    """
    t = np.asarray(times_ms, dtype=np.float64)
    targets, centres, strengths, reaches = [], [], [], []

    def add(target, centre, strength, reach):
        targets.append(target)
        centres.append(centre)
        strengths.append(strength)
        reaches.append(reach)

    if phonemes:
        add(REST, phonemes[0][0] - 60.0, 1.0, 60.0)  # lips closed before the first sound
        add(REST, end_ms + 60.0, 1.0, 60.0)
    for i, (start, name) in enumerate(phonemes):
        stop = phonemes[i + 1][0] if i + 1 < len(phonemes) else end_ms
        dur = max(stop - start, 10.0)
        vis = viseme_for(name)
        reach = max(vis.reach_ms, 0.5 * dur)
        if vis.glide_to is None:
            add(vis.target, start + 0.5 * dur, vis.strength, reach)
        else:
            add(vis.target, start + 0.3 * dur, vis.strength, 0.6 * reach)
            add(vis.glide_to, start + 0.8 * dur, vis.strength, 0.6 * reach)
    if not targets:
        return np.zeros((len(t), len(PARAMS)), np.float32)
    T = np.asarray(targets)  # [P, 4]
    c, a, r = np.asarray(centres), np.asarray(strengths), np.asarray(reaches)
    w = a[None, :] * np.exp(-np.abs(t[:, None] - c[None, :]) / r[None, :])  # [N, P]
    w = w + 1e-12
    out = (w @ T) / w.sum(axis=1, keepdims=True)
    outside = (t < phonemes[0][0] - 120.0) | (t > end_ms + 120.0) if phonemes else np.ones(len(t), bool)
    out[outside] = REST
    return out.astype(np.float32)
