"""`framegraph bench video_avatar` and `framegraph avatar eval` on a tiny random video avatar and a clip of its
own frames: the bench's JSON holds the held-out quality block and a speed run per region size, and a portrait
bundle is refused; the graph is timed on torch and on ONNX Runtime; eval measures from where the part kept out of
training begins and keeps the redrawn video."""
import json

import numpy as np
import pytest
import torch
from helpers import tone, write_video

from framegraph.apps.cli import main
from framegraph.models.avatar import random_avatar, save_avatar
from framegraph.models.avatar.video.bundle import random_video_avatar, save_video_avatar


def _avatar_and_clip(tmp_path, heldout_start_s=None):
    """A random video avatar saved as tmp_path/me and a 1.28-s clip (32 frames) of its own frames with a tone."""
    torch.set_num_threads(1)
    avatar = random_video_avatar(n_frames=8)
    if heldout_start_s is not None:
        avatar.meta = {"training": {"heldout": {"start_s": heldout_start_s}}}
    save_video_avatar(tmp_path / "me", avatar)
    frames = np.concatenate([avatar.frames.numpy()] * 4)  # 32 frames = 1.28 s of "the person"
    return avatar, write_video(tmp_path / "me.mp4", frames, 25, tone(1.28))


@pytest.mark.slow
def test_bench_video_avatar_writes_quality_and_speed(tmp_path, capsys):
    avatar, clip = _avatar_and_clip(tmp_path)
    out = tmp_path / "results" / "video_avatar.json"
    assert main(["bench", "video_avatar", "--avatar", str(tmp_path / "me"), "--clip", clip, "--seconds", "1",
                 "--region", "128", "--threads", "1", "--runtime", "torch,onnx", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "video_avatar" and r["command"].startswith("framegraph bench video_avatar")
    q = r["quality"]
    assert q["frames"] == 32 and q["faces_found_generated"] == 1.0
    assert q["held_out"] is False and r["training_run"] is None  # no holdout; a bundle written without training
    assert q["outside_mouth_psnr_db"] >= 30  # outside the mouth: the clip's own frames
    typed = r["typed_text"]  # eSpeak sentences drawn on the loop (a random generator: only the block is checked)
    assert typed["sentences"] == 4 and typed["frames"] > 100 and "drawn_vs_phoneme_jaw_corr" in typed
    assert [(s["region_size"], s["runtime"]) for s in r["speed"]] == [(64, "torch"), (64, "onnx"), (128, "torch"),
                                                                      (128, "onnx")]
    assert all(s["export_s"] > 0 for s in r["speed"] if s["runtime"] == "onnx")
    for s in r["speed"]:
        assert s["frames"] == 25 and s["fps"] > 0 and s["first_frame_ms"] > 0
        assert len(s["first_frame_warm_runs_ms"]) == 3 and s["first_frame_warm_ms"] > 0  # later sessions
    assert (tmp_path / "results" / "video_avatar.png").stat().st_size > 1000
    save_avatar(tmp_path / "portrait", random_avatar())
    capsys.readouterr()
    assert main(["bench", "video_avatar", "--avatar", str(tmp_path / "portrait"), "--clip", clip,
                 "--out", str(out)]) == 2
    assert "is a portrait bundle; this bench measures a video avatar" in capsys.readouterr().err
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "portrait"), "--clip", clip, "--out",
                 str(tmp_path / "e.json"), "--av-offset", "1"]) == 2
    assert "--av-offset go with a video avatar" in capsys.readouterr().err


@pytest.mark.slow
def test_avatar_eval_measures_a_video_avatar_on_the_held_out_part(tmp_path, capsys):
    from framegraph.stream.media import read_video

    _, clip = _avatar_and_clip(tmp_path, heldout_start_s=0.64)
    out, video = tmp_path / "eval.json", tmp_path / "eval.mp4"
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "me"), "--clip", clip, "--out", str(out),
                 "--video", str(video)]) == 0
    m = json.loads(out.read_text())
    assert m["start_s"] == 0.64 and m["end_s"] == 1.28 and m["frames"] == 16  # the held-out part only
    assert m["faces_found_generated"] == 1.0 and m["outside_mouth_psnr_db"] >= 30
    jaw = m["jaw"]  # the jaw line measured on every frame, its worst frame named by its time in the clip
    assert jaw["frames"] == 16 and m["jaw_edge_ratio"] == jaw["edge_ratio"] and 0.64 <= jaw["worst_frame_s"] < 1.28
    got = read_video(str(video))
    assert len(got["frames"]) == 16 and got["frames"].shape[1:3] == (256, 256)
    assert np.abs(got["audio"].astype(np.float64)).max() > 1000  # the clip's sound came along
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "me"), "--clip", clip, "--out", str(out),
                 "--start-s", "0", "--end-s", "0.4"]) == 0
    assert json.loads(out.read_text())["frames"] == 10
    provenance = (tmp_path / "me" / "PROVENANCE.md").read_text()  # each evaluation's figures, in the bundle
    assert provenance.count("### ") == 2 and "`me.mp4` from 0.64 s to 1.28 s (16 frames)" in provenance
    assert "the jaw line's edge" in provenance and "the jaw line's worst frame" in provenance
    assert f"| {m['outside_mouth_psnr_db']:g} | ≥ 30 |" in provenance
    typed = m["typed_text"]  # and typed text drawn on the loop, beside the person's real openness while speaking
    assert typed["sentences"] == 4 and f"on its loop) | {typed['drawn_vs_phoneme_jaw_corr']:g} |" in provenance
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "me"), "--clip", clip, "--out", str(out),
                 "--av-offset", "2"]) == 0  # the clip's sound moved 2 frames earlier before it is measured
    assert json.loads(out.read_text())["av_offset_frames"] == 2 and json.loads(out.read_text())["frames"] == 16
    capsys.readouterr()
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "me"), "--clip", clip, "--out", str(out),
                 "--av-offset", "5000"]) == 2
    assert "moves the whole sound past the clip's 1.28 s" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "me"), "--clip", clip, "--out", str(out),
                 "--steps", "2"]) == 2
    assert "--steps: for portrait avatars" in capsys.readouterr().err


@pytest.mark.slow
def test_avatar_eval_takes_the_source_video_at_its_own_size_and_frame_rate(tmp_path):
    """A phone's video is larger than the avatar plays and runs at 30 fps: eval makes it as training made it."""
    import torch.nn.functional as F

    avatar, _ = _avatar_and_clip(tmp_path, heldout_start_s=0.64)
    frames = np.concatenate([avatar.frames.numpy()] * 6)[:48]  # 1.6 s at 30 fps, at twice the size
    big = F.interpolate(torch.from_numpy(frames).permute(0, 3, 1, 2).float(), scale_factor=2, mode="bilinear")
    source = write_video(tmp_path / "phone.mp4", big.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy(), 30,
                         tone(1.6))
    out = tmp_path / "eval.json"
    assert main(["avatar", "eval", "--avatar", str(tmp_path / "me"), "--clip", source, "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["frames"] == 24 and m["start_s"] == 0.64 and m["faces_found_generated"] == 1.0  # 0.64..1.6 s at 25 fps
    assert m["outside_mouth_psnr_db"] >= 30
