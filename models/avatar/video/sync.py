"""How late a video's sound is against its picture, measured from the person's own mouth.

A recording's sound and picture are not always in step: a phone's audio path, a re-encode, an edit can move
the sound by a few frames. Trained on such a video as it is, the audio → shape head must predict the mouth
from sound that has not come yet: on the desk address of ``docs/real_people.md`` (its sound 6 frames late)
the head's cross-validated openness correlation was 0.07 on the frames as recorded and 0.58 with the sound
moved 6 frames earlier.

:func:`estimate_av_offset` finds the shift from the training frames alone, from something that has no time of
its own: a mouth opens as the voice gets loud (vowels), so the measured openness is cross-correlated with the
sound's loudness per frame and the peak's lag is the offset — kept only where the peak is clear: it must beat
lag 0 by :data:`MIN_GAIN` and stand out of chance, i.e. beat :data:`CHANCE_QUANTILE` of the peaks the same two
signals give with the sound moved seconds away (every circular shift of at least :data:`CHANCE_SHIFT_S`). How
high a chance peak reaches depends on the clip's length and on how smooth the two signals are: 0.19-0.29 on the
20-s clips of ``docs/real_people.md``, less on longer videos, so a fixed threshold would either make lags up on
a short clip or miss a weak but certain one on a long one. (The head's own cross-validated fit is no such measure: its
causal features predict the mouth better from sound a few frames *later* even on a clip that is in step — the
synthetic astronaut's by 6 frames —, which live would show as a mouth that lags the voice.) The trainer fits
the head on the sound so aligned and the bundle records the offset; ``avatar eval`` aligns the source video's
held-out sound by it (the real frames are the mouth of the sound as it was spoken). Live, the head answers the
sound as it plays: no latency is added.
"""
from __future__ import annotations

import numpy as np
import torch

MAX_OFFSET_FRAMES = 10  # the latest sound searched for: 400 ms at 25 fps
MIN_OFFSET_FRAMES = -3  # ... and the earliest (sound ahead of the picture: rare)
MIN_GAIN = 0.1  # the openness-loudness correlation at the offset must beat the one at lag 0 by this much ...
CHANCE_QUANTILE = 0.99  # ... and this share of the peaks the signals reach with the sound moved far away
CHANCE_SHIFT_S = 2.0  # the least circular shift (s) of the sound that counts as "far away"
CHANCE_SHIFTS = 200  # at most this many shifts, evenly spaced
LOUDNESS_FLOOR_DB = -60.0  # quieter frames count as this loud (silence, whatever its hiss)


def shift_frames(x, lag: int):
    """Row ``t`` of the result is row ``t + lag`` of ``x [T, ...]`` (numpy or torch): ``lag`` > 0 for sound that
    comes ``lag`` frames late (its end repeated to keep ``T`` rows), < 0 for sound that comes early (its start
    repeated)."""
    idx = np.clip(np.arange(len(x)) + int(lag), 0, max(len(x) - 1, 0))
    return x[torch.from_numpy(idx)] if isinstance(x, torch.Tensor) else x[idx]


def shift_audio(samples: np.ndarray, lag: int, samples_per_frame: int) -> np.ndarray:
    """``samples [S]`` moved ``lag`` frames earlier (``lag`` > 0: the sound came late; silence fills the end) or
    later (``lag`` < 0: silence fills the start); the length is kept."""
    n = abs(int(lag)) * int(samples_per_frame)
    if lag == 0 or n == 0:
        return samples
    pad = np.zeros(min(n, len(samples)), samples.dtype)
    if lag > 0:
        return np.concatenate([samples[n:], pad])
    return np.concatenate([pad, samples[:len(samples) - n]])


def _corr_by_lag(openness: np.ndarray, level: np.ndarray, lags) -> dict[int, float]:
    """The correlation of ``openness [T]`` (NaN: no face) with ``level [T]`` moved by each lag (NaN where too
    few frames are left)."""
    scores = {}
    for lag in lags:
        b = shift_frames(level, int(lag))
        keep = np.isfinite(openness)
        if lag > 0:
            keep[len(openness) - lag:] = False  # no sound measured there
        elif lag < 0:
            keep[:-lag] = False
        ok = keep.sum() >= 10 and openness[keep].std() > 0 and b[keep].std() > 0
        scores[int(lag)] = float(np.corrcoef(openness[keep], b[keep])[0, 1]) if ok else float("nan")
    return scores


def chance_peaks(openness: np.ndarray, level: np.ndarray, fps: float, lags) -> np.ndarray:
    """The best correlation over ``lags`` that ``openness [T]`` reaches with ``level [T]`` circularly shifted by
    every shift of at least :data:`CHANCE_SHIFT_S` either way (at most :data:`CHANCE_SHIFTS`, evenly spaced):
    how high a peak climbs by chance for these two signals. Empty when the clip is too short for any."""
    low = int(round(CHANCE_SHIFT_S * fps))
    shifts = np.arange(low, len(level) - low + 1)
    if len(shifts) > CHANCE_SHIFTS:
        shifts = shifts[np.linspace(0, len(shifts) - 1, CHANCE_SHIFTS).round().astype(int)]
    peaks = [np.nanmax(list(_corr_by_lag(openness, np.roll(level, int(k)), lags).values())) for k in shifts]
    return np.asarray(peaks, np.float64)


def estimate_av_offset(openness: np.ndarray, audio: np.ndarray, fps: float, *,
                       lags=range(MIN_OFFSET_FRAMES, MAX_OFFSET_FRAMES + 1)) -> tuple[int, dict]:
    """The frames by which the sound ``audio`` (int16, 16 kHz, from the first frame on) comes after the mouth
    whose ``openness [T]`` was measured per frame (NaN: no face): the lag in ``lags`` at which openness and the
    sound's loudness per frame correlate best, when that peak is clear (:data:`MIN_GAIN` over lag 0, above
    :data:`CHANCE_QUANTILE` of :func:`chance_peaks`), else 0. Returns the lag and a report (the correlation at
    every lag, the chance level)."""
    from ..eval.real import loudness_db_per_frame

    o = np.asarray(openness, np.float64)
    level = np.maximum(loudness_db_per_frame(audio, len(o), fps), LOUDNESS_FLOOR_DB)
    scores = _corr_by_lag(o, level, lags)
    valid = [k for k in scores if scores[k] == scores[k]]
    best = max(valid, key=lambda k: scores[k], default=0)
    at_zero = scores.get(0, float("nan"))
    no_gain = at_zero == at_zero and scores.get(best, 0.0) < at_zero + MIN_GAIN  # (at_zero == at_zero: not NaN)
    chance = chance_peaks(o, level, fps, lags)
    chance_level = float(np.quantile(chance, CHANCE_QUANTILE)) if len(chance) else float("nan")
    clear = bool(valid) and not no_gain and chance_level == chance_level and scores[best] > chance_level
    chosen = int(best) if clear else 0
    return chosen, {"frames": chosen,
                    "openness_loudness_corr_by_lag": {str(k): round(v, 4) for k, v in scores.items()},
                    "chance_level": round(chance_level, 4), "chance_quantile": CHANCE_QUANTILE,
                    "chance_p": round(float((1 + (chance >= scores[best]).sum()) / (1 + len(chance))), 4) if valid
                    else 1.0,
                    "min_gain": MIN_GAIN}


__all__ = ["MAX_OFFSET_FRAMES", "MIN_OFFSET_FRAMES", "MIN_GAIN", "CHANCE_QUANTILE", "chance_peaks", "shift_frames",
           "shift_audio", "estimate_av_offset"]
