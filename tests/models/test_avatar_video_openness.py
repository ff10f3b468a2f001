"""The openness calibration of a video avatar (models/avatar/video/openness.py): the shift makes a generator that
draws the mouth too closed draw the person's openness on average, and adding it to the shape head keeps one
linear map."""
import numpy as np
import pytest
import torch

from framegraph.models.avatar.video.lipsync import ShapeHead
from framegraph.models.avatar.video.openness import MAX_OFFSET, MIN_FRAMES, calibrate_openness, openness_offset

MEAN, STD = 0.07, 0.05  # a person's landmark openness: mean and std over their frames


def _generator_draws(z, gain=0.8, bias=-0.004, noise=0.002, seed=0):
    """What the landmarks measure on frames drawn for standardised openness ``z``: ``gain`` of the person's
    openness, shifted by ``bias`` (a generator that draws the mouth too closed), with measurement noise."""
    rng = np.random.default_rng(seed)
    return bias + gain * (MEAN + STD * z) + noise * rng.standard_normal(len(z))


def test_asking_for_the_shifted_openness_draws_the_persons_on_average():
    z = np.random.default_rng(1).standard_normal(160)
    offset, report = openness_offset(z, _generator_draws(z), MEAN + STD * z, STD)
    assert report["used"] and report["frames"] == 160 and offset > 0
    assert report["drawn_mean"] < report["real_mean"]  # the mouth was drawn too closed
    person = MEAN + STD * z
    before, after = _generator_draws(z, noise=0.0), _generator_draws(z + offset, noise=0.0)
    assert abs(after.mean() - person.mean()) < 0.0005 < abs(before.mean() - person.mean())
    assert after.std() == pytest.approx(before.std())  # the swing is left as it was


def test_a_generator_that_draws_what_it_is_asked_keeps_the_head_as_it_is():
    z = np.random.default_rng(2).standard_normal(160)
    offset, report = openness_offset(z, MEAN + STD * z, MEAN + STD * z, STD)
    assert report["used"] and offset == pytest.approx(0.0, abs=1e-9)


def test_the_shift_is_measured_against_the_persons_frames_not_the_asked_shapes():
    """The head asks for less than the person did in those frames (a regression answers towards the mean and
    below it here): the shift brings the drawn mouth to the person's openness, not to the head's."""
    person_z = np.random.default_rng(5).standard_normal(160) + 0.3
    asked = 0.8 * person_z - 0.2
    offset, report = openness_offset(asked, MEAN + STD * asked, MEAN + STD * person_z, STD)
    assert report["used"] and offset == pytest.approx((0.3 - 0.8 * 0.3 + 0.2), abs=0.05)
    drawn = MEAN + STD * (asked + offset)
    assert abs(drawn.mean() - (MEAN + STD * person_z).mean()) < 1e-9


@pytest.mark.parametrize("drawn, why", [
    (lambda z: np.where(np.arange(len(z)) < MIN_FRAMES - 1, MEAN + STD * z, np.nan), "fewer than"),
    (lambda z: np.full(len(z), MEAN - 0.02) + 0.001 * z, "hardly follows"),  # a mouth that does not answer
])
def test_a_shift_that_cannot_be_trusted_is_not_used(drawn, why):
    z = np.random.default_rng(3).standard_normal(160)
    offset, report = openness_offset(z, drawn(z), MEAN + STD * z, STD)
    assert offset == 0.0 and not report["used"] and why in report["why"]


def test_the_shift_is_held_within_its_bound():
    z = np.random.default_rng(4).standard_normal(160)
    offset, report = openness_offset(z, 0.3 * (MEAN + STD * z) - 0.02, MEAN + STD * z, STD)
    assert report["used"] and offset == MAX_OFFSET
    offset, _ = openness_offset(z, 0.3 * (MEAN + STD * z) + 0.2, MEAN + STD * z, STD)
    assert offset == -MAX_OFFSET


def test_the_shift_moves_only_the_heads_openness_and_the_rest_shapes():
    torch.manual_seed(0)
    head = ShapeHead(feature_dim=8, context=2, shape_dim=3).eval()
    with torch.no_grad():
        head.mean.normal_()
        head.std.uniform_(0.5, 2.0)
    rest = torch.tensor([-0.6, 0.2, -0.1])
    new, new_rest = calibrate_openness(head, rest, 0.25)
    x = torch.randn(50, 2, 8)
    with torch.no_grad():
        before, after = head(x), new(x)
    torch.testing.assert_close(after[:, 0], before[:, 0] + 0.25)
    torch.testing.assert_close(after[:, 1:], before[:, 1:])
    torch.testing.assert_close(new_rest, torch.tensor([-0.35, 0.2, -0.1]))
    assert type(new) is ShapeHead and torch.equal(rest, torch.tensor([-0.6, 0.2, -0.1]))  # the inputs untouched
    with torch.no_grad():
        torch.testing.assert_close(head(x), before)


def test_the_calibration_can_be_turned_off_from_the_command_line():
    """``avatar train --video --no-openness-calibration``: no frames redrawn, the head left as fitted, and the
    train report (and so PROVENANCE.md) says it was turned off."""
    from framegraph.apps.cli import build_parser
    from framegraph.models.avatar.video.openness import OPENNESS_FRAMES
    from framegraph.models.avatar.video.train import VideoTrainConfig, _calibrate_openness

    assert VideoTrainConfig().openness_frames == OPENNESS_FRAMES
    for argv, want in ((["--no-openness-calibration"], False), ([], True)):
        args = build_parser(["avatar", "train"]).parse_args(["avatar", "train", "--video", "me.mp4", "--out", "x",
                                                             *argv])
        assert args.openness_calibration is want
    report = _calibrate_openness(None, None, None, VideoTrainConfig(openness_frames=0))  # touches nothing
    assert not report["used"] and "--no-openness-calibration" in report["why"]
