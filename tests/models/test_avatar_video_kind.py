"""The video avatar (bundle kind "video"): the person's own frames looped back and forth, the lower face
redrawn for a mouth shape that comes from the audio, pasted back with a feathered mask.

The loop and region tests need nothing but torch. The end-to-end ones make the "user's video" with
``framegraph avatar synth`` on the shipped astronaut photo (needs the system package espeak-ng; skipped
without it), train a small avatar on it for a few hundred steps and look at what a user sees: where the
pixels change, whether the mouth opens, the rendered MP4's frames and sound."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import SR, astronaut, still, tone, write_video, write_wav

from framegraph.models.avatar.video.bundle import MAX_MODEL_SIZE, box_side_for, model_size, paste_mask, texture_mask
from framegraph.models.avatar.video.loop import LoopCursor, nearest_frames, pingpong_next
from framegraph.stream.media import MediaError, read_video
from framegraph.stream.quality import psnr


# ---- the loop ------------------------------------------------------------------------------------------
def _walk_frames(n: int, seed: int = 0) -> np.ndarray:
    """``uint8 [n, 24, 32, 3]``: a soft bright blob moving smoothly (a random walk), like a head in a video."""
    rng = np.random.default_rng(seed)
    pos = np.cumsum(rng.normal(0, 0.6, (n, 2)), 0)
    pos = 8 + (pos - pos.min(0)) / np.ptp(pos, 0).clip(1e-6) * np.array([16, 8])
    yy, xx = np.mgrid[0:24, 0:32]
    blob = [np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / 18.0) for x, y in pos]
    return np.repeat((40 + 180 * np.stack(blob)).round().astype(np.uint8)[..., None], 3, axis=3)


def _play(frames: np.ndarray, cursor: LoopCursor, speaking: list[bool]) -> tuple[list, np.ndarray]:
    """The cursor's picks and the frames shown (cross-fades blended as VideoLoop blends them)."""
    picks, shown = [], []
    for s in speaking:
        p = cursor.step(s)
        picks.append(p)
        shown.append(sum(frames[i].astype(np.float64) * w for i, w in p))
    return picks, np.stack(shown)


def _steps(shown: np.ndarray) -> np.ndarray:
    return np.abs(np.diff(shown, axis=0)).mean(axis=(1, 2, 3))


def test_loop_is_a_ping_pong_without_jumps():
    frames = _walk_frames(20)
    picks, shown = _play(frames, LoopCursor(20, (5, 10)), [True] * 60)
    idx = [p[0][0] for p in picks]
    assert idx[:21] == list(range(1, 20)) + [18, 17]  # forward, turn at the end, back
    assert all(abs(a - b) == 1 for a, b in zip(idx, idx[1:]))  # always a neighbouring frame of the recording
    steps = _steps(shown)
    turns = [k for k in range(1, len(idx) - 1) if idx[k - 1] == idx[k + 1]]
    inside = [k for k in range(len(steps)) if k not in turns and k + 1 not in turns]
    assert turns and max(steps[k] for k in turns) <= max(steps[k] for k in inside)
    assert pingpong_next(3, 1, 3, 4) == (3, 1)  # a one-frame range stays put


def test_silence_switches_to_the_idle_range_without_a_jump():
    frames = _walk_frames(60, seed=3)
    idle = (40, 52)
    near = nearest_frames(frames.mean(3), range(*idle))
    cursor = LoopCursor(60, idle, near, fade=4)
    picks, shown = _play(frames, cursor, [True] * 15 + [False] * 40 + [True] * 10)
    assert picks[14][0][0] < idle[0]  # speaking: outside the idle range
    for p in picks[15 + 4:55]:  # after the cross-fade: only idle frames, a ping-pong inside the range
        assert len(p) == 1 and idle[0] <= p[0][0] < idle[1]
    steps = _steps(shown)
    loop_step = _steps(frames[[p[0][0] for p in picks]])[:13].max()  # the recording's own motion
    cut = np.abs(frames[picks[15][0][0]].astype(float) - frames[picks[14][0][0]]).mean()
    # the fade spreads the (already small) jump: each step of the switch is at most the loop's motion plus a
    # fifth of the cut, and the first one a fifth of it
    assert steps[14] <= cut / 5 + 1e-9 and steps[13:20].max() <= loop_step + cut / 5 + 1e-9
    assert np.abs(frames[near[14]].astype(float) - frames[14]).mean() <= \
        min(np.abs(frames[j].astype(float) - frames[14]).mean() for j in range(*idle)) + 1e-9
    # speech again: it carries on from where it is, to neighbouring frames
    assert abs(picks[55][0][0] - picks[54][0][0]) == 1


