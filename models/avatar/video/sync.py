"""How late a video's sound is against its picture, measured from the person's own mouth.

A recording's sound and picture are not always in step. A phone's audio path can move the sound by a few frames. So can
a re-encode or an edit. Trained on such a video as it is, the audio → shape head suffers. It must predict the mouth from
sound that has not come yet. Its openness fit then drops sharply; ``docs/real_people.md`` has a case.

:func:`estimate_av_offset` finds the shift from the training frames alone. It uses something with no time of its own. A
mouth opens as the voice gets loud, on vowels. So the measured openness is cross-correlated with the sound's loudness
per frame. The peak's lag is the offset. It is kept only where the clip proves it:

- The peak stands :data:`MIN_GAIN` above lag 0. It lies strictly inside the search window. It is the best of the lags
  searched. It also beats :data:`PAST_END_LAGS` more past each end. It lies at neither end. A correlation that only
  rises towards an end is a trend, not a peak. Such a trend is a mouth slower than the voice, or a drift.
- It stands out of chance. It beats :data:`CHANCE_QUANTILE` of the chance peaks. Those come from the same two signals,
  with the sound moved seconds away. Those are every circular shift of at least :data:`CHANCE_SHIFT_S`. How high a
  chance peak reaches depends on the clip's length. It also depends on how smooth the two signals are. So a fixed
  threshold would fail. It would make lags up on a short clip. It would miss a weak but certain one on a long one.
- The shape head confirms it (:func:`head_fit_by_lag`). It compares its cross-validated openness correlation on the
  moved sound and on the sound as recorded. The moved one must win by :data:`MIN_HEAD_GAIN`. It uses the same frames and
  folds. The head alone would not do to search with. Its causal features predict the mouth better from sound a few
  frames *later*. That holds even on a clip that is in step. Live, that would show as a mouth that lags the voice. So it
  only vetoes, with a margin.

Otherwise the sound is left as recorded, at lag 0. The report says which test failed. The trainer fits the head on the
sound so aligned. The bundle records the offset. ``avatar eval`` aligns the source video's held-out sound by it. The
real frames are the mouth of the sound as it was spoken. Live, the head answers the sound as it plays. No latency is
added.
"""
from __future__ import annotations

import numpy as np
import torch

MAX_OFFSET_FRAMES = 10  # the latest sound searched for: 400 ms at 25 fps
MIN_OFFSET_FRAMES = -3  # ... and the earliest (sound ahead of the picture: rare)
MIN_GAIN = 0.1  # the openness-loudness correlation at the offset must beat the one at lag 0 by this much ...
PAST_END_LAGS = 5  # ... and be the best of the window's lags and this many more past each end
CHANCE_QUANTILE = 0.99  # ... and this share of the peaks the signals reach with the sound moved far away
CHANCE_SHIFT_S = 2.0  # the least circular shift (s) of the sound that counts as "far away"
CHANCE_SHIFTS = 200  # at most this many shifts, evenly spaced
MIN_HEAD_GAIN = 0.05  # the head's cross-validated openness correlation must gain this much at the offset
LOUDNESS_FLOOR_DB = -60.0  # quieter frames count as this loud (silence, whatever its hiss)


def shift_frames(x, lag: int):
    """Row ``t`` of the result is row ``t + lag`` of ``x [T, ...]``, numpy or torch.

    ``lag`` > 0 is for sound that comes ``lag`` frames late. Its end is repeated to keep ``T`` rows. ``lag`` < 0
    is for sound that comes early. Its start is repeated."""
    idx = np.clip(np.arange(len(x)) + int(lag), 0, max(len(x) - 1, 0))
    return x[torch.from_numpy(idx)] if isinstance(x, torch.Tensor) else x[idx]


def shift_audio(samples: np.ndarray, lag: int, samples_per_frame: int) -> np.ndarray:
    """``samples [S]`` moved ``lag`` frames earlier or later; the length is kept.

    ``lag`` > 0 means the sound came late. It moves earlier and silence fills the end. ``lag`` < 0 moves it later;
    silence fills the start."""
    n = abs(int(lag)) * int(samples_per_frame)
    if lag == 0 or n == 0:
        return samples
    pad = np.zeros(min(n, len(samples)), samples.dtype)
    if lag > 0:
        return np.concatenate([samples[n:], pad])
    return np.concatenate([pad, samples[:len(samples) - n]])


