"""``framegraph generate`` over tiny random Wan 2.1 / SANA-Video folders (stock diffusers classes, saved with
save_pretrained): a playable MP4 with the frame count the chunks decode to and a picture that changes;
text prompts through a tiny UMT5 text encoder, precomputed embeddings, single-file Wan students, video-to-video;
bad input refused with a sentence that names the file and the fix."""
import json
import shutil

import numpy as np
import pytest
import torch
from helpers import GEN_TEXT_DIM, tiny_generate_folder, tiny_prompt_embeds
from safetensors.torch import load_file, save_file

from framegraph.apps.cli import main
from framegraph.models.generate import load_generate_model
from framegraph.stream.media import read_video

SIZE = ["--size", "32x48"]  # HxW: 4x6 latents, 2x3 patches per latent frame


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    return {"wan": tiny_generate_folder(root / "wan", "wan", text_encoder=True),
            "sana": tiny_generate_folder(root / "sana", "sana"),
            "embeds": tiny_prompt_embeds(root / "prompt.safetensors"), "root": root}


def changes(frames: np.ndarray) -> float:
    """Mean absolute change between consecutive frames (0..255)."""
    return float(np.abs(np.diff(frames.astype(np.float32), axis=0)).mean())


@pytest.mark.parametrize("family, extra, frames", [
    ("wan", ["--prompt", "a red fox in the snow", "--chunks", "3", "--chunk-frames", "2"], 1 + 4 * 5),
    ("wan", ["--prompt", "a cat", "--chunks", "2", "--attention", "monarch"], 1 + 4 * 5),
    ("sana", ["--prompt-embeds", "EMBEDS", "--seconds", "2"], 1 + 4 * 8),  # 32 frames -> 3 chunks of 3
])
def test_generate_writes_a_playable_mp4_whose_picture_changes(folders, tmp_path, family, extra, frames):
    out = tmp_path / "gen.mp4"
    extra = [str(folders["embeds"]) if a == "EMBEDS" else a for a in extra]
    assert main(["generate", "--model", str(folders[family]), *SIZE, *extra, "--out", str(out)]) == 0
    video = read_video(out)
    assert video["frames"].shape == (frames, 32, 48, 3)
    assert video["fps"] == pytest.approx(16)
    assert video["frames"].std() > 5 and changes(video["frames"]) > 1.0  # a picture, and it moves


def test_prompts_change_the_picture_and_are_encoded_by_the_folders_text_encoder(folders, tmp_path):
    outs = []
    for i, prompt in enumerate(["a red fox in the snow", "blue sky river", "a red fox in the snow"]):
        outs.append(tmp_path / f"p{i}.mp4")
        assert main(["generate", "--model", str(folders["wan"]), *SIZE, "--prompt", prompt, "--chunks", "1",
                     "--out", str(outs[-1])]) == 0
    a, b, again = (read_video(o)["frames"].astype(np.float32) for o in outs)
    assert np.array_equal(a, again)  # the same seed and prompt: the same video, so what differs is the prompt
    assert np.abs(a - b).mean() > 0.1  # another prompt: another video


def test_video_to_video_keeps_the_input_length_and_restyles_what_it_is_given(folders, tmp_path):
    inputs = []
    for seed in ("0", "1"):  # two input videos: text-to-video runs with two seeds
        inputs.append(tmp_path / f"in{seed}.mp4")
        assert main(["generate", "--model", str(folders["sana"]), *SIZE, "--prompt-embeds", str(folders["embeds"]),
                     "--chunks", "2", "--seed", seed, "--out", str(inputs[-1])]) == 0
    frames = read_video(inputs[0])["frames"]
    outs = {}
    for name, video in zip("ab", inputs):
        for strength in ("0.3", "1.0"):
            out = tmp_path / f"{name}{strength}.mp4"
            assert main(["generate", "--model", str(folders["sana"]), *SIZE, "--prompt-embeds", str(folders["embeds"]),
                         "--input", str(video), "--strength", strength, "--chunks", "2", "--out", str(out)]) == 0
            outs[name, strength] = read_video(out)["frames"].astype(np.float32)
    assert outs["a", "0.3"].shape == frames.shape  # the input's frame count and size
    # strength 1 keeps nothing of the input (pure noise): two inputs give one video; below 1 each its own. One
    # video, not bit for bit: quiet, 0.000 and 3.6 levels apart; in a loaded suite the first was once not 0 (the
    # cause not yet found: the encoder was seen to vary at other sizes, docs/bench_notes.md)
    same, own = (np.abs(outs["a", s] - outs["b", s]).mean() for s in ("1.0", "0.3"))
    assert same < 0.5 and own > 1.0, (same, own)


def wan_original_state_dict(model) -> dict:
    """The diffusers Wan transformer's weights under the original Wan key names (what Self-Forcing ships)."""
    names = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
             ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
             ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
             ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
             ("condition_embedder.time_proj", "time_projection.1"), ("attn2", "cross_attn"), ("attn1", "self_attn"),
             (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
             ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"), ("proj_out", "head.head"),
             ("norm2", "norm__x"), ("norm3", "norm2"), ("norm__x", "norm3")]
    out = {}
    for key, value in model.state_dict().items():
        if key == "scale_shift_table":
            key = "head.modulation"
        elif key.endswith(".scale_shift_table"):
            key = key.replace("scale_shift_table", "modulation")
        for new, old in names:
            key = key.replace(new, old)
        out[key] = value.clone()
    return out


