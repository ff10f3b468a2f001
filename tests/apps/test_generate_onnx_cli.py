"""`framegraph export --generate` + `framegraph generate --runtime onnx`: a tiny Wan folder (stock diffusers
classes) generates, with its causal VAE decoder on ONNX Runtime, the MP4 it generates on torch (PSNR >= 40 dB
frame by frame, a picture that moves); a missing or stale export, or one for another chunk length, is refused
with a sentence that names the export command."""
import shutil

import numpy as np
import pytest
from helpers import psnr_per_frame, tiny_generate_folder, tiny_prompt_embeds

pytest.importorskip("onnx")

from framegraph.apps.cli import main
from framegraph.stream.media import read_video

SIZE = ["--size", "32x48"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen_onnx")
    folder = tiny_generate_folder(root / "wan", "wan")
    embeds = tiny_prompt_embeds(root / "prompt.safetensors")
    assert main(["export", "--generate", str(folder), *SIZE, "--chunk-frames", "2"]) == 0
    assert (folder / "onnx" / "vae_32x48_f2" / "manifest.json").is_file()  # where generate looks by default
    return folder, embeds


def generate(folder, embeds, out, *extra) -> int:
    return main(["generate", "--model", str(folder), "--prompt-embeds", str(embeds), *SIZE, "--chunks", "3",
                 "--chunk-frames", "2", "--device", "cpu", "--out", str(out), *extra])


def test_generate_on_onnx_writes_the_torch_video(exported, tmp_path, capsys):
    folder, embeds = exported
    assert generate(folder, embeds, tmp_path / "torch.mp4", "--runtime", "torch") == 0
    assert generate(folder, embeds, tmp_path / "onnx.mp4", "--runtime", "onnx") == 0
    assert "VAE on onnx" in capsys.readouterr().err
    a, b = read_video(tmp_path / "torch.mp4")["frames"], read_video(tmp_path / "onnx.mp4")["frames"]
    assert a.shape == b.shape == (1 + 4 * 5, 32, 48, 3)  # 3 chunks of 2 latent frames
    assert psnr_per_frame(a, b).min() >= 40.0
    assert b.std() > 5 and np.abs(np.diff(b.astype(np.float64), axis=0)).mean() > 1.0  # a picture, and it moves


def test_missing_and_stale_exports_are_refused_naming_the_export_command(exported, tmp_path, capsys):
    folder, embeds = exported
    out = tmp_path / "x.mp4"
    assert generate(folder, embeds, out, "--runtime", "onnx", "--chunk-frames", "1") == 2  # exported for 2 only
    err = capsys.readouterr().err
    assert "no ONNX export" in err and f"framegraph export --generate {folder} --size 32x48 --chunk-frames 1" in err
    other = tmp_path / "other"
    shutil.copytree(folder, other, ignore=shutil.ignore_patterns("onnx"))
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(str(other / "vae"))
    vae.decoder.conv_out.bias.data += 0.1  # retrained weights: the old export is stale
    vae.save_pretrained(str(other / "vae"))
    assert generate(other, embeds, out, "--runtime", "onnx", "--onnx", str(folder / "onnx" / "vae_32x48_f2")) == 2
    err = capsys.readouterr().err
    assert "another or an older VAE" in err and f"framegraph export --generate {other} --size 32x48" in err
    assert not out.exists()


def test_bad_export_and_backend_arguments_say_what_to_do(exported, tmp_path, capsys):
    folder, embeds = exported
    assert main(["export", "--generate", str(folder)]) == 2
    assert "--generate needs --size" in capsys.readouterr().err
    assert main(["export", "--generate", str(tmp_path), *SIZE]) == 2
    assert "vae/config.json: missing" in capsys.readouterr().err
    assert generate(folder, embeds, tmp_path / "x.mp4", "--onnx", str(tmp_path)) == 2
    assert "--onnx DIR goes with --runtime onnx" in capsys.readouterr().err
