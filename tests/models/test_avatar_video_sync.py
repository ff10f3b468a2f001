"""A video whose sound comes late against its picture (models/avatar/video/sync.py): the offset is found from
the mouth itself, on a talking clip of the astronaut (`framegraph avatar synth`, its mouth's ground truth) with
its own sound, the same sound made 5 frames (200 ms) late, as a phone's recording can be, and 2 frames early."""
import json

import numpy as np
import pytest
import torch

from framegraph.models.avatar.video.sync import estimate_av_offset, shift_audio, shift_frames


def test_shifts_move_rows_and_samples_and_keep_their_length():
    x = torch.arange(6)[:, None].float()
    assert shift_frames(x, 2)[:, 0].tolist() == [2, 3, 4, 5, 5, 5]  # late sound: what comes at t + 2 answers t
    assert shift_frames(x, -2)[:, 0].tolist() == [0, 0, 0, 1, 2, 3]
    assert shift_frames(np.arange(4), 0).tolist() == [0, 1, 2, 3]
    a = np.arange(1, 11, dtype=np.int16)
    assert shift_audio(a, 1, 3).tolist() == [4, 5, 6, 7, 8, 9, 10, 0, 0, 0]
    assert shift_audio(a, -1, 3).tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7]


@pytest.mark.slow
def test_a_late_sound_is_found_from_the_mouth_and_an_aligned_one_is_left_alone(astronaut_talking_clip):
    from framegraph.models.avatar.portrait.data import clip_audio

    truth = json.loads(astronaut_talking_clip.with_suffix(".json").read_text())["frames"]
    jaw = np.array([f["jaw_open"] for f in truth])  # the mouth as drawn, frame by frame
    audio = clip_audio(astronaut_talking_clip)
    found = {late: estimate_av_offset(jaw, shift_audio(audio, -late, 640), 25) for late in (0, 5, -2)}
    assert [found[late][0] for late in (0, 5, -2)] == [0, 5, -2], {k: v[1] for k, v in found.items()}
    scores = found[5][1]["openness_loudness_corr_by_lag"]
    assert scores["5"] > 0.6 and scores["5"] > scores["0"] + 0.3, "aligned, the mouth follows the voice"
    rng = np.random.default_rng(0)  # a mouth that has nothing to do with the sound: no offset is made up
    lag, report = estimate_av_offset(rng.random(len(jaw)), audio, 25)
    assert lag == 0 and max(report["openness_loudness_corr_by_lag"].values()) < 0.3



