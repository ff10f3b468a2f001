"""The avatar bundle, its graph end to end (tiny random bundle: plumbing, not quality), training phases on
two tiny synthetic clips with resume, the openness estimator and the eval / train command lines."""
from __future__ import annotations

import json
import shutil
import wave

import numpy as np
import pytest
import torch

from framegraph.models.avatar import (
    AvatarError,
    StateOverride,
    build_avatar_graph,
    load_avatar,
    random_avatar,
    save_avatar,
)
from framegraph.stream import Clock, Graph, IterableSource, PortSpec, RecordingSink
from framegraph.stream.media import AudioFileSource, read_video


def write_wav(path, seconds: float, freq: float = 220.0, sr: int = 16000) -> str:
    t = np.arange(int(round(seconds * sr))) / sr
    x = (0.3 * 32767 * np.sin(2 * np.pi * freq * t) * (t > 0.3)).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(x.tobytes())
    return str(path)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("avatar") / "astronaut"
    save_avatar(root, random_avatar())
    return root


# ---- the bundle ---------------------------------------------------------------------------------------
def test_bundle_round_trip(bundle):
    a = load_avatar(bundle)
    assert (a.width, a.height) == (256, 256) and a.region_size == 64 and a.crop_box[2] == a.crop_box[3]
    assert a.reference_latent().shape == (a.vae.latent_channels, 4, 4)
    cfg = json.loads((bundle / "avatar.json").read_text())
    for key in ("portrait", "face_box", "region_size", "fps", "chunk_frames", "steps", "latent_norm"):
        assert key in cfg
    b = random_avatar()
    for name, p in a.dit.state_dict().items():
        assert torch.equal(p, b.dit.state_dict()[name])


@pytest.mark.parametrize("damage, message", [
    (lambda r: (r / "avatar.json").unlink(), "avatar.json is missing"),
    (lambda r: (r / "avatar.json").write_text("{not json"), "not valid JSON"),
    (lambda r: shutil.rmtree(r / "dit"), "dit/ folder"),
    (lambda r: (r / "vae" / "diffusion_pytorch_model.safetensors").unlink(), "vae/diffusion_pytorch_model"),
    (lambda r: (r / "audio" / "config.json").write_text("[]"), "audio/"),
    (lambda r: (r / "portrait.png").unlink(), "portrait 'portrait.png'"),
    (lambda r: (r / "portrait.png").write_bytes(b"nope"), "not an image"),
    (lambda r: (r / "avatar.json").write_text(json.dumps({**json.loads((r / "avatar.json").read_text()),
                                                          "face_box": [200, 200, 128, 128]})), "outside"),
])
def test_bad_bundles_name_the_file(bundle, tmp_path, damage, message):
    root = tmp_path / "a"
    shutil.copytree(bundle, root)
    damage(root)
    with pytest.raises(AvatarError, match=message):
        load_avatar(root)
    with pytest.raises(AvatarError, match="does not exist"):
        load_avatar(tmp_path / "nothing")


# ---- the graph ----------------------------------------------------------------------------------------
def test_graph_renders_full_resolution_mp4_with_audio_in_sync(bundle, tmp_path):
    wav = write_wav(tmp_path / "a.wav", 1.3)
    out = tmp_path / "talk.mp4"
    ag = build_avatar_graph(load_avatar(bundle), AudioFileSource(wav), out=str(out))
    ag.graph.run()
    v = read_video(out)
    assert v["frames"].shape == (33, 256, 256, 3)  # ceil(1.3 s * 25 fps)
    assert v["fps"] == 25.0
    assert v["audio"] is not None and abs(len(v["audio"]) / v["audio_rate"] - 1.3) < 0.1
    assert abs(v["frame_times_s"][0] - (v["audio_start_s"] or 0.0)) < 1e-3
    # outside the face box the frame is the portrait
    a = load_avatar(bundle)
    x, y, s, _ = a.crop_box
    diff = np.abs(v["frames"][10].astype(int) - a.portrait.numpy().astype(int))
    diff[y:y + s, x:x + s] = 0
    assert diff.mean() < 3.0


@pytest.mark.parametrize("mode, onehot", [("auto", [0, 1, 0]), ("idle", [1, 0, 0]), ("listening", [0, 0, 1]),
                                          ("speaking", [0, 1, 0])])
def test_state_override(mode, onehot):
    g = Graph(Clock("fast"))
    src, st = g.add(IterableSource([[0, 1, 0, 0.9]] * 3, PortSpec((4,)), port="state")), g.add(StateOverride(mode=mode))
    sink = g.add(RecordingSink({"state": PortSpec((4,))}))
    g.connect(src, st)
    g.connect(st, sink)
    g.run()
    assert [r.tolist() for r in sink.data()] == [[*map(float, onehot), pytest.approx(0.9)]] * 3
    with pytest.raises(ValueError, match="expected one of"):
        st.set_mode("shouting")