def test_a_stream_starts_in_the_idle_range_without_a_cross_fade():
    """Streams start silent: the first frames out are the idle range's own (no cross-fade from frame 0 to
    compute before the first one); speech then plays on from there, a neighbouring frame per step."""
    from framegraph.models.audio.frontend import STATE_DIM
    from framegraph.models.avatar.video.loop import VideoLoop
    from framegraph.stream import Graph, IterableSource, PortSpec, RecordingSink

    frames = torch.as_tensor(_walk_frames(30, seed=5))
    boxes = np.tile([[4, 4, 16, 16]], (30, 1))
    silent, speaking = torch.tensor([1.0, 0, 0, 0]), torch.tensor([0, 1.0, 0, 1.0])
    g = Graph(name="loop")
    states = g.add(IterableSource([silent] * 3 + [speaking] * 3, PortSpec((STATE_DIM,)), port="state"))
    loop = g.add(VideoLoop(frames, boxes, idle=(12, 20)))
    sink = g.add(RecordingSink({"frame": loop.outputs["frame"]}))
    g.connect(states, loop)
    g.connect(loop, sink, "frame")
    g.run()
    shown = sink.data()
    picks = [next((i for i in range(30) if torch.equal(f, frames[i])), None) for f in shown]
    assert None not in picks, picks  # every frame shown is a recorded frame, none a blend
    assert 12 <= picks[0] < 20 and all(abs(a - b) == 1 for a, b in zip(picks, picks[1:])), picks
    at = loop.cursor.i
    loop.reset()  # a barge-in: the loop goes on from where it is (back to the start would show as a cut)
    assert abs(loop.cursor.step(True)[0][0] - at) == 1


def test_the_mouth_regions_picture_path_is_warmed_once_per_process_and_size():
    """Each session's MouthRegion runs its picture path once at setup only the first time in the process
    for that generator and box size (later sessions' kernels are warm: the run would only delay them)."""
    from framegraph.models.avatar.video.bundle import random_video_avatar
    from framegraph.models.avatar.video.stages import MouthRegion

    a = random_video_avatar(n_frames=2, region_size=32)
    calls = []
    a.generator.register_forward_hook(lambda *_: calls.append(1))
    args = (a.generator, a.mask, a.paste, a.reference)
    counts = []
    for side in (a.box_side, a.box_side, a.box_side + 8):
        MouthRegion(*args, frame_size=(a.height, a.width), box_side=side).setup(None)
        counts.append(len(calls))
    assert counts == [1, 1, 2]


# ---- region size and paste mask ------------------------------------------------------------------------
def test_region_size_follows_the_face_and_is_capped():
    assert box_side_for(101) == 112 and model_size(box_side_for(101)) == 112  # the video's own pixels
    assert box_side_for(180) == model_size(box_side_for(180)) == 192
    assert box_side_for(250) == model_size(box_side_for(250)) == MAX_MODEL_SIZE == 256
    assert box_side_for(429) == 428 and model_size(box_side_for(429)) == 256  # a big face: 256², the speed cap
    assert box_side_for(101, cap=64) == 100 and model_size(100, 64) == 64
    with pytest.raises(ValueError, match="the face is too small: its lower-face region is 48 px"):
        model_size(box_side_for(48))
    with pytest.raises(ValueError, match="its lower-face region is 60 px"):  # not rounded up into the minimum
        model_size(box_side_for(60))


def test_shape_head_swings_as_wide_as_the_person_and_rests_where_they_rest():
    """A regression answers what it cannot tell apart with the mean, so its mouth swings less than the
    person's; the fitted gain scales it back about the person's mean shape — on new speech the mouth is open
    as far as theirs on average — while silence still gives the rest shape, far from that mean."""
    from framegraph.models.avatar.video.lipsync import context_windows, fit_shape_head

    g = torch.Generator().manual_seed(0)

    def person(T):  # features [T, 16] (the last one: silence); shapes [T, 3], partly told by the audio
        f = torch.randn(T, 16, generator=g)
        f[:, -1] = 0
        return f, f[:, :3] + 0.8 * torch.randn(T, 3, generator=g)

    feats, shapes = person(2000)
    quiet, rest = [torch.zeros(200, 16)], torch.tensor([-1.5, 0.2, 0.0])
    quiet[0][:, -1] = 1
    new_feats, new_shapes = person(2000)
    swing = {}
    for max_gain in (1.0, 2.0):
        head, report = fit_shape_head(feats, shapes, context=1, quiet_features=quiet, rest=rest, max_gain=max_gain)
        with torch.no_grad():
            pred = head(context_windows(new_feats, 1))
            at_rest = head(context_windows(quiet[0], 1))
        swing[max_gain] = float(pred[:, 0].std() / new_shapes[:, 0].std())
        assert torch.allclose(at_rest.mean(0), rest, atol=0.15), "silence still gives the resting mouth"
        assert torch.allclose(pred.mean(0), new_shapes.mean(0), atol=0.1), "speech is as open as theirs on average"
    assert report["gain"] > 1.2 and swing[1.0] < 0.85 < swing[2.0] < 1.15


def test_the_gain_is_measured_on_folds_that_see_nearly_every_frame():
    """More inputs than frames, as Whisper's 1,152 numbers per frame on a 16-s video. A fit on 3/4 of the frames
    swings less on new speech than the final fit on all of them. So a gain measured on 4 folds overshoots: on new
    speech the mouth swung 1.15 as wide as the person's. Measured on 8 folds it swings nearer their own."""
    from framegraph.models.avatar.video.lipsync import GAIN_FOLDS, context_windows, fit_shape_head

    g = torch.Generator().manual_seed(0)
    w = torch.randn(600, 3, generator=g) / 600 ** 0.5

    def person(T):  # features [T, 600]; shapes [T, 3], each told a little by every feature
        f = torch.randn(T, 600, generator=g)
        return f, f @ w + 0.5 * torch.randn(T, 3, generator=g)

    feats, shapes = person(400)
    new_feats, new_shapes = person(3000)
    gain, swing = {}, {}
    for k in (4, GAIN_FOLDS):
        head, report = fit_shape_head(feats, shapes, context=1, gain_folds=k)
        with torch.no_grad():
            swing[k] = float(head(context_windows(new_feats, 1))[:, 0].std() / new_shapes[:, 0].std())
        gain[k] = report["gain"]
        assert report["gain_folds"] == k
    assert GAIN_FOLDS == 8 and gain[8] < gain[4] < 2.0, "fits on more frames shrink less: a smaller gain"
    assert swing[4] > 1.12 and abs(swing[8] - 1) < abs(swing[4] - 1)


