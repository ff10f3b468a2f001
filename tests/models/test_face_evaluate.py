"""Real-data evaluation with face landmarks (models/avatar/evaluate_real.py) on renders of the shipped photo
and on a synthetic talking clip."""
import argparse
import json

import cv2
import numpy as np
import pytest

from framegraph.apps import avatar as avatar_app
from framegraph.apps.commands import avatar as avatar_front
from framegraph.models.avatar.eval.real import (
    CLOSED_OPENNESS,
    JAW_BREAK,
    LandmarkMeter,
    edge_across,
    real_summary,
    silent_frames,
    track_clip,
)
from framegraph.models.synth import FaceParams, PortraitRenderer, astronaut_portrait

JAWS = [0.0, 0.0, 0.0, 0.0, 0.2, 0.6, 1.0, 0.7, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.9, 0.4, 0.0, 0.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def real_frames():
    """A "real video": the astronaut's jaw opening and closing."""
    r = PortraitRenderer(astronaut_portrait())
    return [r.render(FaceParams(jaw_open=j, teeth=0.3)).numpy() for j in JAWS]


def measure(generated, real) -> list[dict]:
    meter = LandmarkMeter()
    try:
        return [meter.measure(g, r) for g, r in zip(generated, real)]
    finally:
        meter.close()


def test_the_real_frames_themselves_score_perfectly(real_frames):
    s = real_summary(measure(real_frames, real_frames), None)
    assert s["faces_found_generated"] == 1 and s["faces_found_real"] == 1
    assert s["landmark_openness_corr"] > 0.99 and abs(s["landmark_openness_swing"] - 1) < 1e-6
    assert s["outside_mouth_psnr_db"] == 99.0 and s["outside_mouth_ssim"] > 0.999
    assert abs(s["mouth_sharpness_ratio"] - 1) < 1e-6 and abs(s["lips_sharpness_ratio"] - 1) < 1e-6
    assert s["jaw_edge_ratio"] == 1.0 and s["jaw"]["breaks"] == 0 and s["jaw"]["frames"] == len(real_frames)


def test_a_static_mouth_a_blurred_mouth_and_a_moved_face_are_caught(real_frames):
    still = [real_frames[0]] * len(real_frames)  # lips never move
    s = real_summary(measure(still, real_frames), None)
    assert s["landmark_openness_corr"] is None or s["landmark_openness_corr"] < 0.3
    assert s["landmark_openness_swing"] < 0.1, "a mouth that never moves does not swing"
    assert s["outside_mouth_psnr_db"] > 35, "outside the mouth it is the real picture"
    blurred = []
    for f in real_frames:  # the lower face blurred (as a too-small generated region looks), the rest real
        b = f.copy()
        b[110:190, 70:180] = cv2.GaussianBlur(f, (0, 0), 1.2)[110:190, 70:180]
        blurred.append(b)
    s = real_summary(measure(blurred, real_frames), None)
    assert s["mouth_sharpness_ratio"] < 0.5 and s["lips_sharpness_ratio"] < 0.5
    from framegraph.models.face import FaceLandmarker

    lips_only = []
    with FaceLandmarker(max_faces=1) as landmarks:
        for f, b in zip(real_frames, blurred):  # only the lips blurred, the skin around them real: the lips say so
            m = np.zeros(f.shape[:2], np.uint8)
            cv2.fillPoly(m, [np.round(landmarks.detect(f)[0].lip_outer()).astype(np.int32)], 1)
            lips_only.append(np.where(m[..., None] > 0, b, f))
    s = real_summary(measure(lips_only, real_frames), None)
    assert s["lips_sharpness_ratio"] < 0.6 * s["mouth_sharpness_ratio"], s
    assert s["landmark_openness_corr"] > 0.8, "a blurred mouth still opens in step"
    shifted = [np.roll(f, 3, axis=1) for f in real_frames]  # the face 3 px off: not the real frames
    s = real_summary(measure(shifted, real_frames), None)
    assert s["outside_mouth_psnr_db"] < 30 and s["outside_mouth_ssim"] < 0.9


def _chin_on_collar(blur_sigma: float = 0.0, blur_from_x: float = 0.0):
    """A light face (an ellipse) on a dark collar, 160x160, its jaw line (the ellipse's lower half, 13 points
    from one side to the other); blurred with ``blur_sigma`` px right of ``blur_from_x`` (a chin that melts)."""
    img = np.full((160, 160, 3), 40, np.uint8)
    cv2.ellipse(img, (80, 70), (50, 60), 0, 0, 360, (200, 170, 150), -1, lineType=cv2.LINE_AA)
    a = np.linspace(0, np.pi, 13)
    line = np.stack([80 + 50 * np.cos(a), 70 + 60 * np.sin(a)], 1)
    if blur_sigma:
        soft = cv2.GaussianBlur(img, (0, 0), blur_sigma)
        img[:, int(blur_from_x):] = soft[:, int(blur_from_x):]
    return img, line


def test_jaw_edge_is_found_where_the_line_is_and_a_melting_chin_loses_it():
    sharp, line = _chin_on_collar()
    base = edge_across(sharp, line, band_px=3)
    assert len(base) > 150 and base.min() > 30, "a light face on a dark collar: a strong edge all along its jaw"
    moved = np.roll(sharp, 2, axis=0)  # the landmarks 2 px off the edge: still found within the band
    assert 0.9 < edge_across(moved, line, band_px=3).mean() / base.mean() < 1.1
    assert edge_across(moved, line, band_px=0).mean() / base.mean() < 0.9, "outside the band it is not looked for"
    smeared, _ = _chin_on_collar(blur_sigma=3)
    assert edge_across(smeared, line, band_px=3).mean() / base.mean() < 0.5
    half, _ = _chin_on_collar(blur_sigma=3, blur_from_x=110)  # the chin melts on one side only
    part = edge_across(half, line, band_px=3)
    assert part[:len(part) // 4].mean() / base[:len(part) // 4].mean() < JAW_BREAK, "that stretch breaks"
    assert part[-len(part) // 4:].mean() / base[-len(part) // 4:].mean() > 0.95, "the other side is whole"


def test_a_chin_smeared_into_the_collar_is_caught_and_its_worst_frame_named(real_frames):
    from framegraph.models.face import FaceLandmarker

    smeared = list(real_frames)
    with FaceLandmarker(max_faces=1) as landmarks:
        line = landmarks.detect(real_frames[7])[0].jaw_line()
    x0, y0 = np.floor(line.min(0)).astype(int) - 6
    x1, y1 = np.ceil(line.max(0)).astype(int) + 6
    f = real_frames[7].copy()  # one frame's jaw smeared into what is below it, as a redraw that melts
    f[y0:y1, x0:x1] = cv2.GaussianBlur(f, (0, 0), 3.0)[y0:y1, x0:x1]
    smeared[7] = f
    s = real_summary(measure(smeared, real_frames), None)
    jaw = s["jaw"]
    assert jaw["worst_frame"] == 7 and jaw["worst_frame_ratio"] < 0.6
    assert jaw["breaks"] == 1 and jaw["break_frames"] == [7]
    assert s["jaw_edge_ratio"] > 0.95, "the other frames keep their jaw line"


def test_lips_closed_in_silence(real_frames):
    speech = np.array([0.0 if j == 0 else 1.0 for j in JAWS])
    quiet = silent_frames(speech)
    assert list(np.nonzero(quiet)[0]) == [0, 1, 11, 19, 20], "two frames either side of speech are not silence"
    rows = measure(real_frames, real_frames)
    s = real_summary(rows, speech)["silence"]
    assert s["frames"] == 5 and s["lips_closed_fraction_generated"] == 1.0 == s["lips_closed_fraction_real"]
    assert s["closed_below"] >= CLOSED_OPENNESS
    opened = [real_frames[6]] * len(real_frames)  # the mouth wide open all the time
    s = real_summary(measure(opened, real_frames), speech)["silence"]
    assert s["lips_closed_fraction_generated"] == 0.0 and s["lips_closed_fraction_real"] == 1.0


@pytest.mark.slow
def test_track_clip_and_the_eval_cli_on_a_talking_clip(tmp_path, capsys):
    """The synthetic clip's mouth follows its speech: the landmarks see it (and the CLI writes it)."""
    parser = argparse.ArgumentParser(prog="framegraph avatar")
    avatar_front.add_arguments(parser)
    assert avatar_app.run(parser.parse_args(["synth", "--out", str(tmp_path), "--clips", "1", "--seconds", "4",
                                             "--seed", "3"])) == 0
    clip = tmp_path / "clip_00000.mp4"
    m = track_clip(clip)
    assert m["frames"] == 100 and m["faces_found"] == 1.0
    assert m["openness_vs_loudness_corr"] > 0.4 and abs(m["best_lag_frames"]) <= 2
    out = tmp_path / "m.json"
    assert avatar_app.run(parser.parse_args(["eval", "--clip", str(clip), "--out", str(out)])) == 0
    assert json.loads(out.read_text())["openness_vs_loudness_corr"] == m["openness_vs_loudness_corr"]
    assert avatar_app.run(parser.parse_args(["eval", "--clip", str(tmp_path / "none.mp4"), "--out", str(out)])) == 2
    assert "does not exist" in capsys.readouterr().err