# ---- training, eval ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from framegraph.models.synth import espeak_available, load_portrait, make_clip

    if not espeak_available():
        pytest.skip("needs espeak-ng")
    folder = tmp_path_factory.mktemp("clips")
    portrait = load_portrait()
    for i in range(2):
        make_clip(str(folder), i, seconds=2.0, fps=25, portrait=portrait, seed=3)
    return folder


TINY_RUN = dict(vae_steps=4, audio_steps=3, vae_reference=True, flow_steps=3, distill_steps=2, rollout_steps=2, batch=2,
                window=4, checkpoint_every=2, warmup=1, dit_overrides=dict(width=32, depth=1, heads=2))


def test_training_runs_every_phase_and_resumes(clips, tmp_path):
    from framegraph.models.avatar.portrait.train import train_avatar

    out = tmp_path / "av"
    res = train_avatar(clips, out, progress=False, **TINY_RUN)
    phases = [h["phase"] for h in res.history]
    assert phases == ["flow"] * 3 + ["distill"] * 2 + ["rollout"] * 2
    assert all(np.isfinite(h["loss"]) for h in res.history)
    a = load_avatar(out)
    assert a.region_size == 64 and a.mouth_box is not None and a.steps == 2
    assert (out / "train" / "data.pt").is_file() and (out / "train_report.json").is_file()
    assert a.vae.uses_reference and (out / "train" / "teacher" / "config.json").is_file()
    report = json.loads((out / "train_report.json").read_text())
    assert report["audio_encoder"]["source"] == "trained" and report["audio_encoder"]["steps"] == 3
    # synthetic clips: the VAE learnt the frames redrawn without the codec, with the reference warp
    assert report["vae"]["targets"] == "redrawn" and report["vae"]["reference_warp"] and a.vae.config.reference_warp
    # resume: the finished phases are kept, the longer rollout phase continues from its step
    more = train_avatar(clips, out, progress=False, **{**TINY_RUN, "rollout_steps": 4})
    assert [h["step"] for h in more.history if h["phase"] == "rollout"] == [1, 2, 3, 4]
    assert len(more.history) == 9


def test_openness_estimator_tracks_ground_truth_on_real_clips(clips):
    from framegraph.models.avatar.eval.synthetic import estimator_check

    for i in range(2):
        r = estimator_check(clips / f"clip_0000{i}.mp4", clips / f"clip_0000{i}.json")
        assert r["corr"] is not None and r["corr"] > 0.8, r["corr"]


def test_eval_cli_writes_metrics(clips, bundle, tmp_path):
    from framegraph.apps.cli import main

    out = tmp_path / "m.json"
    rc = main(["avatar", "eval", "--avatar", str(bundle), "--clip", str(clips / "clip_00000.mp4"),
               "--truth", str(clips / "clip_00000.json"), "--out", str(out)])
    assert rc == 0
    m = json.loads(out.read_text())
    assert m["frames"] == 50 and 50 <= m["frames_generated"] <= 53 and m["audio_in_output"]  # AAC pads the track
    assert m["estimator_corr"] > 0.8
    for key in ("openness_corr", "identity_ssim", "identity_ssim_real", "identity_ssim_mp4", "face_psnr_db", "silence"):
        assert key in m
    assert 0 < m["identity_ssim"] <= 1 and m["face_psnr_db"] > 5
    real = m["real"]  # the landmark measures against the real frames
    assert real["faces_found_real"] == 1.0 and 0 <= real["faces_found_generated"] <= 1  # a 4-step bundle: a blur
    assert real["outside_mouth_psnr_db"] > 5 and 0 < real["outside_mouth_ssim"] <= 1 and real["silence"] is not None
    assert m["landmark_openness_corr"] == real["landmark_openness_corr"]
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "none"), "--clip", str(clips / "clip_00000.mp4"),
                 "--truth", str(clips / "clip_00000.json"), "--out", str(out)]) == 2


def test_train_cli_on_clips(clips, tmp_path):
    from framegraph.apps.cli import main

    out = tmp_path / "bundle"
    rc = main(["avatar", "train", "--clips", str(clips), "--out", str(out), "--steps", "2", "--vae-steps", "2",
               "--distill-steps", "1", "--rollout-steps", "1", "--batch", "2", "--window", "4", "--dit-width", "32",
               "--dit-depth", "1", "--dit-heads", "2", "--no-vae-warp", "--no-vae-redraw"])
    assert rc == 0 and load_avatar(out).dit.config.width == 32
    assert not load_avatar(out).vae.config.reference_warp  # the VAE as before the warp: learnt from the video
    assert json.loads((out / "train_report.json").read_text())["vae"]["targets"] == "video"
    assert main(["avatar", "train", "--clips", str(tmp_path / "none"), "--out", str(out / "x")]) == 2


