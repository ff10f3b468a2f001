"""Training from a person's own talking video: ``prepare_video`` (checks, face / mouth localisation, fps and
audio resampling, clips + JSON + background frame) and ``framegraph avatar train --video`` end to end.

The bad-input tests need only PyAV and OpenCV. The end-to-end tests make the "user's video" with
``framegraph avatar synth`` (needs the system package espeak-ng; skipped without it) and re-encode it the
way a phone would (30 fps, 48 kHz stereo AAC), so the mouth box found can be checked against the synth
ground truth and picture / sound against the original clip."""
from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SR, astronaut, still, tone, write_video, write_wav
from PIL import Image

from framegraph.models.avatar.clips.prepare import MIN_SECONDS, prepare_video
from framegraph.stream.media import MediaError, read_video

TRUTH_MOUTH = (102, 119, 42, 14)  # assets/portraits/astronaut.json


# ---- bad input: clear errors ---------------------------------------------------------------------------
def test_no_audio_track_says_the_avatar_learns_from_speech(tmp_path):
    video = write_video(tmp_path / "mute.mp4", still(astronaut(), 12), 10)
    with pytest.raises(MediaError, match="no audio track; the avatar learns to move its mouth from the speech"):
        prepare_video(video, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_silent_audio_track(tmp_path):
    video = write_video(tmp_path / "silent.mp4", still(astronaut(), 12), 10, np.zeros(12 * SR, np.int16))
    with pytest.raises(MediaError, match="audio track is silent"):
        prepare_video(video, tmp_path / "out", progress=False)


@pytest.mark.parametrize("kind", ["flat", "noise"])
def test_no_face_found(tmp_path, kind):
    rng = np.random.default_rng(0)
    frames = (np.full((120, 160, 160, 3), 128, np.uint8) if kind == "flat"
              else rng.integers(0, 256, (120, 160, 160, 3), dtype=np.uint8))
    video = write_video(tmp_path / f"{kind}.mp4", frames, 10, tone(12))
    with pytest.raises(MediaError, match=r"no face found in 24 sampled frames .*--face-box"):
        prepare_video(video, tmp_path / "out", progress=False)


def test_tiny_resolution_says_what_is_needed(tmp_path):
    small = np.asarray(Image.fromarray(astronaut()).resize((48, 48), Image.LANCZOS))
    video = write_video(tmp_path / "tiny.mp4", still(small, 12), 10, tone(12))
    with pytest.raises(MediaError, match=r"is 48x48 px: too small for a face region of 64 px"):
        prepare_video(video, tmp_path / "out", progress=False)


def test_face_too_small_for_the_region_gives_the_numbers(tmp_path):
    video = write_video(tmp_path / "face.mp4", still(astronaut(), 3), 10, tone(3))
    short = dict(min_seconds=2, sample_frames=8, progress=False)  # a short video keeps the test fast
    # the detected face (~95 px wide, region ~130-146 px) is too small for a 160 px region
    with pytest.raises(MediaError, match=r"the face is too small: the face region would be 1[2-4]\d px \(face \d+x\d+ "
                                         r"px in the 256x256 video\), the avatar's region is 160 px"):
        prepare_video(video, tmp_path / "out", region_size=160, **short)
    # a face box given by the user is measured the same way
    with pytest.raises(MediaError, match=r"face region would be 40 px \(face 30x30 px in the 256x256 video\).*"
                                         r"at least about 48 px wide"):
        prepare_video(video, tmp_path / "out", face_box=(100, 80, 30, 30), **short)
    with pytest.raises(ValueError, match="--face-box 200,200,80,80 is not inside the 256x256 video"):
        prepare_video(video, tmp_path / "out", face_box=(200, 200, 80, 80), **short)


def test_too_short_states_the_minimum(tmp_path):
    video = write_video(tmp_path / "short.mp4", still(astronaut(), 4), 10, tone(4))
    with pytest.raises(MediaError, match=rf"is 4\.0 s long; the avatar needs at least {MIN_SECONDS:g} s"):
        prepare_video(video, tmp_path / "out", progress=False)


def test_unreadable_and_missing_files(tmp_path):
    bad = tmp_path / "notes.mp4"
    bad.write_text("this is not a video\n" * 50)
    with pytest.raises(MediaError, match="not a media file FFmpeg can read"):
        prepare_video(bad, tmp_path / "out", progress=False)
    with pytest.raises(MediaError, match="no such file"):
        prepare_video(tmp_path / "none.mp4", tmp_path / "out", progress=False)
    wav = write_wav(tmp_path / "speech.wav", tone(12))
    with pytest.raises(MediaError, match="has no video stream"):
        prepare_video(wav, tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="must be a whole number dividing 16000"):
        prepare_video(wav, tmp_path / "out", fps=30, progress=False)


def _beep_onsets(audio: np.ndarray) -> np.ndarray:
    """Sample indices where a beep starts: loud (over 3000) after at least 400 quiet samples."""
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > 3000)
    return loud[np.diff(loud, prepend=-1000) > 400]


