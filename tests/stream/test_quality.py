"""The shared measures: one Pearson correlation (over the frames measured on both sides) and its scan over lags."""
import math

import numpy as np
import pytest
import torch

from framegraph.stream.quality import pearson, pearson_by_lag


def test_pearson_skips_unmeasured_frames_and_says_none_when_it_cannot_tell():
    t = np.linspace(0, 6, 200)
    mouth, sound = np.sin(t), np.sin(t) + 0.1 * np.cos(7 * t)
    expected = float(np.corrcoef(mouth, sound)[0, 1])
    assert math.isclose(pearson(mouth, sound), expected, rel_tol=1e-12)
    assert pearson(torch.from_numpy(mouth).float(), list(sound), digits=4) == round(expected, 4)
    gaps = mouth.copy()
    gaps[::7] = np.nan  # frames where the face was not found
    assert math.isclose(pearson(gaps, sound), float(np.corrcoef(mouth[1::7], sound[1::7])[0, 1]), rel_tol=0.05)
    assert pearson(np.ones(50), sound[:50]) is None  # a mouth that never moves
    assert pearson([1.0, 2.0], [2.0, 1.0]) is None  # too few frames
    with pytest.raises(ValueError, match="lengths 3 and 4 differ"):
        pearson([1, 2, 3], [1, 2, 3, 4])


def test_pearson_by_lag_finds_a_mouth_that_follows_the_sound():
    rng = np.random.default_rng(0)
    sound = rng.standard_normal(300)
    mouth = np.roll(sound, 2) + 0.05 * rng.standard_normal(300)  # the mouth moves 2 frames after the sound
    by_lag = pearson_by_lag(mouth, sound, 4)
    assert list(by_lag) == list(range(-4, 5))
    assert max(by_lag, key=by_lag.get) == 2 and by_lag[2] > 0.99 and abs(by_lag[-2]) < 0.2