def test_speech_in_a_voice_the_person_never_recorded_follows_its_known_shapes():
    """The measured defect, reproduced: in the person's recording loudness goes with openness, so the head leans
    on it; typed text comes in eSpeak's voice, loud throughout, and the head drew it 0.7 std too open. Rows of
    that voice with known shapes (``known``) put it on its shapes, scaled by the same gain, and leave the person's
    own speech predicted as before, as wide. (Whether the loudness pushes the mouth open or shut depends on how the
    ridge splits the weight between the two: here shut.)"""
    from framegraph.models.avatar.video.lipsync import context_windows, fit_shape_head

    g = torch.Generator().manual_seed(2)

    def person(T):  # dim 0: what the mouth does; dim 1: loudness, which goes with it in this person's voice
        f = torch.randn(T, 16, generator=g)
        f[:, 1] = f[:, 0] + 0.3 * torch.randn(T, generator=g)
        o = f[:, 0] + 1.2 * torch.randn(T, generator=g)  # partly told by the audio: the gain is > 1
        return f, torch.stack([o, -0.5 * o, 0.3 * o], 1)

    def typed_voice(T):  # the same phonetic dim; loud throughout; its mouth a std more open than the person's mean
        f = torch.randn(T, 16, generator=g)
        f[:, 1] = 4.0 + 0.3 * torch.randn(T, generator=g)
        o = f[:, 0] + 1.0
        return f, torch.stack([o, -0.5 * o, 0.3 * o], 1)

    feats, shapes = person(1500)
    new_feats, new_shapes = person(2000)
    known = [typed_voice(250) for _ in range(2)]
    test_feats, test_shapes = typed_voice(1000)
    out = {}
    for name, rows in (("without", []), ("with", known)):
        head, report = fit_shape_head(feats, shapes, context=1, known=rows)
        with torch.no_grad():
            own, typed = head(context_windows(new_feats, 1))[:, 0], head(context_windows(test_feats, 1))[:, 0]
        out[name] = (float(torch.corrcoef(torch.stack([own, new_shapes[:, 0]]))[0, 1]),
                     float(typed.mean() - test_shapes[:, 0].mean()),
                     float(torch.corrcoef(torch.stack([typed, test_shapes[:, 0]]))[0, 1]), report,
                     float(own.std() / new_shapes[:, 0].std()))
    assert abs(out["without"][1]) > 0.6, "the defect: the typed voice drawn far off the person's range"
    assert abs(out["with"][1]) < 0.2 and out["with"][2] > 0.95, "on its known shapes"
    assert out["with"][3]["gain"] > 1.2 and out["with"][3]["known_rows"] == 500
    assert out["with"][0] > out["without"][0] - 0.03, "the person's own speech as before"
    # and as wide as theirs: the gain is measured on folds fitted with the known rows asking what the final fit
    # asks (scaled by it); measured with them unscaled, the own speech swung 0.88 as wide
    assert 0.93 < out["with"][4] < 1.1 and 0.93 < out["without"][4] < 1.1


def test_typed_rows_put_the_phonemes_jaw_on_the_persons_speaking_range():
    """eSpeak sentences' shapes: while speaking, the phonemes' jaw standardised onto the person's openness mean
    and std; silent frames at rest; width and roundness on the person's own lines."""
    from framegraph.models.avatar.video.espeak_rows import typed_rows
    from framegraph.models.avatar.video.train import _audio_encoder
    from framegraph.models.synth import espeak_available

    if not espeak_available():
        pytest.skip("needs the system package espeak-ng")
    g = torch.Generator().manual_seed(3)
    o = 0.4 + 1.3 * torch.randn(500, generator=g)
    o[400:] = -1.0  # the person speaks in the first 400 frames
    shapes = torch.stack([o, 0.2 - 0.6 * o, 0.5 * o], 1)
    speech = np.r_[np.ones(400), np.zeros(100)]
    rest = torch.tensor([-1.0, 0.8, -0.5])
    encoder, _ = _audio_encoder(None)
    rows, report = typed_rows(encoder, shapes, speech, rest, 25.0, sentences=3, seed=0)
    assert len(rows) == 3 and report["frames"] == sum(len(f) for f, _ in rows)
    person = report["person_speaking_openness"]
    assert abs(person["mean"] - float(o[:400].mean())) < 1e-4 and abs(person["std"] - float(o[:400].std())) < 1e-2
    targets = torch.cat([t for _, t in rows])
    silent = (targets == rest).all(1)
    assert 0.02 < float(silent.float().mean()) < 0.6, "pauses and the ends of the sentences rest"
    spoken = targets[~silent]
    assert abs(float(spoken[:, 0].mean()) - person["mean"]) < 0.05
    assert abs(float(spoken[:, 0].std()) - person["std"]) < 0.1
    slope = torch.tensor([-0.6, 0.5])
    assert torch.allclose(spoken[:, 1:], spoken[:, :1] * slope + torch.tensor([0.2, 0.0]), atol=0.05)
    assert typed_rows(encoder, shapes, speech, rest, 25.0, sentences=0) == ([], {"sentences": 0})