def _syllables(frames: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A voice on and off in 4-frame syllables ``[T]`` (1: sounding) and its sound (int16, 16 kHz, 25 fps)."""
    voice = np.repeat(np.random.default_rng(seed).random(frames // 4) > 0.5, 4).astype(np.float64)
    return voice, (np.repeat(voice, 640) * 8000 * np.sin(np.arange(len(voice) * 640) / 5)).astype(np.int16)


def test_a_weak_lag_is_found_on_a_long_video_and_chance_is_not_taken_for_one():
    """A mouth that follows its voice only weakly (a small face, a noisy measure): over two minutes its 3-frame
    lag stands out of chance although the correlation stays far under the 0.3 a 20-s clip's chance peaks come
    near; smooth mouths that have nothing to do with their 20-s sound are left in step (the chance level is
    the 99th percentile of the peaks with the sound moved away, so about one in a hundred may pass)."""
    voice, sound = _syllables(120 * 25, seed=2)
    mouth = voice + 2.5 * np.random.default_rng(3).standard_normal(len(voice))  # openness, mostly noise
    lag, report = estimate_av_offset(mouth, shift_audio(sound, -3, 640), 25)
    peak = report["openness_loudness_corr_by_lag"]["3"]
    assert lag == 3 and peak < 0.25 and report["chance_level"] < peak / 2 and report["chance_p"] <= 0.01, report
    _, sound = _syllables(20 * 25, seed=2)
    given, levels = [], []
    for seed in range(40):
        smooth = np.convolve(np.random.default_rng(seed).standard_normal(20 * 25 + 9), np.ones(10) / 10, "valid")
        lag, report = estimate_av_offset(smooth, sound, 25)
        given.append(lag)
        levels.append(report["chance_level"])
    assert sum(lag != 0 for lag in given) <= 2 and min(levels) > 0.15, (given, levels)

def _late_by(sound: np.ndarray, samples: int) -> np.ndarray:
    """``sound`` coming ``samples`` late (silence in front), its length kept."""
    return np.concatenate([np.zeros(samples, sound.dtype), sound[:len(sound) - samples]])


def test_a_correlation_that_only_rises_towards_the_window_end_is_no_offset():
    """A mouth whose voice comes 15 or 12 frames late (past the 10 searched) gives a correlation that rises to the
    window's end: a trend, not a peak, so the sound is left in step and the report says why (both were taken for
    10 frames)."""
    voice = np.repeat(np.random.default_rng(5).random(60 * 25 // 12) > 0.5, 12).astype(np.float64)
    mouth = voice + 0.3 * np.random.default_rng(6).standard_normal(len(voice))
    sound = (np.repeat(voice, 640) * 8000 * np.sin(np.arange(len(voice) * 640) / 5)).astype(np.int16)
    for late in (15 * 640, 12 * 640):
        lag, report = estimate_av_offset(mouth, _late_by(sound, late), 25)
        scores = report["openness_loudness_corr_by_lag"]
        assert scores["10"] > scores["0"] + 0.3 and report["peak_frames"] == 10, report
        assert lag == 0 and report["frames"] == 0 and not report["checks"]["inside_window"], report
        assert "only rises towards the window's end" in report["reason"], report


def _talk(frames: int, seed: int):
    """A mouth that opens with a voice in 4-frame syllables ``[T]`` and the voice's sound (int16, 16 kHz, 25 fps)."""
    rng = np.random.default_rng(seed)
    voice = np.repeat(rng.random(frames // 4) > 0.5, 4).astype(np.float64)
    openness = voice + 0.05 * rng.random(len(voice))
    return openness, (np.repeat(voice, 640) * 8000 * np.sin(np.arange(len(voice) * 640) / 5)).astype(np.int16)


def test_train_aligns_the_sound_by_the_measured_offset_unless_told_not_to():
    """``avatar train --video`` measures the offset, has the shape head confirm it and moves the audio features by
    it; ``--no-av-sync`` keeps the sound as recorded (and records no measure)."""
    from framegraph.apps.cli import build_parser
    from framegraph.models.avatar.video.train import VideoTrainConfig, _align_sound

    openness, sound = _talk(240, seed=1)
    late = shift_audio(sound, -4, 640)  # the sound comes 4 frames late ...
    rng = np.random.default_rng(2)  # ... and so do the features computed from it
    feats = torch.from_numpy(np.stack([shift_frames(openness, -4), rng.random(240)], 1)).float()
    z = torch.from_numpy((openness - openness.mean()) / openness.std()).float()[:, None]
    moved, _, report = _align_sound(feats, None, openness, late, z, len(z), VideoTrainConfig(), 25)
    assert report["frames"] == 4 and torch.equal(moved, shift_frames(feats, 4)), report
    fits = report["head_cv_openness_corr"]
    assert report["checks"]["head_confirms"] and fits["4"] > fits["0"] + 0.5 and "confirmed" in report["reason"]
    kept, _, report = _align_sound(feats, None, openness, late, z, len(z), VideoTrainConfig(av_sync=False), 25)
    assert report is None and torch.equal(kept, feats)
    for argv, want in ((["--no-av-sync"], False), ([], True)):
        args = build_parser(["avatar", "train"]).parse_args(["avatar", "train", "--video", "me.mp4", "--out", "x",
                                                             *argv])
        assert args.av_sync is want


def test_an_offset_the_shape_head_does_not_confirm_is_not_made():
    """The loudness peaks 4 frames late but the features the head learns from follow the mouth as recorded: the
    head fits worse on them moved, so the sound is left in step, with the head's two fits as the reason."""
    from framegraph.models.avatar.video.train import VideoTrainConfig, _align_sound

    openness, sound = _talk(240, seed=3)
    rng = np.random.default_rng(4)
    feats = torch.from_numpy(np.stack([openness, rng.random(240)], 1)).float()
    z = torch.from_numpy((openness - openness.mean()) / openness.std()).float()[:, None]
    kept, _, report = _align_sound(feats, None, openness, shift_audio(sound, -4, 640), z, len(z),
                                   VideoTrainConfig(), 25)
    fits = report["head_cv_openness_corr"]
    assert report["peak_frames"] == 4 and report["frames"] == 0 and torch.equal(kept, feats), report
    assert not report["checks"]["head_confirms"] and fits["0"] > fits["4"], report
    assert "the shape head fits no better there" in report["reason"]