def test_single_file_causal_student_loads_into_the_diffusers_class_with_base(folders, tmp_path):
    base = load_generate_model(str(folders["wan"]))
    student = {k: v + 0.01 for k, v in wan_original_state_dict(base.transformer).items()}  # "trained" weights
    ckpt = tmp_path / "self_forcing.pt"
    torch.save({"generator_ema": {f"model.{k}": v for k, v in student.items()}}, ckpt)
    loaded = load_generate_model(str(ckpt), base=str(folders["wan"]))
    for key, value in base.transformer.state_dict().items():
        torch.testing.assert_close(loaded.transformer.state_dict()[key], value + 0.01, msg=key)
    out = tmp_path / "student.mp4"
    assert main(["generate", "--model", str(ckpt), "--base", str(folders["wan"]), *SIZE, "--prompt", "a fox",
                 "--chunks", "1", "--out", str(out)]) == 0
    assert read_video(out)["frames"].shape[0] == 9


def run_error(capsys, *argv) -> str:
    assert main(["generate", *argv]) == 2
    return capsys.readouterr().err


def test_bad_input_is_refused_with_the_file_and_the_fix(folders, tmp_path, capsys):
    wan, out = folders["wan"], str(tmp_path / "x.mp4")
    broken = shutil.copytree(wan, tmp_path / "novae")
    shutil.rmtree(broken / "vae")
    assert "novae/vae/config.json: missing" in run_error(capsys, "--model", str(broken), "--prompt", "a", "--out", out)

    assert "size 30x48 (HxW): height must be a positive multiple of 16" in run_error(
        capsys, "--model", str(wan), "--prompt", "a", "--size", "30x48", "--out", out)

    bad_embeds = tmp_path / "bad.safetensors"
    save_file({"prompt_embeds": torch.zeros(4, GEN_TEXT_DIM + 1)}, str(bad_embeds))
    assert f"expected 'prompt_embeds' of shape [L, {GEN_TEXT_DIM}]" in run_error(
        capsys, "--model", str(wan), "--prompt-embeds", str(bad_embeds), *SIZE, "--out", out)

    assert "sana has no text_encoder/ folder" in run_error(
        capsys, "--model", str(folders["sana"]), "--prompt", "a", *SIZE, "--out", out)

    assert "holds a 'sana' model but --family wan" in run_error(
        capsys, "--model", str(folders["sana"]), "--family", "wan", "--prompt", "a", "--out", out)

    noncausal = tiny_generate_folder(tmp_path / "patch2", "wan", patch_size=(2, 2, 2))
    assert "needs a temporal patch of 1" in run_error(
        capsys, "--model", str(noncausal), "--prompt-embeds", str(folders["embeds"]), *SIZE, "--out", out)

    ckpt = tmp_path / "other.safetensors"  # a student of a wider model than the base
    wide = tiny_generate_folder(tmp_path / "wide", "wan", attention_head_dim=32)
    save_file(wan_original_state_dict(load_generate_model(str(wide)).transformer), str(ckpt))
    message = run_error(capsys, "--model", str(ckpt), "--base", str(wan), "--prompt", "a", *SIZE, "--out", out)
    assert f"{ckpt} does not match" in message and "of another shape" in message
    assert "needs --base DIR" in run_error(capsys, "--model", str(ckpt), "--prompt", "a", "--out", out)

    weights = next((wan / "transformer").glob("*.safetensors"))
    cut = tmp_path / "cut"
    shutil.copytree(wan, cut)
    state = load_file(str(weights))
    state.pop(next(iter(state)))
    save_file(state, str(cut / "transformer" / weights.name))
    assert "1 missing keys" in run_error(capsys, "--model", str(cut), "--prompt", "a", *SIZE, "--out", out)

    bad = shutil.copytree(wan, tmp_path / "badparts")
    (bad / "text_encoder" / "config.json").write_text("garbage")
    assert "text_encoder/ or tokenizer/ cannot be loaded" in run_error(
        capsys, "--model", str(bad), "--prompt", "a", *SIZE, "--out", out)
    vae_weights = next((bad / "vae").glob("*.safetensors"))
    vae_weights.write_bytes(vae_weights.read_bytes()[:100])
    assert f"{vae_weights}: not a readable safetensors file" in run_error(
        capsys, "--model", str(bad), "--prompt-embeds", str(folders["embeds"]), *SIZE, "--out", out)

    index = json.loads((wan / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline"
    assert "expected strictly decreasing" in run_error_argparse(capsys, "--timesteps", "250,500")


def run_error_argparse(capsys, *argv) -> str:
    with pytest.raises(SystemExit):
        main(["generate", "--model", "x", "--prompt", "a", "--out", "x.mp4", *argv])
    return capsys.readouterr().err


def test_video_to_video_scales_an_input_of_another_size(folders, tmp_path):
    big = tmp_path / "big.mp4"
    assert main(["generate", "--model", str(folders["sana"]), "--size", "64x96", "--prompt-embeds",
                 str(folders["embeds"]), "--chunks", "1", "--out", str(big)]) == 0
    out = tmp_path / "small.mp4"
    assert main(["generate", "--model", str(folders["sana"]), *SIZE, "--prompt-embeds", str(folders["embeds"]),
                 "--input", str(big), "--strength", "0.5", "--seconds", "1.5", "--out", str(out)]) == 0
    frames = read_video(out)["frames"]
    # 24 frames asked: 3 chunks of 3 (2 make 21); the 9-frame input looped
    assert frames.shape == (1 + 4 * 8, 32, 48, 3)
    assert frames.std() > 5