def _corr_by_lag(openness: np.ndarray, level: np.ndarray, lags) -> dict[int, float]:
    """The correlation of ``openness [T]`` with ``level [T]`` moved by each lag.

    NaN in ``openness`` means no face. The result is NaN where too few frames are left."""
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
    """How high a peak climbs by chance for these two signals.

    It is the best correlation over ``lags`` of ``openness [T]`` with ``level [T]``. The level is circularly shifted.
    Every shift of at least :data:`CHANCE_SHIFT_S` either way counts. At most :data:`CHANCE_SHIFTS` shifts are taken,
    evenly spaced. Empty when the clip is too short for any."""
    low = int(round(CHANCE_SHIFT_S * fps))
    shifts = np.arange(low, len(level) - low + 1)
    if len(shifts) > CHANCE_SHIFTS:
        shifts = shifts[np.linspace(0, len(shifts) - 1, CHANCE_SHIFTS).round().astype(int)]
    peaks = [np.nanmax(list(_corr_by_lag(openness, np.roll(level, int(k)), lags).values())) for k in shifts]
    return np.asarray(peaks, np.float64)


def estimate_av_offset(openness: np.ndarray, audio: np.ndarray, fps: float, *,
                       lags=range(MIN_OFFSET_FRAMES, MAX_OFFSET_FRAMES + 1)) -> tuple[int, dict]:
    """The frames by which the sound ``audio`` comes after the mouth whose ``openness [T]`` was measured.

    ``audio`` is int16 at 16 kHz, from the first frame on. ``openness`` is per frame; NaN means no face. The result is a
    lag in ``lags``. At it, openness and the sound's loudness per frame correlate best. That peak must be clear. It must
    beat lag 0 by :data:`MIN_GAIN`. It must lie strictly inside ``lags``. It must beat the :data:`PAST_END_LAGS` past
    either end. It must be above :data:`CHANCE_QUANTILE` of :func:`chance_peaks`. Else the result is 0. The shape head's
    confirmation is the caller's (:func:`confirm_offset`).

    Returns the lag and a report. The report has the correlation at every lag and the chance level. It has the
    best lag, ``peak_frames``. It has each test passed or not, ``checks``, and the ``reason``."""
    from framegraph.models.audio.per_frame import loudness_db_per_frame

    o = np.asarray(openness, np.float64)
    level = np.maximum(loudness_db_per_frame(audio, len(o), fps), LOUDNESS_FLOOR_DB)
    lags = [int(k) for k in lags]
    scores = _corr_by_lag(o, level, lags)
    valid = [k for k in scores if scores[k] == scores[k]]
    best = max(valid, key=lambda k: scores[k], default=0)
    peak = scores.get(best, float("nan"))
    past = _corr_by_lag(o, level, [*range(lags[0] - PAST_END_LAGS, lags[0]),
                                   *range(lags[-1] + 1, lags[-1] + 1 + PAST_END_LAGS)])
    wide = {k: v for k, v in {**scores, **past}.items() if v == v}  # the lags searched and those past the ends
    widest = max(wide, key=lambda k: wide[k], default=best)
    chance = chance_peaks(o, level, fps, lags)
    chance_level = float(np.quantile(chance, CHANCE_QUANTILE)) if len(chance) else float("nan")

    at_zero = scores.get(0, float("nan"))
    checks = {"gain_over_lag_0": bool(valid) and (not at_zero == at_zero or peak >= at_zero + MIN_GAIN),
              "inside_window": bool(valid) and widest == best and best not in (lags[0], lags[-1]),
              "above_chance": bool(valid) and chance_level == chance_level and peak > chance_level}
    chosen = int(best) if best != 0 and all(checks.values()) else 0
    if not valid:
        reason = "no lag could be measured (too few frames with a face and sound)"
    elif best == 0:
        reason = "lag 0 correlates best"
    elif not checks["gain_over_lag_0"]:
        reason = f"the peak at {best} frames ({peak:.3f}) beats lag 0 ({at_zero:.3f}) by less than {MIN_GAIN}"
    elif not checks["inside_window"]:
        reason = (f"the correlation only rises towards the window's end (best searched {peak:.3f} at {best} "
                  f"frames, {wide[widest]:.3f} at {widest} of {lags[0] - PAST_END_LAGS}..{lags[-1] + PAST_END_LAGS}"
                  f"): a trend, not a peak")
    elif not checks["above_chance"]:
        reason = f"the peak at {best} frames ({peak:.3f}) does not stand out of chance ({chance_level:.3f})"
    else:
        reason = f"a clear peak at {best} frames ({peak:.3f}; lag 0 {at_zero:.3f}, chance {chance_level:.3f})"
    return chosen, {"frames": chosen, "peak_frames": int(best), "checks": checks, "reason": reason,
                    "openness_loudness_corr_by_lag": {str(k): round(v, 4) for k, v in scores.items()},
                    "past_ends_corr_by_lag": {str(k): round(v, 4) for k, v in past.items()},
                    "chance_level": round(chance_level, 4), "chance_quantile": CHANCE_QUANTILE,
                    "chance_p": round(float((1 + (chance >= peak).sum()) / (1 + len(chance))), 4) if valid
                    else 1.0,
                    "min_gain": MIN_GAIN}