def test_the_clips_joined_audio_stays_in_sync_with_their_frames(tmp_path):
    """Training joins the prepared clips' audio; each clip's AAC track runs past its frames to whole 1,024-sample
    frames, so a beep must still be where it was in the video, clip after clip (joined uncut, they drift
    later clip by clip: 512 samples too many here)."""
    from framegraph.models.avatar.video.train import clips_audio
    from framegraph.stream.media import decode_audio

    t = np.arange(SR // 10) / SR
    beep = (10000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    audio = np.zeros(12 * SR, np.int16)
    for k in range(1, 12):
        audio[k * SR + 3 * SR // 10:][:len(beep)] = beep
    video = write_video(tmp_path / "beeps.mp4", still(astronaut(), 12), 10, audio)
    prep = prepare_video(video, tmp_path / "clips", segment_seconds=3, progress=False)
    assert len(prep.clips) == 4
    joined = clips_audio(prep.clips)
    assert len(joined) == prep.frames * SR // prep.fps
    found, truth = _beep_onsets(joined), _beep_onsets(decode_audio(video))
    assert len(found) == len(truth) == 11
    assert np.abs(found - truth).max() <= 48, f"beeps moved by {found - truth} samples"


def test_train_cli_reports_bad_video_with_exit_code_2(tmp_path, capsys):
    from framegraph.apps.cli import main

    video = write_video(tmp_path / "mute.mp4", still(astronaut(), 12), 10)
    out = tmp_path / "bundle"
    assert main(["avatar", "train", "--video", video, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "framegraph avatar train: error:" in err and "no audio track" in err
    assert main(["avatar", "train", "--video", str(tmp_path / "none.mp4"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["avatar", "train", "--clips", str(tmp_path), "--face-box", "1,2,3,4", "--out", str(out)]) == 2
    assert "go with --video" in capsys.readouterr().err
    assert main(["avatar", "train", "--clips", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # one source only
        main(["avatar", "train", "--video", video, "--clips", str(tmp_path), "--out", str(out)])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["avatar", "train", "--video", video, "--critic-weight", "-1", "--out", str(out)])
    assert "'-1': expected a number ≥ 0" in capsys.readouterr().err


def test_rotated_phone_video_is_turned_upright(tmp_path):
    canvas = np.full((256, 320, 3), 90, np.uint8)
    canvas[:, 32:288] = astronaut()
    stored = np.ascontiguousarray(np.rot90(canvas, -1))  # stored on its side, played upright
    video = write_video(tmp_path / "phone.mp4", still(stored, 3), 10, tone(3), rotation=90)
    r = prepare_video(video, tmp_path / "out", min_seconds=2, progress=False)
    assert (r.portrait["width"], r.portrait["height"]) == (320, 256) and r.source["rotation_turns"] == 1
    mx, my, mw, mh = r.portrait["mouth_box"]
    assert abs(mx - (TRUTH_MOUTH[0] + 32)) <= 3 and abs(my - TRUTH_MOUTH[1]) <= 3
    frames = read_video(r.clips[0])["frames"]
    assert frames.shape[1:] == (256, 320, 3) and np.abs(frames[0].astype(int) - canvas).mean() < 4


# ---- end to end on a synthetic talking clip ------------------------------------------------------------
@pytest.fixture(scope="module")
def user_video(tmp_path_factory, astronaut_talking_clip):
    """The 12 s talking clip made by `framegraph avatar synth`, re-encoded at 30 fps with 48 kHz stereo."""
    from framegraph.models.avatar.portrait.data import clip_audio

    root = tmp_path_factory.mktemp("video")
    clip = astronaut_talking_clip
    frames, audio = read_video(clip)["frames"], clip_audio(clip)
    n30 = len(frames) * 30 // 25
    pick = np.minimum(np.round(np.arange(n30) * 25 / 30).astype(int), len(frames) - 1)
    video = write_video(root / "me talking.mp4", frames[pick], 30, audio, out_rate=48_000, layout="stereo")
    truth = json.loads(clip.with_suffix(".json").read_text())
    return {"video": video, "frames": frames, "audio": audio, "truth": truth}


def _envelope(x: np.ndarray, n: int) -> np.ndarray:
    x = np.concatenate([x, np.zeros(max(0, n * 640 - len(x)), np.int16)])[:n * 640].astype(np.float64)
    return np.sqrt((x.reshape(n, 640) ** 2).mean(axis=1))


def test_prepare_video_finds_the_mouth_and_keeps_picture_and_sound_in_sync(user_video, tmp_path):
    from framegraph.models.avatar.portrait.data import clip_audio
    from framegraph.models.vae import load_face_clips

    r = prepare_video(user_video["video"], tmp_path / "clips", segment_seconds=6, progress=False)
    assert r.fps == 25 and r.frames == 300 and len(r.clips) == 2 and not r.reused
    assert r.source["fps"] == 30 and r.detection["found"] >= 20
    # one stable mouth box, a few px from the synth ground truth (and from the portrait's own; the face mesh's
    # outer-lip box is up to 6 px taller than the hand-measured one and moves with the speaking jaw)
    mouth = r.portrait["mouth_box"]
    assert np.abs(np.array(mouth) - np.array(user_video["truth"]["portrait"]["mouth_box"])).max() <= 6, mouth
    # the clips: synth-like JSON without mouth ground truth
    for i, path in enumerate(r.clips):
        meta = json.loads(open(path[:-4] + ".json").read())
        assert meta["truth"] is False and meta["portrait"]["mouth_box"] == mouth and meta["n_frames"] == 150
        assert meta["frames"][3] == {"index": 3, "time_s": 0.12}
        assert meta["source"]["start_s"] == 6.0 * i
    frames = np.concatenate([read_video(p)["frames"] for p in r.clips]).astype(np.int16)
    audio = np.concatenate([clip_audio(p)[:150 * 640] for p in r.clips])
    assert frames.shape == (300, 256, 256, 3) and len(audio) == 300 * 640
    # picture: frame k of the clips is frame k of the original (30 fps in between), within codec noise
    src = user_video["frames"].astype(np.int16)
    d = np.array([[np.abs(frames[k] - src[j]).mean() for j in (k - 1, k, k + 1)] for k in range(1, 299)])
    assert (d[:, 1] <= d.min(axis=1) + 0.05).mean() > 0.94 and d[:, 1].mean() < 4  # still frames: codec noise
    # sound: aligned to the picture (48 kHz stereo → 16 kHz mono, AAC priming handled)
    e1, e2 = _envelope(audio, 300), _envelope(user_video["audio"], 300)
    corr = {lag: np.corrcoef(e1[max(0, lag):300 + min(0, lag)], e2[max(0, -lag):300 - max(0, lag)])[0, 1]
            for lag in (-2, -1, 0, 1, 2)}
    assert max(corr, key=corr.get) == 0 and corr[0] > 0.95, corr
    # the background frame, and the training data reader copes with clips without ground truth
    bg = np.asarray(Image.open(r.portrait_path))
    assert bg.shape == (256, 256, 3) and np.abs(bg.astype(int) - np.median(src[:50], axis=0)).mean() < 4
    faces = load_face_clips(r.clips_dir, size=64)
    assert [f.shape[0] for f in faces.frames] == [150, 150] and faces.crop_box[2] >= 64
    # the same file and settings: the clips are reused, not rewritten
    again = prepare_video(user_video["video"], tmp_path / "clips", segment_seconds=6, progress=False)
    assert again.reused and again.clips == r.clips and again.portrait == r.portrait


def test_train_cli_on_a_video_end_to_end_portrait_kind(user_video, tmp_path):
    from framegraph.apps.cli import main
    from framegraph.models.avatar import RunSettings, load_avatar, render_avatar_graph
    from framegraph.stream.progress import run_with_progress

    out = tmp_path / "me"
    rc = main(["avatar", "train", "--video", user_video["video"], "--kind", "portrait", "--out", str(out),
               "--vae-steps", "4", "--steps", "4", "--distill-steps", "0", "--rollout-steps", "0", "--region", "64",
               "--threads", "1", "--batch", "2", "--window", "4", "--dit-width", "32", "--dit-depth", "1",
               "--dit-heads", "2", "--segment-seconds", "6"])
    assert rc == 0
    assert len(list((out / "train" / "video_clips").glob("clip_*.mp4"))) == 2
    a = load_avatar(out)
    assert a.fps == 25 and a.region_size == 64 and (a.width, a.height) == (256, 256)
    assert np.abs(np.array(a.mouth_box) - np.array(TRUTH_MOUTH)).max() <= 6  # the face mesh's outer-lip box
    report = json.loads((out / "train_report.json").read_text())
    assert report["clips"] == 2 and report["frames"] == 300
    # the bundle speaks: a few frames from half a second of audio
    wav = write_wav(tmp_path / "hi.wav", user_video["audio"][:SR // 2])
    graph, sink, total = render_avatar_graph(out, wav, str(tmp_path / "hi.mp4"), RunSettings(device="cpu"))
    rep = run_with_progress(graph, sink, total, desc="render")
    assert not rep["interrupted"] and sink.frames_written == total >= 12
    assert read_video(tmp_path / "hi.mp4")["frames"].shape[1:] == (256, 256, 3)
