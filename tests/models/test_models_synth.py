"""Synthetic talking clips: eSpeak NG speech and phoneme events, visemes, portraits, rendering, and
``framegraph avatar synth`` end to end. Needs the system package espeak-ng: without it these tests
fail saying so."""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
from PIL import Image

from framegraph.apps import avatar
from framegraph.apps.commands import avatar as avatar_front
from framegraph.models.synth import (
    EspeakError,
    EspeakNotFound,
    FaceParams,
    PortraitError,
    PortraitRenderer,
    astronaut_portrait,
    detect_face_regions,
    load_portrait,
    mouth_curves,
    plan_clip,
    resample,
    synthesize,
    viseme_for,
)
from framegraph.models.synth import espeak as espeak_module
from framegraph.models.synth.clip import clip_seed
from framegraph.models.synth.portrait import portraits_folder
from framegraph.stream.media import read_video

SR = 16_000


def frame_rms(audio: np.ndarray, n_frames: int, fps: int) -> np.ndarray:
    spf = SR // fps
    a = np.zeros(n_frames * spf)
    a[:min(len(a), len(audio))] = audio[:len(a)]
    return np.sqrt((a.reshape(n_frames, spf) ** 2).mean(axis=1))


# ---- eSpeak NG ------------------------------------------------------------------------------------
def test_espeak_phoneme_events_are_monotone_and_cover_the_audio():
    s = synthesize("Hello world, this is a test of the speech engine.", voice="en-us+f3", rate_wpm=180, pitch=60)
    assert s.sample_rate == SR and s.samples.dtype == np.int16 and len(s.samples) > SR
    times = [e.time_ms for e in s.events]
    assert times == sorted(times) and times[0] >= 0 and times[-1] <= s.duration_ms
    phonemes = s.phonemes
    assert len(phonemes) > 20 and [w.name for w in s.words][:2] == ["Hello", "world"]
    rms = frame_rms(s.samples.astype(float), len(s.samples) // 320, 50)  # 20 ms frames
    voiced = np.nonzero(rms > 0.05 * rms.max())[0] * 20.0  # ms
    assert phonemes[0].time_ms <= voiced[0] + 20, "the first phoneme starts by the first sound"
    assert phonemes[-1].time_ms >= voiced[-1] - 150, "phonemes reach the end of the sound"
    sounds = [e for e in phonemes if not e.name.startswith("_")]
    assert max(b.time_ms - a.time_ms for a, b in zip(sounds, sounds[1:])) < 400, "no long stretch without events"


def test_espeak_rate_and_pitch_change_the_speech():
    slow = synthesize("Testing one two three.", rate_wpm=120)
    fast = synthesize("Testing one two three.", rate_wpm=300)
    assert len(slow.samples) > 1.5 * len(fast.samples)
    low = synthesize("Testing one two three.", pitch=10)
    high = synthesize("Testing one two three.", pitch=90)
    assert not np.array_equal(low.samples[:len(high.samples)], high.samples[:len(low.samples)])


def test_espeak_bad_requests_say_what_is_wrong():
    with pytest.raises(EspeakError, match="no voice 'no-such-voice'"):
        synthesize("hello", voice="no-such-voice")
    with pytest.raises(ValueError, match="empty"):
        synthesize("   ")
    with pytest.raises(ValueError, match="rate_wpm"):
        synthesize("hello", rate_wpm=1000)


def test_missing_espeak_says_to_install_espeak_ng(monkeypatch):
    def no_library(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(espeak_module.ctypes, "CDLL", no_library)
    with pytest.raises(EspeakNotFound, match="espeak-ng"):
        espeak_module._Espeak()


def test_resample_keeps_pitch_level_and_timing():
    t = np.arange(22050) / 22050
    tone = (10000 * np.sin(2 * math.pi * 440 * t)).astype(np.int16)
    out = resample(tone, 22050, SR)
    assert len(out) == SR
    spectrum = np.abs(np.fft.rfft(out.astype(float)))
    assert abs(np.argmax(spectrum) - 440) <= 1  # 1 Hz bins
    assert abs(np.abs(out[100:-100]).max() - 10000) < 300
    click = np.zeros(22050, np.int16)
    click[11025] = 20000  # at 0.5 s
    assert abs(int(np.argmax(resample(click, 22050, SR))) - 8000) <= 1


# ---- visemes --------------------------------------------------------------------------------------
def test_viseme_table_and_coarticulation():
    assert viseme_for("m").target[0] == 0.0 and viseme_for("p").strength == 1.0
    assert viseme_for("A:").target[0] > viseme_for("i:").target[0]  # "father" opens wider than "see"
    assert viseme_for("u:").target[2] > 0.8 and viseme_for("i:").target[1] > 0.5
    assert viseme_for("t#") == viseme_for("t") and viseme_for("_:").target == (0, 0, 0, 0)
    # "ma-ma": the lips close on each m even between open vowels
    phon = [(0, "m"), (80, "A:"), (230, "m"), (310, "A:"), (460, "_")]
    t = np.arange(0, 500, 5.0)
    jaw = mouth_curves(phon, 500, t)[:, 0]
    assert jaw[(t >= 260) & (t <= 285)].min() < 0.15 and jaw[(t >= 140) & (t <= 180)].max() > 0.6
    assert np.abs(np.diff(jaw)).max() < 0.15, "coarticulation keeps the motion smooth (5 ms steps)"


# ---- portraits ------------------------------------------------------------------------------------
def test_shipped_portrait_has_provenance_and_boxes():
    folder = portraits_folder()
    assert (folder / "astronaut.png").stat().st_size <= 300_000
    assert "public domain" in (folder / "PROVENANCE.md").read_text().lower()
    p = astronaut_portrait()
    assert p.image.shape == (256, 256, 3) and p.image.dtype == np.uint8
    x, y, w, h = p.mouth_box
    assert 0 <= x and x + w <= p.width and 0 <= y and y + h <= p.height
    assert y <= p.lip_line_y <= y + h and len(p.eye_boxes) == 2


def test_landmarks_find_the_astronauts_face_mouth_and_eyes():
    """The photo without its JSON, as a user's photo is read: the face mesh places what was measured by eye."""
    p = astronaut_portrait()
    found = detect_face_regions(p.image)
    fx, fy, fw, fh = found["face_box"]
    assert abs(fx - p.face_box[0]) < 8 and abs(fw - p.face_box[2]) < 10
    (mx, my, mw, mh), (tx, ty, tw, th) = found["mouth_box"], p.mouth_box
    assert abs((mx + mw / 2) - (tx + tw / 2)) < 3 and abs((my + mh / 2) - (ty + th / 2)) < 4
    assert abs(mw - tw) < 6 and abs(found["lip_line_y"] - p.lip_line_y) < 3
    assert abs(found["lip_curve"] - p.lip_curve) < 2, "a smile: the corners sit higher than the lip line"
    eyes = found["eye_boxes"]
    assert len(eyes) == 2 and eyes[0][0] < eyes[1][0]
    for (ex, ey, ew, eh), (tx, ty, tw, th) in zip(eyes, p.eye_boxes):
        assert abs((ex + ew / 2) - (tx + tw / 2)) < 4 and abs((ey + eh / 2) - (ty + th / 2)) < 3


def _lips_meet_at(face, xs: np.ndarray) -> np.ndarray:
    """Row (px) where the upper and lower inner lip contours meet, at columns ``xs`` (the middle of the two)."""
    inner = face.lip_inner()
    upper, lower = inner[:11], np.concatenate([inner[:1], inner[11:][::-1], inner[10:11]])
    at = lambda c: np.interp(xs, *c[np.argsort(c[:, 0])].T)  # noqa: E731
    return (at(upper) + at(lower)) / 2


def test_the_mouth_opens_between_the_real_lips():
    """A photo read through the landmarks: the painted opening starts where the lips meet (not a slit below
    them) and stays between the mouth corners; closed, nothing is painted. (With the former Haar-cascade
    placement a real photo measured 17 px below the lips and 18 px past the corners.)"""
    from framegraph.models.face import FaceLandmarker

    p = load_portrait(portraits_folder() / "astronaut.png")
    r = PortraitRenderer(p)
    with FaceLandmarker() as fl:
        face = fl.detect(p.image)[0]
        assert r.opening_mask(FaceParams()).max() == 0
        assert np.array_equal(r.render(FaceParams()).numpy(), p.image)
        left, right = face.mouth_corners()
        for jaw in (0.3, 1.0):
            params = FaceParams(jaw_open=jaw, teeth=0.3)
            img = r.render(params).numpy()
            dark = (r.opening_mask(params).numpy() > 0.5) & (img.mean(axis=2) < 100)
            cols = np.nonzero(dark.any(axis=0))[0]
            assert len(cols) > 0.5 * face.mouth_width(), "the opening spans most of the mouth"
            tops = np.array([np.nonzero(dark[:, c])[0].min() for c in cols])
            below = np.abs(tops - _lips_meet_at(face, cols)).mean()
            assert below < 0.06 * face.mouth_width(), (jaw, below)
            assert left[0] - 1 <= cols.min() and cols.max() <= right[0] + 1, (cols.min(), cols.max(), left, right)
            assert fl.detect(img)[0].mouth_openness() > face.mouth_openness() + 0.03, "the landmarks see it open"


def test_bad_portraits_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_portrait(tmp_path / "missing.png")
    (tmp_path / "notes.txt").write_text("not a picture")
    with pytest.raises(PortraitError, match="not an image"):
        load_portrait(tmp_path / "notes.txt")
    Image.new("RGB", (200, 200), (128, 128, 128)).save(tmp_path / "blank.png")
    with pytest.raises(PortraitError, match="no face found in portrait .*blank.png.*--mouth-box"):
        load_portrait(tmp_path / "blank.png")
    p = load_portrait(tmp_path / "blank.png", mouth_box=(80, 120, 40, 14))  # a box given: no detection needed
    assert p.mouth_box == (80, 120, 40, 14) and len(p.eye_boxes) == 2
    with pytest.raises(PortraitError, match="outside"):
        load_portrait(tmp_path / "blank.png", mouth_box=(190, 120, 40, 14))


def test_large_portraits_are_scaled_and_made_even(tmp_path):
    Image.fromarray(np.repeat(np.repeat(astronaut_portrait().image, 3, 0), 3, 1)[:767, :767]).save(tmp_path / "big.png")
    p = load_portrait(tmp_path / "big.png", max_side=300)
    assert max(p.image.shape[:2]) <= 300 and p.width % 2 == 0 and p.height % 2 == 0


# ---- rendering ------------------------------------------------------------------------------------
def test_opening_the_mouth_changes_the_mouth_and_not_the_rest_of_the_face():
    p = astronaut_portrait()
    r = PortraitRenderer(p)
    closed = r.render(FaceParams()).numpy().astype(float)
    assert np.array_equal(closed.astype(np.uint8), p.image), "rest pose is the portrait itself"
    opened = r.render(FaceParams(jaw_open=0.8, lip_width=0.2, teeth=0.5)).numpy().astype(float)
    diff = np.abs(opened - closed).mean(axis=2)
    x, y, w, h = p.mouth_box
    mouth = diff[int(y):int(y + h + 0.3 * w), int(x):int(x + w)]
    upper_face = diff[int(p.face_box[1]):int(y - 0.5 * w), int(p.face_box[0]):int(p.face_box[0] + p.face_box[2])]
    assert mouth.mean() > 25, "the mouth opens: dark inner mouth, lips apart"
    assert upper_face.mean() < 0.5, "eyes, nose and forehead stay as they were"
    far = np.ones_like(diff, bool)
    y0, y1, x0, x1 = r.roi
    far[y0:y1, x0:x1] = False
    assert diff[far].max() == 0, "nothing changes outside the mouth's region"
    # rounding narrows the mouth, stretching widens it
    wide = r.render(FaceParams(jaw_open=0.3, lip_width=1.0)).numpy().astype(float)
    round_ = r.render(FaceParams(jaw_open=0.3, lip_round=1.0, lip_width=-1.0)).numpy().astype(float)
    dark = lambda im: ((im.mean(axis=2) < 60)[int(y) - 5:int(y + h + 10)]).any(axis=0).sum()  # noqa: E731
    assert dark(wide) > dark(round_)


def test_blinks_and_head_motion():
    p = astronaut_portrait()
    r = PortraitRenderer(p)
    rest = r.render(FaceParams()).numpy().astype(float)
    shut = r.render(FaceParams(blink=1.0)).numpy().astype(float)
    ex, ey, ew, eh = p.eye_boxes[0]
    eye = (slice(int(ey), int(ey + eh)), slice(int(ex), int(ex + ew)))
    assert np.abs(shut[eye] - rest[eye]).mean() > 15
    x, y, w, h = p.mouth_box
    assert np.array_equal(shut[int(y):int(y + h)], rest[int(y):int(y + h)])
    moved = r.render(FaceParams(head_dx=2.0, head_roll_deg=1.5)).numpy().astype(float)
    assert np.abs(moved - rest).mean() > 2


# ---- plans and clips ------------------------------------------------------------------------------
def test_plans_are_deterministic_per_seed():
    a = plan_clip(2.0, 25, clip_seed(7, 0)).ground_truth()
    b = plan_clip(2.0, 25, clip_seed(7, 0)).ground_truth()
    c = plan_clip(2.0, 25, clip_seed(8, 0)).ground_truth()
    assert a == b and a != c
    assert len(a["frames"]) == 50 and a["audio_samples"] == 2 * SR
    spans = [(s["start_s"], s["end_s"]) for s in a["segments"]]
    assert spans[0][0] == 0 and abs(spans[-1][1] - 2.0) < 1e-6
    assert all(abs(e0 - s1) < 1e-3 for (_, e0), (s1, _) in zip(spans, spans[1:])), "segments tile the clip"
    with pytest.raises(ValueError, match="fps"):
        plan_clip(1.0, 7, clip_seed(0, 0))


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="framegraph avatar")
    avatar_front.add_arguments(parser)
    return avatar.run(parser.parse_args(argv))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    assert run_cli(["synth", "--out", str(out), "--clips", "1", "--seconds", "4", "--seed", "3"]) == 0
    return out, read_video(out / "clip_00000.mp4"), json.loads((out / "clip_00000.json").read_text())


def test_synth_clip_has_the_frames_and_ground_truth_asked_for(clip):
    out, video, gt = clip
    assert video["frames"].shape == (100, 256, 256, 3) and video["fps"] == 25
    assert len(gt["frames"]) == 100 and [f["index"] for f in gt["frames"]] == list(range(100))
    keys = {"jaw_open", "lip_width", "lip_round", "teeth", "blink", "head", "state", "time_s"}
    assert keys <= set(gt["frames"][0]) and {"dx", "dy", "roll_deg"} <= set(gt["frames"][0]["head"])
    assert {f["state"] for f in gt["frames"]} <= {"idle", "speaking", "listening"}
    assert "speaking" in {f["state"] for f in gt["frames"]}
    assert gt["portrait"]["name"] == "astronaut" and gt["video"] == "clip_00000.mp4"
    assert gt["portrait"]["region_size"] == 128, "the face crop's side (1.35 x the 95-px face), not a fixed 64"
    times = [e["time_ms"] for e in gt["events"]]
    assert times == sorted(times) and any(e["kind"] == "phoneme" for e in gt["events"])
    index = json.loads((out / "index.json").read_text())
    assert index["clips"][0]["frames"] == 100


def test_synth_clip_audio_is_in_sync_with_the_mouth(clip):
    _, video, gt = clip
    assert video["audio_rate"] == SR and abs(len(video["audio"]) - 4 * SR) < 2048
    jaw = np.array([f["jaw_open"] for f in gt["frames"]])
    rms = frame_rms(video["audio"].astype(float), len(jaw), 25)

    def corr(lag):
        a, b = (jaw[lag:], rms[:len(rms) - lag]) if lag >= 0 else (jaw[:lag], rms[-lag:])
        return np.corrcoef(a, b)[0, 1]

    scores = {lag: corr(lag) for lag in range(-4, 5)}
    assert scores[0] > 0.5, scores
    assert max(scores, key=scores.get) in (-1, 0, 1), f"mouth and sound are out of step: {scores}"


def test_synth_clip_mouth_moves_and_the_face_holds_still(clip):
    _, video, gt = clip
    frames = video["frames"].astype(float)
    jaw = np.array([f["jaw_open"] for f in gt["frames"]])
    head = np.array([[f["head"]["dx"], f["head"]["dy"], f["head"]["roll_deg"]] for f in gt["frames"]])
    blink = np.array([f["blink"] for f in gt["frames"]])
    p = astronaut_portrait()
    x, y, w, h = p.mouth_box
    fx, fy, fw, _ = p.face_box
    # the most open and the most closed frames with nearly the same head pose and eyes open
    calm = np.nonzero(blink < 0.05)[0]
    open_i = calm[np.argmax(jaw[calm])]
    near = calm[np.argsort(np.abs(head[calm] - head[open_i]).sum(axis=1))]
    closed_i = next(i for i in near if jaw[i] < 0.05)
    diff = np.abs(frames[open_i] - frames[closed_i]).mean(axis=2)
    mouth = diff[int(y):int(y + h + 0.3 * w), int(x):int(x + w)].mean()
    forehead = diff[int(fy):int(y - 0.5 * w), int(fx):int(fx + fw)].mean()
    assert jaw[open_i] > 0.4
    assert mouth > 4 * forehead and mouth > 10, (mouth, forehead)


def test_synth_clip_frames_can_be_redrawn_without_the_codec(clip, tmp_path):
    """The folder keeps the portrait drawn on, and the JSON redraws every frame: the renderer's own output,
    the same picture as the MP4 up to the codec's loss."""
    from framegraph.models.synth import can_render_truth, render_truth

    out, video, _ = clip
    assert np.array_equal(np.asarray(Image.open(out / "portrait.png")), astronaut_portrait().image)
    assert can_render_truth(out / "clip_00000.json")
    clean = render_truth(out / "clip_00000.json").numpy().astype(float)
    mp4 = video["frames"].astype(float)
    assert clean.shape == mp4.shape
    psnr = 10 * np.log10(255.0 ** 2 / ((clean - mp4) ** 2).mean(axis=(1, 2, 3)))
    assert psnr.min() > 30, psnr.min()  # crf 20 measures ~37 dB here: the redraw is the same picture
    # a frame redrawn from its parameters is the renderer's own output for them
    gt = json.loads((out / "clip_00000.json").read_text())
    from framegraph.models.synth import face_params

    direct = PortraitRenderer(astronaut_portrait()).render(face_params(gt["frames"][7])).numpy()
    assert np.array_equal(direct, clean[7].astype(np.uint8))
    # what cannot be redrawn says why
    bad = tmp_path / "clip_00000.json"
    bad.write_text(json.dumps({**gt, "portrait": {**gt["portrait"], "name": "someone", "width": 300}}))
    assert not can_render_truth(bad)
    from framegraph.models.synth import clips_portrait  # also the bundle's background when training on them

    assert np.array_equal(clips_portrait(gt["portrait"], out), astronaut_portrait().image)
    assert clips_portrait({**gt["portrait"], "name": "someone", "width": 300}, tmp_path) is None
    with pytest.raises(ValueError, match="portrait image"):
        render_truth(bad)
    bad.write_text(json.dumps({"frames": [{"index": 0}]}))
    assert not can_render_truth(bad)
    with pytest.raises(ValueError, match="not a `framegraph avatar synth` ground truth"):
        render_truth(bad)


def test_synth_cli_errors(tmp_path, capsys):
    assert run_cli(["synth", "--out", str(tmp_path), "--portrait", str(tmp_path / "nope.jpg")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "x.png").write_bytes(b"\x89PNG broken")
    assert run_cli(["synth", "--out", str(tmp_path), "--portrait", str(tmp_path / "x.png")]) == 2
    assert "not an image" in capsys.readouterr().err
    assert run_cli(["synth", "--out", str(tmp_path), "--fps", "7"]) == 2
    assert "must divide 16000" in capsys.readouterr().err


def test_region_size_follows_the_face():
    """Photo avatars generate their face region at about the face's own resolution: multiple of 16, 64..256."""
    from framegraph.models.vae import face_crop_box, region_size

    assert region_size((256, 256), (78, 50, 94, 108)) == 144  # the astronaut through the landmarks
    for face in [(10, 10, 40, 40), (100, 80, 120, 140), (50, 50, 300, 360)]:
        size, crop = region_size((720, 720), face), face_crop_box((720, 720), face)[2]
        assert size % 16 == 0 and 64 <= size <= 256
        assert abs(size - crop) <= 8 or size in (64, 256), (face, size, crop)
    assert region_size((720, 720), (50, 50, 300, 360)) == 256 and region_size((720, 720), (10, 10, 40, 40)) == 64
