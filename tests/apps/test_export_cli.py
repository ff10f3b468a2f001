"""`framegraph export` + `framegraph render --avatar --runtime onnx`: the avatar graph on ONNX Runtime renders
the same video as on torch (PSNR >= 40 dB frame by frame, to a playable MP4); bad exports are clear errors."""
import wave

import numpy as np
import pytest
from helpers import psnr_per_frame

pytest.importorskip("onnx")

from framegraph.apps.cli import main
from framegraph.assets import path as asset
from framegraph.models.avatar import random_avatar, save_avatar
from framegraph.stream.media import read_video


def speech_like_wav(path, seconds: float = 1.2):
    t = np.arange(int(seconds * 16000)) / 16000
    x = np.sin(2 * np.pi * 180 * t) * 6000 * (np.sin(2 * np.pi * 2 * t) > 0)  # bursts: the mouth must move
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(x.astype("<i2").tobytes())
    return path


def render_both(bundle, wav, tmp_path, onnx_dir):
    outs = {}
    for backend in ("torch", "onnx"):
        outs[backend] = tmp_path / f"{backend}.mp4"
        extra = ["--runtime", "onnx", "--onnx", str(onnx_dir)] if backend == "onnx" else []
        assert main(["render", "--avatar", str(bundle), "--audio", str(wav), "--out", str(outs[backend]), *extra]) == 0
    return read_video(outs["torch"]), read_video(outs["onnx"])


def test_export_then_render_on_onnx_equals_torch(tmp_path, capsys):
    bundle = save_avatar(tmp_path / "bundle", random_avatar(region_size=64))
    onnx_dir = tmp_path / "export"
    assert main(["export", "--avatar", str(bundle), "--out", str(onnx_dir)]) == 0
    assert (onnx_dir / "manifest.json").is_file()
    a, b = render_both(bundle, speech_like_wav(tmp_path / "a.wav"), tmp_path, onnx_dir)
    assert a["frames"].shape == b["frames"].shape and a["frames"].shape[0] == 30
    assert b["audio"] is not None
    assert psnr_per_frame(a["frames"], b["frames"]).min() >= 40.0
    # the picture moves (the comparison is not between two still images)
    assert np.abs(np.diff(b["frames"].astype(np.float64), axis=0)).mean() > 0.01


def test_render_onnx_without_export_or_with_another_bundles_export_is_a_clear_error(tmp_path, capsys):
    bundle = save_avatar(tmp_path / "bundle", random_avatar(region_size=64))
    wav = speech_like_wav(tmp_path / "a.wav", 0.2)
    assert main(["render", "--avatar", str(bundle), "--audio", str(wav), "--out", str(tmp_path / "x.mp4"),
                 "--runtime", "onnx"]) == 2
    assert "no ONNX export" in capsys.readouterr().err
    other = save_avatar(tmp_path / "other", random_avatar(region_size=64, seed=3))
    assert main(["export", "--avatar", str(other), "--out", str(tmp_path / "other_onnx")]) == 0
    assert main(["render", "--avatar", str(bundle), "--audio", str(wav), "--out", str(tmp_path / "x.mp4"),
                 "--runtime", "onnx", "--onnx", str(tmp_path / "other_onnx")]) == 2
    assert "another or an older bundle" in capsys.readouterr().err


@pytest.mark.slow
def test_shipped_avatar_on_onnx_renders_the_torch_video(tmp_path, capsys):
    bundle = asset("avatars", "astronaut")
    onnx_dir = tmp_path / "export"
    assert main(["export", "--avatar", str(bundle), "--out", str(onnx_dir)]) == 0
    a, b = render_both(bundle, speech_like_wav(tmp_path / "a.wav", 2.0), tmp_path, onnx_dir)
    assert a["frames"].shape == b["frames"].shape == (50, 256, 256, 3)
    assert psnr_per_frame(a["frames"], b["frames"]).min() >= 40.0