def test_refine_cli_trains_only_the_decoder_into_a_new_bundle(clips, tmp_path, capsys):
    from framegraph.apps.cli import main

    src = tmp_path / "src"
    avatar = random_avatar(vae_config={"reference_skip": True})
    avatar.vae.set_latent_stats([0.0] * 4, [1.0] * 4)  # as a trained VAE has them
    save_avatar(src, avatar)
    avatar.dit.save_pretrained(src / "teacher")
    out = tmp_path / "refined"
    args = ["avatar", "refine", "--avatar", str(src), "--clips", str(clips), "--steps", "3", "--batch", "2"]
    assert main(args + ["--out", str(out)]) == 0
    assert "held-out clips: PSNR" in capsys.readouterr().err
    before, after = load_avatar(src), load_avatar(out)
    assert after.vae.config.reference_warp and not before.vae.config.reference_warp  # the source is untouched
    assert after.vae.config.latent_mean == before.vae.config.latent_mean
    for name, part in (("encoder", "vae"), ("dit", "dit"), ("audio", "audio")):
        a = getattr(before, part) if part != "vae" else before.vae.encoder
        b = getattr(after, part) if part != "vae" else after.vae.encoder
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values())), name
    assert (out / "teacher" / "config.json").is_file() and (out / "train" / "vae" / "checkpoint").is_dir()
    meta = json.loads((out / "avatar.json").read_text())["decoder_refine"]
    assert meta["steps"] == 3 and meta["reference_warp"] is True
    # errors: the source as output, a VAE without the reference, a missing clips folder
    assert main(args + ["--out", str(src)]) == 2
    assert "source bundle" in capsys.readouterr().err
    plain = tmp_path / "plain"
    save_avatar(plain, random_avatar())
    assert main(["avatar", "refine", "--avatar", str(plain), "--clips", str(clips), "--out", str(tmp_path / "p2"),
                 "--steps", "1"]) == 2
    assert "reference_skip" in capsys.readouterr().err
    assert main(["avatar", "refine", "--avatar", str(src), "--clips", str(tmp_path / "none"),
                 "--out", str(tmp_path / "p3"), "--steps", "1"]) == 2
    assert main(args + ["--out", str(tmp_path / "p4"), "--latent-noise", "-1"]) == 2
    assert "--latent-noise" in capsys.readouterr().err


def test_render_avatar_graph_counts_frames(bundle, tmp_path):
    from framegraph.models.avatar import RunSettings, render_avatar_graph
    from framegraph.stream.progress import run_with_progress

    wav = write_wav(tmp_path / "b.wav", 0.9)
    graph, sink, total = render_avatar_graph(bundle, wav, str(tmp_path / "r.mp4"), RunSettings(device="cpu"))
    assert total == 23
    report = run_with_progress(graph, sink, total, desc="render")
    assert not report["interrupted"] and sink.frames_written == total


def test_train_cli_synth_route(tmp_path):
    from framegraph.apps.cli import main
    from framegraph.models.synth import espeak_available

    if not espeak_available():
        pytest.skip("needs espeak-ng")
    out = tmp_path / "bundle"
    rc = main(["avatar", "train", "--synth", "2", "--synth-seconds", "1.5", "--out", str(out), "--steps", "1",
               "--vae-steps", "1", "--distill-steps", "0", "--rollout-steps", "0", "--batch", "1", "--window", "2",
               "--dit-width", "32", "--dit-depth", "1", "--dit-heads", "2", "--no-vad"])
    assert rc == 0
    assert len(list((out / "train" / "clips").glob("clip_*.mp4"))) == 2
    a = load_avatar(out)
    assert a.steps == 4 and not a.vad  # undistilled: more sampler steps
    named = json.loads(sorted((out / "train" / "clips").glob("clip_*.json"))[0].read_text())["portrait"]
    assert a.region_size == named["region_size"] != 64  # sized to the photo's face, not the fixed 64 px