def test_a_negative_count_of_typed_sentences_is_refused_with_what_is_expected(tmp_path, capsys):
    from framegraph.apps.cli import main

    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal, before anything is read
        main(["avatar", "train", "--video", str(tmp_path / "me.mp4"), "--out", str(tmp_path / "b"),
              "--typed-sentences", "-1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--typed-sentences" in err and "'-1': expected a whole number ≥ 0" in err


def test_width_and_roundness_follow_the_predicted_openness_as_the_persons_do():
    """The audio tells openness apart far better than width or roundness; their own regressions sit near their
    means whatever the openness, a mouth the person never made. Following the openness they stay on the person's
    own line, and the openness itself is the head's as before."""
    from framegraph.models.avatar.video.lipsync import context_windows, fit_shape_head, follow_openness

    g = torch.Generator().manual_seed(1)
    f = torch.randn(3000, 16, generator=g)
    openness = f[:, 0] + 0.5 * torch.randn(3000, generator=g)
    width = -0.6 * openness + 0.3 * torch.randn(3000, generator=g)  # this person's mouth narrows as it opens
    roundness = 0.4 * openness + 0.9 * torch.randn(3000, generator=g)
    shapes = torch.stack([openness, width, roundness], 1)
    rest = torch.tensor([-1.2, 0.5, 0.1])
    head, _ = fit_shape_head(f, shapes, context=1, ridge=0.01, rest=rest)
    followed, new_rest, report = follow_openness(head, shapes, rest)
    with torch.no_grad():
        before, after = head(context_windows(f, 1)), followed(context_windows(f, 1))
    assert torch.allclose(after[:, 0], before[:, 0], atol=1e-5), "the openness is the head's own"
    assert abs(report["slope"][0] + 0.6) < 0.05 and abs(report["slope"][1] - 0.4) < 0.05
    line = torch.tensor(report["slope"]) * after[:, :1] + torch.tensor(report["intercept"])
    assert torch.allclose(after[:, 1:], line, atol=2e-3), "width and roundness on the person's own line"
    assert new_rest[0] == rest[0] and torch.allclose(new_rest[1:], torch.tensor(report["slope"]) * rest[0]
                                                     + torch.tensor(report["intercept"]), atol=2e-3)


def test_paste_mask_is_feathered_and_inside_the_hidden_area():
    mask = torch.zeros(64, 64)
    mask[20:60, 8:56] = 1
    alpha = paste_mask(mask, feather_px=6)
    assert alpha.max() == 1.0 and (alpha[mask == 0] == 0).all()
    ramp = alpha[40, 8:32]
    assert (ramp.diff() >= -1e-6).all() and 0 < ramp[4] < 1  # rises smoothly from the edge


def test_texture_map_keeps_off_the_lips_and_ramps_up_inside_the_hidden_area():
    mask = torch.zeros(64, 64)
    mask[20:60, 8:56] = 1
    lips = torch.zeros(64, 64)
    lips[34:42, 24:40] = 1
    t = texture_mask(mask, lips, margin_px=2)
    assert (t[mask == 0] == 0).all() and (t[lips > 0] == 0).all()
    assert (t[32:44, 22:42] == 0).all()  # nothing within the margin of the lips
    assert t[56, 10] == 1.0 and t[22, 50] == 1.0  # the far lower face: all the frame's own texture
    ramp = t[38, 40:52]
    assert (ramp.diff() >= -1e-6).all() and 0 < ramp[4] < 1  # rises smoothly away from the lips


def test_the_base_frame_is_kept_at_and_below_its_jaw_line():
    from framegraph.models.avatar.video.jaw import JAW_MARGIN, kept_share

    a = np.linspace(0, np.pi, 13)  # a chin: the lower half of an ellipse, in px of a frame
    line = np.stack([180 + 50 * np.cos(a), 150 + 60 * np.sin(a)], 1)
    box = (100, 60, 160, 160)  # the region: x 100..260, y 60..220; the chin's lowest point at region (80, 150)
    share = kept_share(line, box)
    assert share.shape == (160, 160) and share.min() == 0 and share.max() == 1
    below = 150 - int(JAW_MARGIN * 160)  # the cut: the jaw line raised by the margin
    assert (share[below:, 80] == 1).all(), "the jaw line itself and the collar under it: the frame's own"
    assert (share[:130, 80] == 0).all() and (share[:80] == 0).all(), "the mouth and the lower face above: redrawn"
    column = share[:, 80]
    assert (column.diff() >= -1e-6).all() and ((column > 0) & (column < 1)).sum() >= 3, "a ramp, not a cut"
    assert share[120, 5] == 1 and share[120, 155] == 1, "past the jaw angles, below their height: kept too"
    moved = kept_share(line + (0, 10), box)  # the head lower in the next frame: the kept part follows it
    assert torch.equal(moved[10:, 80], share[:-10, 80])


def test_texture_map_is_saved_with_the_bundle_and_older_bundles_have_none(tmp_path):
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.video.bundle import random_video_avatar, save_video_avatar

    a = random_video_avatar(n_frames=4, region_size=32)
    save_video_avatar(tmp_path / "old", a)
    assert load_avatar(tmp_path / "old").texture is None  # a bundle from before the map: no texture laid
    lips = torch.zeros(32, 32)
    lips[20:24, 12:20] = 1
    a.texture = texture_mask(a.mask, lips, margin_px=1)
    save_video_avatar(tmp_path / "new", a)
    assert torch.equal(load_avatar(tmp_path / "new").texture, a.texture)


# ---- end to end on a synthetic talking clip ------------------------------------------------------------
@pytest.fixture(scope="module")
def talking(tmp_path_factory, astronaut_talking_clip):
    """The 12 s talking clip of the astronaut (`framegraph avatar synth`) and a video avatar trained on it."""
    from framegraph.models.avatar.portrait.data import clip_audio
    from framegraph.models.avatar.video.train import train_video_avatar

    root = tmp_path_factory.mktemp("vavatar")
    clip = astronaut_talking_clip
    torch.manual_seed(0)
    avatar, report = train_video_avatar(clip, root / "bundle", steps=600, batch=8, holdout=0.2, loop_seconds=6,
                                        max_region=64, progress=False, torch_threads=1)
    truth = json.loads(clip.with_suffix(".json").read_text())
    return {"root": root, "clip": clip, "audio": clip_audio(clip), "avatar": avatar, "report": report,
            "truth": truth, "bundle": root / "bundle"}


def _openness(frames) -> np.ndarray:
    from framegraph.models.face import FaceLandmarker

    with FaceLandmarker(max_faces=1) as m:
        return np.array([m.detect(np.ascontiguousarray(f))[0].mouth_openness() for f in frames])


@pytest.mark.slow
def test_bundle_provenance_names_the_source_and_how_it_was_trained(talking):
    import hashlib

    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.video.features import CHOICES

    text, r = (talking["bundle"] / "PROVENANCE.md").read_text(), talking["report"]
    assert f"`{talking['clip'].name}`" in text and hashlib.sha256(talking["clip"].read_bytes()).hexdigest() in text
    assert f"{r['config']['steps']} steps" in text and f"trained on the first {r['train_frames']}, " in text
    assert f"correlation {r['heldout']['shape_openness_corr']:.3f}" in text
    assert r["critic"]["dropped_at"] is None and "the lips' texture critic at weight 0.1 from step 500" in text
    typed = r["shape_head"]["typed"]
    assert typed["sentences"] == 6 and f"at {typed['check']['openness_vs_phoneme_jaw_corr']:.3f}" in text
    feats = r["shape_head"]["features"]  # what the head hears: the best of the candidates by their folds
    scores = feats["cv_openness_corr"]
    assert set(scores) == set(CHOICES) and scores[feats["chosen"]] == max(scores.values())
    assert r["audio_features"] == feats["chosen"] and "- the shape head hears the audio encoder's features" in text
    a = load_avatar(talking["bundle"])
    assert (a.whisper is None) == (feats["chosen"] == "encoder")
    assert a.shape_head.config.feature_dim == a.audio.feature_dim + (0 if a.whisper is None else a.whisper["dim"])


@pytest.mark.slow
def test_asking_for_the_calibrated_openness_draws_the_persons(talking):
    """The openness the head asks of the generator was calibrated at the end of training: loop frames redrawn for
    what the head asks from training frames' sound (as the avatar plays) open the mouth as wide as the person did
    in those frames, on average — closer than the same head without the shift."""
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.video.lipsync import context_windows, follow_openness
    from framegraph.models.avatar.video.openness import MIN_FRAMES, calibrate_openness, drawn_openness
    from framegraph.models.avatar.video.sync import shift_audio
    from framegraph.models.avatar.video.train import track_faces

    r = talking["report"]
    calib = r["shape_head"]["openness_calibration"]
    assert calib["used"] and calib["frames"] >= MIN_FRAMES and calib["offset"] > 0, calib
    provenance = (talking["bundle"] / "PROVENANCE.md").read_text()
    assert f"- openness calibrated: on {calib['frames']} loop frames redrawn for what the shape head" in provenance
    a = load_avatar(talking["bundle"])
    n = r["train_frames"]
    track = track_faces(iter(read_video(talking["clip"])["frames"][:n]), "training frames")
    z = torch.from_numpy((track.shapes - np.array(a.shape_mean)) / np.array(a.shape_std)).float()
    audio = shift_audio(talking["audio"], a.av_offset_frames, SR // int(a.fps))
    with torch.no_grad():
        windows = context_windows(a.hear(audio)[:n], a.shape_head.config.context)
    before, _ = calibrate_openness(a.shape_head, a.rest_shape, -calib["offset"])
    before, _, _ = follow_openness(before, z, torch.tensor(a.rest_shape))  # the head as training fitted it
    picks = np.arange(0, n, 3)
    loop = np.random.default_rng(1).integers(0, len(a.frames), len(picks))  # each on a loop frame

    def drawn(head):
        with torch.no_grad():
            asked = head(windows)[picks]
        return drawn_openness(a, a.frames[loop].numpy(), a.boxes[loop], asked, a.jaws[loop])

    now, then, person = drawn(a.shape_head), drawn(before), track.shapes[picks, 0]
    assert np.isfinite(now).mean() >= 0.9
    miss, miss_before = abs(np.nanmean(now) - person.mean()), abs(np.nanmean(then) - person.mean())
    assert miss <= 0.05 * person.mean() and miss < miss_before, (miss, miss_before, person.mean(), calib)


@pytest.mark.slow
def test_typed_text_moves_the_drawn_mouth_with_its_phonemes(talking):
    """What a user who types sees: eSpeak sentences the avatar never learnt, drawn on its loop — the mouth opens
    and closes with the phonemes' jaw, and is more open while the voice speaks than in its pauses."""
    from framegraph.models.avatar.eval.video import evaluate_typed_text

    typed = evaluate_typed_text(talking["avatar"])
    assert typed["frames"] > 200 and typed["drawn_vs_phoneme_jaw_corr"] > 0.5, typed
    assert typed["drawn_speaking_openness"]["mean"] > typed["drawn_silent_openness_mean"], typed


@pytest.mark.slow
def test_bundle_geometry_follows_the_face(talking):
    from framegraph.models.avatar import load_avatar

    r, a = talking["report"], load_avatar(talking["bundle"])
    assert a.kind == "video" and (a.width, a.height) == (256, 256) and a.fps == 25
    assert 80 <= r["face_width_px"] <= 120  # the astronaut's face in the 256² photo
    assert a.box_side == box_side_for(r["face_width_px"], cap=64) and a.region_size == model_size(a.box_side, 64) == 64
    assert len(a.frames) == 150 and r["train_frames"] == 240  # 6 s loop; the last 20 % held out
    # the person's matte was learnt from the frames, one per loop frame: the face opaque, the corners see-through
    assert a.matte is not None and a.matte.shape == (150, 256, 256)
    fx, fy, fw, fh = (int(v) for v in talking["truth"]["portrait"]["face_box"])
    assert int(a.matte[:, fy + fh // 3:fy + 2 * fh // 3, fx + fw // 3:fx + 2 * fw // 3].min()) == 255
    assert int(a.matte[:, :12, :12].max()) == 0
    # the region sits over the mouth: the synth's mouth box lies inside every frame's box
    mx, my, mw, mh = talking["truth"]["portrait"]["mouth_box"]
    for x, y, s, _ in a.boxes:
        assert x <= mx and mx + mw <= x + s and y <= my and my + mh <= y + s


@pytest.mark.slow
def test_composite_changes_only_pixels_inside_the_feathered_mask(talking):
    from framegraph.models.avatar.video.stages import MouthRegion

    a = talking["avatar"]
    stage = MouthRegion(a.generator, a.mask, a.paste, a.reference, frame_size=(a.height, a.width),
                        box_side=a.box_side)
    frame, box = a.frames[7], [int(v) for v in a.boxes[7]]
    region = stage.redraw(frame, box, torch.tensor([2.0, 0.0, 0.0]))
    from framegraph.models.composite import composite

    out = composite(frame, region, box, stage.alpha).numpy()
    alpha = np.zeros(frame.shape[:2])
    alpha[box[1]:box[1] + box[3], box[0]:box[0] + box[2]] = stage.alpha.numpy()
    src = frame.numpy()
    assert psnr(out[alpha == 0], src[alpha == 0], 255.0) == math.inf  # outside the mask: the source frame, exactly
    assert np.abs(out[alpha > 0.5].astype(int) - src[alpha > 0.5]).mean() > 1  # inside: redrawn
    assert alpha.mean() < 0.2  # the mask is the lower face, not the frame


@pytest.mark.slow
def test_the_lower_face_away_from_the_lips_keeps_the_frames_own_fine_texture(talking):
    """The generator draws skin only blurred; the picture lays the frame's own finest detail (stubble,
    pores) over the lower face away from the lips: there the redrawn face is about as detailed as the frame
    (the Laplacian the evaluation's sharpness measures), in the same places; without it much less. On the
    lips: the redrawn mouth alone."""
    import cv2

    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.video.stages import MouthRegion

    a = load_avatar(talking["bundle"])
    assert a.texture is not None and tuple(a.texture.shape) == (a.region_size,) * 2
    args = (a.generator, a.mask, a.paste, a.reference)
    kw = dict(frame_size=(a.height, a.width), box_side=a.box_side)
    textured, plain = MouthRegion(*args, texture=a.texture, **kw), MouthRegion(*args, **kw)
    L = a.box_side
    redrawn = textured.alpha > 0.99  # [L, L]: where the picture is the redrawn region alone
    skin, lips = (textured.texture[0] > 0.9) & redrawn, (textured.texture[0] == 0) & redrawn
    assert skin.sum() > 100 and lips.sum() > 100, (skin.sum(), lips.sum())

    def detail(img, box):  # the Laplacian of the luminance on the skin: [n]
        x, y = box[:2]
        grey = cv2.cvtColor(np.ascontiguousarray(img[y:y + L, x:x + L].numpy()), cv2.COLOR_RGB2GRAY)
        return cv2.Laplacian(grey.astype(np.float32), cv2.CV_32F)[skin.numpy()]

    shape = torch.tensor([1.5, 0.0, 0.0])
    for i in (3, 60, 120):
        frame, box = a.frames[i], [int(v) for v in a.boxes[i]]
        with_texture, without = textured.picture(frame, box, shape), plain.picture(frame, box, shape)
        real, t, p = detail(frame, box), detail(with_texture, box), detail(without, box)
        assert t.var() > 0.7 * real.var() and p.var() < 0.5 * real.var(), (t.var(), p.var(), real.var())
        assert np.corrcoef(t, real)[0, 1] > 0.8  # the same stubble and pores, in the same places
        x, y = box[:2]
        inner = (slice(y, y + L), slice(x, x + L))
        # the mouth: the generator's own (up to a rounding: resized to the box before, not inside, the paste)
        assert (with_texture[inner][lips].int() - without[inner][lips].int()).abs().max() <= 1


@pytest.mark.slow
def test_the_chin_and_collar_stay_the_frames_own_however_wide_the_mouth_opens(talking):
    """The bundle keeps each loop frame's jaw line; the picture is the frame's own below it (the chin's edge, the
    collar), so a wide-open mouth never smears the jaw line, which the evaluation's edge measure finds as sharp
    as in the frame; without the jaw lines (older bundles) the same picture redraws it."""
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.eval.real import jaw_edge_ratios
    from framegraph.models.avatar.video.jaw import kept_share
    from framegraph.models.avatar.video.stages import MouthRegion
    from framegraph.models.face import FaceLandmarker

    a = load_avatar(talking["bundle"])
    assert a.jaws is not None and a.jaws.shape == (len(a.frames), 13, 2)
    stage = MouthRegion.for_avatar(a)
    assert "kept_share" in stage.inputs
    wide = torch.tensor([3.0, 0.0, 0.0])
    with FaceLandmarker(max_faces=1) as m:
        for i in (3, 60, 120):
            frame, box = a.frames[i], [int(v) for v in a.boxes[i]]
            share = kept_share(a.jaws[i], box)
            kept, redrawn = stage.picture(frame, box, wide, kept_share=share), stage.picture(frame, box, wide)
            x, y, L, _ = box
            keep = share == 1
            inner = (slice(y, y + L), slice(x, x + L))
            assert torch.equal(kept[inner][keep], frame[inner][keep]), "below the jaw line: the frame, exactly"
            assert (redrawn[inner][keep].int() - frame[inner][keep].int()).abs().float().mean() > 0.5
            face = m.detect(np.ascontiguousarray(frame.numpy()))[0]
            assert jaw_edge_ratios(kept.numpy(), frame.numpy(), face)["jaw_edge"] > 0.95


@pytest.mark.slow
def test_trained_generator_opens_the_mouth_for_a_larger_shape(talking):
    from framegraph.models.avatar.video.stages import MouthRegion

    a = talking["avatar"]
    stage = MouthRegion(a.generator, a.mask, a.paste, a.reference, frame_size=(a.height, a.width),
                        box_side=a.box_side)
    from framegraph.models.avatar.video.train import measure_shape
    from framegraph.models.face import FaceLandmarker

    with FaceLandmarker(max_faces=1) as m:  # the person's own most closed and most open mouth, measured
        measured = np.array([measure_shape(m.detect(np.ascontiguousarray(f.numpy()))[0]) for f in a.frames])
    z = (measured - np.array(a.shape_mean)) / np.array(a.shape_std)
    pics = []
    for k in (int(z[:, 0].argmin()), int(z[:, 0].argmax())):
        shape = torch.tensor(z[k], dtype=torch.float32)
        pics.append([stage.redraw(a.frames[i], [int(v) for v in a.boxes[i]], shape).float().mean(2)
                     for i in (3, 60, 120)])
    for closed, opened in zip(*pics):
        # the open mouth shows its dark inside (and teeth): a patch of the lower face turns much darker
        diff = opened - closed
        inside = a.mask > 0.5
        darker = float((diff[inside] < -40).float().mean())
        ys, xs = torch.nonzero(diff.abs() > 40, as_tuple=True)
        assert darker > 0.03, darker
        S = a.region_size
        # centred under the nose, from the lips down (the jaw drops), nothing above them
        assert abs(float(xs.float().mean()) - S / 2) < 0.15 * S and int(ys.min()) > 0.3 * S


def _live_openness(avatar, audio: np.ndarray, speaking: bool) -> np.ndarray:
    """The openness (standardised) the live graph's MouthShape gives, frame by frame, for ``audio``."""
    from framegraph.models.avatar.video.stages import MouthShape

    stage = MouthShape(avatar.shape_head, avatar.rest_shape, gate=avatar.silence_gate)
    feats = avatar.hear(audio)
    return np.array([float(stage.step(f, speaking)[0]) for f in feats])


@pytest.mark.slow
def test_mouth_rests_on_hiss_and_silence_without_a_gate_and_moves_on_speech(talking):
    """A live microphone's hiss is not speech: the head learnt (quiet rows) to answer it with the person's
    resting mouth, so the bundle needs no voice gate (which also shuts lips that really move at the edges of
    speech); the rest is the mouth in the frames the voice detector calls silent."""
    from framegraph.models.avatar import load_avatar

    a = load_avatar(talking["bundle"])
    assert a.silence_gate is False and "silent frames" in talking["report"]["shape_head"]["rest_from"]
    assert talking["report"]["shape_head"]["quiet_rows"] > 0
    rest = a.rest_shape[0]
    speech = _live_openness(a, talking["audio"][-3 * SR:], speaking=True)
    assert speech.max() - rest > 1.0 and speech.std() > 0.3  # held-out speech opens and moves the mouth
    rng = np.random.default_rng(7)
    for level in (0.0, 0.003, 0.01, 0.03):  # silence, -50, -40, -30 dBFS of white noise
        hiss = (rng.standard_normal(3 * SR) * level * 32767).astype(np.int16)
        o = _live_openness(a, hiss, speaking=True)[10:]  # even with the state saying "speaking"
        # at most a third as far from the resting mouth as speech takes it, in its quietest frame
        assert np.abs(o - rest).max() < np.abs(speech - rest).max() / 3, (level, o.max(), rest)


@pytest.mark.slow
def test_render_of_a_video_bundle_is_a_playable_mp4_with_sound_and_a_moving_mouth(talking, tmp_path):
    from framegraph.models.avatar import render_avatar_graph
    from framegraph.stream.progress import run_with_progress

    audio = talking["audio"][-3 * SR:]  # held-out speech: not used in training
    wav = write_wav(tmp_path / "speech.wav", np.concatenate([audio, np.zeros(SR, np.int16)]))
    graph, sink, total = render_avatar_graph(talking["bundle"], wav, str(tmp_path / "talk.mp4"))
    rep = run_with_progress(graph, sink, total, desc="render")
    assert not rep["interrupted"] and sink.frames_written == total == 100
    video = read_video(tmp_path / "talk.mp4")
    assert video["frames"].shape == (100, 256, 256, 3) and len(video["audio"]) >= 3.9 * SR
    assert np.abs(video["audio"][:3 * SR].astype(int)).max() > 1000  # the speech is in it
    o = _openness(video["frames"])
    # the mouth moves with the speech: std 0.021, range 0.087 when this file runs alone; the bundle trained in the
    # whole suite once moved less (std 0.0149, CI-like run 2026-12-04), its training not the same run to run
    assert o[:70].std() > 0.012 and o[:70].max() - o[:70].min() > 0.06
    assert o[-10:].mean() < np.percentile(o[:70], 60)  # and rests in the silence at the end


@pytest.mark.slow
def test_held_out_lips_follow_the_real_ones_and_the_rest_is_the_real_frame(talking):
    from framegraph.models.avatar import load_avatar
    from framegraph.models.avatar.eval.video import evaluate_video_avatar

    a = load_avatar(talking["bundle"])
    start = a.meta["training"]["heldout"]["start_s"]
    assert start == 9.6  # the last 20 % of the 12 s: its audio was not used in training
    r = evaluate_video_avatar(a, talking["clip"], start_s=start)
    assert r["frames"] == 60 and r["faces_found_generated"] == 1.0
    assert r["landmark_openness_corr"] >= 0.5, r  # landmarks on generated vs real frames (target 0.6 on a person)
    assert r["outside_mouth_psnr_db"] >= 30  # outside the mouth it is the real frame
    assert r["picture_vs_shape_openness_corr"] >= 0.8, r  # the drawn mouth opens as far as it was asked to
    assert r["silence"]["frames"] > 5 and r["silence"]["lips_closed_fraction_generated"] >= 0.8


# ---- bad input: clear errors ---------------------------------------------------------------------------
def _train(video, tmp_path, **kw):
    from framegraph.models.avatar.video.train import train_video_avatar

    return train_video_avatar(video, tmp_path / "bundle", steps=1, batch=1, progress=False, **kw)


@pytest.mark.slow
def test_two_faces_are_refused(talking, tmp_path):
    img = astronaut()
    frames = still(np.concatenate([img, img], 1), 12, fps=5)
    video = write_video(tmp_path / "two.mp4", frames, 5, talking["audio"][:12 * SR])
    with pytest.raises(ValueError, match=r"two faces found in \d+ of \d+ sampled frames: "
                                         r"an avatar is of one person facing the camera"):
        _train(video, tmp_path)


@pytest.mark.slow
def test_face_too_small_is_refused(talking, tmp_path):
    from PIL import Image

    canvas = np.full((256, 256, 3), 120, np.uint8)
    canvas[64:192, 64:192] = np.array(Image.fromarray(astronaut()).resize((128, 128), Image.LANCZOS))
    video = write_video(tmp_path / "small.mp4", still(canvas, 12, fps=5), 5, talking["audio"][:12 * SR])
    with pytest.raises(ValueError, match="the face is too small: its lower-face region is .* px, at least 64"):
        _train(video, tmp_path)


@pytest.mark.slow
def test_lips_that_do_not_move_are_refused(talking, tmp_path):
    video = write_video(tmp_path / "still.mp4", still(astronaut(), 12, fps=5), 5, talking["audio"][:12 * SR])
    with pytest.raises(MediaError, match="the lips barely move in it .* must show them talking"):
        _train(video, tmp_path)


@pytest.mark.slow
def test_no_speech_and_no_face_and_too_short_are_refused(talking, tmp_path):
    video = write_video(tmp_path / "hum.mp4", still(astronaut(), 12, fps=5), 5, tone(12))
    with pytest.raises(MediaError, match="has no speech: the voice detector hears speech in"):
        _train(video, tmp_path)
    wall = np.random.default_rng(0).integers(0, 255, (60, 256, 256, 3), dtype=np.uint8)
    video = write_video(tmp_path / "wall.mp4", wall, 5, talking["audio"][:12 * SR])
    with pytest.raises(ValueError, match="no face found"):
        _train(video, tmp_path)
    video = write_video(tmp_path / "short.mp4", still(astronaut(), 5, fps=5), 5, talking["audio"][:5 * SR])
    with pytest.raises(MediaError, match="is 5.0 s long; the avatar needs at least 10 s"):
        _train(video, tmp_path)
