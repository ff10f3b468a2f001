"""The openness calibration of a video avatar (models/avatar/video/openness.py): the line inverts how open the
generator draws the mouth it is asked for, and folding it into the shape head keeps one linear map."""
import numpy as np
import pytest
import torch

from framegraph.models.avatar.video.lipsync import ShapeHead
from framegraph.models.avatar.video.openness import (
    MAX_OFFSET,
    MAX_SCALE,
    MIN_FRAMES,
    calibrate_openness,
    openness_line,
)

MEAN, STD = 0.07, 0.05  # a person's landmark openness: mean and std over their frames


def _generator_draws(z, gain=0.8, bias=-0.004, noise=0.002, seed=0):
    """What the landmarks measure on frames drawn for standardised openness ``z``: ``gain`` of the person's
    openness, shifted by ``bias`` (a generator that draws the mouth too closed), with measurement noise."""
    rng = np.random.default_rng(seed)
    return bias + gain * (MEAN + STD * z) + noise * rng.standard_normal(len(z))


def test_asking_for_the_calibrated_openness_draws_the_persons():
    z = np.random.default_rng(1).standard_normal(160)
    offset, scale, report = openness_line(z, _generator_draws(z), MEAN, STD)
    assert report["used"] and report["frames"] == 160
    assert report["drawn_mean"] < report["real_mean"]  # the mouth was drawn too closed
    wanted = np.linspace(-2, 3, 11)
    drawn = _generator_draws(offset + scale * wanted, noise=0.0)
    assert np.abs(drawn - (MEAN + STD * wanted)).max() < 0.002  # now the person's openness, within the noise
    assert scale > 1 and offset > 0  # a wider swing, and more open on average


def test_a_generator_that_draws_what_it_is_asked_keeps_the_head_as_it_is():
    z = np.random.default_rng(2).standard_normal(160)
    offset, scale, _ = openness_line(z, MEAN + STD * z, MEAN, STD)
    assert offset == pytest.approx(0.0, abs=1e-9) and scale == pytest.approx(1.0)


@pytest.mark.parametrize("drawn, why", [
    (lambda z: np.where(np.arange(len(z)) < MIN_FRAMES - 1, MEAN + STD * z, np.nan), "fewer than"),
    (lambda z: np.full(len(z), MEAN) + 0.001 * z, "hardly follows"),  # a mouth that does not answer the shape
])
def test_a_line_that_cannot_be_trusted_is_not_used(drawn, why):
    z = np.random.default_rng(3).standard_normal(160)
    offset, scale, report = openness_line(z, drawn(z), MEAN, STD)
    assert (offset, scale) == (0.0, 1.0) and not report["used"] and why in report["why"]


def test_the_line_is_held_within_its_bounds():
    z = np.random.default_rng(4).standard_normal(160)
    offset, scale, report = openness_line(z, 0.3 * (MEAN + STD * z) - 0.02, MEAN, STD)
    assert report["used"] and (offset, scale) == (MAX_OFFSET, MAX_SCALE)


def test_folding_the_line_into_the_head_moves_only_the_openness():
    torch.manual_seed(0)
    head = ShapeHead(feature_dim=8, context=2, shape_dim=3).eval()
    with torch.no_grad():
        head.mean.normal_()
        head.std.uniform_(0.5, 2.0)
    rest = torch.tensor([-0.6, 0.2, -0.1])
    new, new_rest = calibrate_openness(head, rest, 0.25, 1.3)
    x = torch.randn(50, 2, 8)
    with torch.no_grad():
        before, after = head(x), new(x)
    torch.testing.assert_close(after[:, 0], 0.25 + 1.3 * before[:, 0])
    torch.testing.assert_close(after[:, 1:], before[:, 1:])
    torch.testing.assert_close(new_rest, torch.tensor([0.25 + 1.3 * -0.6, 0.2, -0.1]))
    assert type(new) is ShapeHead and torch.equal(rest, torch.tensor([-0.6, 0.2, -0.1]))  # the inputs untouched
    with torch.no_grad():
        torch.testing.assert_close(head(x), before)