def test_identity_meter_registers_head_motion_and_ignores_the_mouth():
    """A frame that is the portrait moved by a small head motion scores ~1 with the pose fitted (and lower
    without); a changed mouth does not count; a changed eye does."""
    import cv2

    from framegraph.models.avatar.eval.synthetic import IdentityMeter, motion_region, search_box
    from framegraph.models.synth import astronaut_portrait

    p = astronaut_portrait()
    img = np.array(p.image, dtype=np.uint8)
    H, W = img.shape[:2]
    fx, fy, fw, fh = p.face_box
    s = int(max(fw, fh) * 1.2)
    crop = (int(fx + fw / 2 - s / 2), int(fy + fh / 2 - s / 2), s, s)
    meter = IdentityMeter(torch.from_numpy(img), crop, p.mouth_box)
    m = cv2.getRotationMatrix2D((W / 2, H * 0.8), 0.6, 1.0)
    m[:, 2] += (1.3, -0.8)
    moved = cv2.warpAffine(img, m, (W, H), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    ssim_v, psnr_v, raw = meter.measure(moved)
    # the portrait moved into the frame's pose is the frame again (not a resampled, blurred copy of it)
    assert ssim_v > 0.99 and ssim_v > raw + 0.1 and psnr_v > 40, (ssim_v, raw, psnr_v)
    assert meter.measure(img)[0] > 0.999
    mouth = img.copy()
    x0, y0, x1, y1 = search_box(p.mouth_box, (H, W))
    mouth[y0:y1, x0:x1] = 0  # a wide-open black mouth
    assert meter.measure(mouth)[0] > 0.99
    rx0, ry0, rx1, ry1 = motion_region(p.mouth_box, (H, W))
    assert rx0 <= x0 and ry0 <= y0 and rx1 >= x1 and ry1 >= y1  # the motion region holds the mouth box
    eyes = img.copy()
    for box in p.eye_boxes:  # both eyes painted over (with a margin): not the same person any more
        ex, ey, ew, eh = (int(v) for v in box)
        eyes[max(0, ey - eh // 2):ey + eh + eh // 2, max(0, ex - ew // 4):ex + ew + ew // 4] = 255
    assert meter.measure(eyes)[0] < 0.97


def test_identity_meter_on_composited_frames_poses_only_the_drawn_region():
    """An avatar frame is the portrait with a generated region pasted in; when that region is the portrait
    moved by a head motion, the meter told where frames are drawn scores it ~1 (the whole-frame pose cannot
    explain a moved face in a fixed background), and painted-over eyes still score low."""
    import cv2

    from framegraph.models.avatar.eval.synthetic import IdentityMeter
    from framegraph.models.composite import Composite

    avatar = random_avatar(region_size=64)
    img = avatar.portrait.numpy()
    H, W = img.shape[:2]
    m = cv2.getRotationMatrix2D((W / 2, H / 2), 0.5, 1.0)
    m[:, 2] += (0.8, -0.6)
    moved = cv2.warpAffine(img, m, (W, H), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    comp = Composite(avatar.portrait, avatar.crop_box)
    x, y, s, _ = avatar.crop_box
    frame = img.copy()
    composite_out = torch.from_numpy(frame)
    from framegraph.models.composite import composite

    composite(avatar.portrait, torch.from_numpy(moved[y:y + s, x:x + s].copy()), comp.box, comp.mask, out=composite_out)
    drawn = comp.frame_alpha().numpy()
    assert drawn.shape == (H, W) and drawn[y + s // 2, x + s // 2] == 1 and drawn[0, 0] == 0
    whole = IdentityMeter(avatar.portrait, avatar.crop_box, avatar.mouth_box)
    region = IdentityMeter(avatar.portrait, avatar.crop_box, avatar.mouth_box, drawn=drawn)
    f = composite_out.numpy()
    assert region.measure(f)[0] > 0.99 and region.measure(f)[0] > whole.measure(f)[0] + 0.02
    eyes = f.copy()
    for box in astronaut_eye_boxes():
        ex, ey, ew, eh = (int(v) for v in box)
        eyes[max(0, ey - eh // 2):ey + eh + eh // 2, max(0, ex - ew // 4):ex + ew + ew // 4] = 255
    assert region.measure(eyes)[0] < 0.97
    with pytest.raises(ValueError, match="drawn"):
        IdentityMeter(avatar.portrait, avatar.crop_box, avatar.mouth_box, drawn=drawn[:10])


def astronaut_eye_boxes():
    from framegraph.models.synth import astronaut_portrait

    return astronaut_portrait().eye_boxes


def test_live_run_settings_skip_frames_older_than_the_live_lag_unless_told_otherwise():
    from framegraph.models.avatar import LIVE_MAX_LAG_MS, RunSettings

    assert RunSettings(live=True).max_lag_ms == LIVE_MAX_LAG_MS
    assert RunSettings(live=True, max_lag_ms=80.0).max_lag_ms == 80.0
    assert RunSettings().max_lag_ms is None  # offline: nothing skipped