def head_fit_by_lag(features: torch.Tensor, shapes: torch.Tensor, lags, *, context: int = 3) -> dict[int, float]:
    """The shape head's cross-validated openness correlation at each lag.

    The head is :func:`~.lipsync.fit_shape_head`'s, with its best ridge. ``features [T, D]`` are moved by each
    lag against ``shapes [T, P]``. All lags use the same frames, those every lag has real sound for. So they
    use the same folds."""
    from .lipsync import fit_shape_head

    lags = [int(k) for k in lags]
    lo, hi = max(0, -min(lags)), len(features) - max(0, max(lags))
    fits = {}
    for lag in lags:
        moved = shift_frames(features, lag)[lo:hi]
        _, report = fit_shape_head(moved, shapes[lo:hi], context=context)
        fits[lag] = round(max(v for v in report["cv_openness_corr"].values() if v == v), 4)
    return fits


def confirm_offset(lag: int, report: dict, features: torch.Tensor, shapes: torch.Tensor, *,
                   context: int = 3) -> int:
    """``lag`` if the shape head confirms it, else 0 with the reason.

    ``lag`` comes from :func:`estimate_av_offset`, whose ``report`` is updated in place. The head must fit the ``shapes
    [T, P]`` better from moved ``features [T, D]``. It is compared with them as recorded. It must gain
    :data:`MIN_HEAD_GAIN`, by :func:`head_fit_by_lag`."""
    if lag == 0:
        return 0
    fits = head_fit_by_lag(features, shapes, (0, lag), context=context)
    report["head_cv_openness_corr"] = {str(k): v for k, v in fits.items()}
    report["min_head_gain"] = MIN_HEAD_GAIN
    report["checks"]["head_confirms"] = fits[lag] >= fits[0] + MIN_HEAD_GAIN
    if not report["checks"]["head_confirms"]:
        report["reason"] = (f"{report['reason']}, but the shape head fits no better there: held-out openness "
                            f"correlation {fits[lag]:.3f} at {lag} frames vs {fits[0]:.3f} at 0 (less than "
                            f"{MIN_HEAD_GAIN} more)")
        lag = 0
    else:
        report["reason"] = (f"{report['reason']}, confirmed by the shape head: {fits[lag]:.3f} at {lag} frames vs "
                            f"{fits[0]:.3f} at 0")
    report["frames"] = lag
    return lag


__all__ = ["MAX_OFFSET_FRAMES", "MIN_OFFSET_FRAMES", "MIN_GAIN", "PAST_END_LAGS", "MIN_HEAD_GAIN", "CHANCE_QUANTILE",
           "chance_peaks", "shift_frames", "shift_audio", "estimate_av_offset", "head_fit_by_lag", "confirm_offset"]
