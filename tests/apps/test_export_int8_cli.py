"""`framegraph export --int8` + `framegraph render --runtime onnx-int8`: the int8 files are written and
recorded, the render runs them and stays close to float32 ORT (PSNR bounds measured with margin), and the
flags' mistakes are clear errors."""

import json

import numpy as np
import pytest

pytest.importorskip("onnx")

from test_export_cli import psnr_per_frame, speech_like_wav

from framegraph.apps.cli import main
from framegraph.assets import path as asset
from framegraph.models.avatar import random_avatar, save_avatar
from framegraph.models.avatar.int8 import DEFAULT_INT8, DEFAULT_MODE
from framegraph.stream.media import read_video


def render_exit(bundle, wav, out, backend, onnx_dir) -> int:
    """``framegraph render`` of the bundle speaking ``wav``; its exit code."""
    return main(["render", "--avatar", str(bundle), "--audio", str(wav), "--out", str(out), "--runtime", backend,
                 "--onnx", str(onnx_dir)])


def render(bundle, wav, out, backend, onnx_dir):
    assert render_exit(bundle, wav, out, backend, onnx_dir) == 0
    return read_video(out)["frames"]


def test_export_int8_then_render_onnx_int8(tmp_path, capsys):
    bundle = save_avatar(tmp_path / "bundle", random_avatar(region_size=64))
    onnx_dir = tmp_path / "export"
    assert (
        main(
            ["export", "--avatar", str(bundle), "--out", str(onnx_dir), "--int8", "dynamic", "--int8-models", "dit,vae"]
        )
        == 0
    )
    assert "--runtime onnx-int8 runs dit, vae in int8" in capsys.readouterr().err
    m = json.loads((onnx_dir / "manifest.json").read_text())["int8"]
    assert m["mode"] == "dynamic" and m["models"] == ["dit", "vae"]
    assert all((onnx_dir / f["file"]).is_file() and f["file"].endswith(".int8.onnx") for f in m["files"].values())
    wav = speech_like_wav(tmp_path / "a.wav")
    f32 = render(bundle, wav, tmp_path / "f32.mp4", "onnx", onnx_dir)
    i8 = render(bundle, wav, tmp_path / "i8.mp4", "onnx-int8", onnx_dir)
    assert f32.shape == i8.shape and len(i8) == 30
    p = psnr_per_frame(i8, f32)
    # measured: min 36.3 dB, mean 37.4 dB (the H.264 of both included) — bound with margin
    assert p.min() >= 32.0 and not np.array_equal(i8, f32), p
    assert np.abs(np.diff(i8.astype(np.float64), axis=0)).mean() > 0.01  # the picture moves


def test_export_int8_flag_mistakes_are_clear_errors(tmp_path, capsys):
    bundle = save_avatar(tmp_path / "bundle", random_avatar(region_size=64))
    assert main(["export", "--avatar", str(bundle), "--int8-models", "dit"]) == 2
    assert "--int8-models / --calibration go with --int8" in capsys.readouterr().err
    assert main(["export", "--avatar", str(bundle), "--int8", "static", "--int8-models", "dit,unet"]) == 2
    assert "int8 models ['unet']: expected some of audio, dit, vae" in capsys.readouterr().err
    assert main(["export", "--avatar", str(bundle), "--int8", "--calibration", str(tmp_path / "no.wav")]) == 2
    assert "--calibration" in capsys.readouterr().err and not (tmp_path / "bundle" / "onnx").exists()
    assert main(["export", "--avatar", str(bundle), "--out", str(tmp_path / "plain")]) == 0
    wav = speech_like_wav(tmp_path / "a.wav", 0.2)
    assert render_exit(bundle, wav, tmp_path / "x.mp4", "onnx-int8", tmp_path / "plain") == 2
    assert "no int8 files; run `framegraph export" in capsys.readouterr().err


def test_export_int8_defaults_to_the_measured_choice(tmp_path, capsys):
    bundle = save_avatar(tmp_path / "bundle", random_avatar(region_size=64))
    assert main(["export", "--avatar", str(bundle), "--out", str(tmp_path / "e"), "--int8", "dynamic"]) == 0
    m = json.loads((tmp_path / "e" / "manifest.json").read_text())["int8"]
    assert m["models"] == list(DEFAULT_INT8)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"(default when given: {DEFAULT_MODE})" in out and "the measured choice" in out


@pytest.mark.slow
def test_shipped_avatar_int8_stays_close_to_float32(tmp_path, capsys):
    bundle = asset("avatars", "astronaut")
    onnx_dir = tmp_path / "export"
    assert (
        main(
            [
                "export",
                "--avatar",
                str(bundle),
                "--out",
                str(onnx_dir),
                "--int8",
                "static",
                "--int8-models",
                "audio,dit,vae",
            ]
        )
        == 0
    )
    wav = speech_like_wav(tmp_path / "a.wav", 2.0)
    f32 = render(bundle, wav, tmp_path / "f32.mp4", "onnx", onnx_dir)
    i8 = render(bundle, wav, tmp_path / "i8.mp4", "onnx-int8", onnx_dir)
    assert f32.shape == i8.shape == (50, 256, 256, 3)
    p = psnr_per_frame(i8, f32)
    # measured: min 37.1 dB, mean 40.6 dB (every model int8, static; H.264 of both included) — bound with margin
    assert p.min() >= 32.0, p


def test_bench_avatar_measures_the_onnx_int8_backend(tmp_path):
    out = tmp_path / "avatar_int8_rows.json"
    assert (
        main(
            [
                "bench",
                "avatar",
                "--quick",
                "--no-shipped",
                "--runtime",
                "onnx,onnx-int8",
                "--sessions",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    r = json.loads(out.read_text())
    assert [(row["name"], row["backend"]) for row in r["sizes"]] == [("64 onnx", "onnx"), ("64 onnx-int8", "onnx-int8")]
    assert r["sizes"][1]["steady"]["frames"] > 0 and r["sessions_by_backend"]["onnx-int8"]["runs"][0]["per_session"]


@pytest.mark.slow
def test_bench_avatar_int8_records_quality_speed_and_the_decision(tmp_path):
    from framegraph.models.synth import load_portrait, make_clip

    clips = tmp_path / "clips"
    make_clip(str(clips), 0, seconds=1.5, fps=25, portrait=load_portrait(), seed=1000)
    out = tmp_path / "int8.json"
    assert (
        main(
            [
                "bench",
                "avatar_int8",
                "--out",
                str(out),
                "--clips",
                str(clips),
                "--clip-count",
                "1",
                "--modes",
                "dynamic",
                "--seconds",
                "1",
                "--repeats",
                "1",
            ]
        )
        == 0
    )
    r = json.loads(out.read_text())
    assert set(r["variants"]) >= {"fp32", "dynamic:audio", "dynamic:dit", "dynamic:vae"}
    fp32 = r["variants"]["fp32"]["quality"]
    assert fp32["openness_corr"] > 0.5 and fp32["identity_ssim"] > 0.9  # the shipped avatar on a held-out clip
    for model, t in r["side_by_side"]["dynamic"]["ms_per_frame"].items():
        assert t["fp32"] > 0 and t["int8"] > 0, model
    assert set(r["decision"]["models"]) <= {"audio", "dit", "vae"} and r["decision"]["summary"]
    assert (tmp_path / "int8.png").stat().st_size > 1000
    assert main(["bench", "avatar_int8", "--out", str(out), "--modes", "fp16"]) == 2
