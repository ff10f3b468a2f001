"""MuseTalk on ONNX Runtime and in batches: `framegraph export --avatar` writes the UNet step and the VAE decoder;
their faces are the torch step's (within a level of rounding), a batch's rows are each alone, a render on the export
is the torch render; an export of other model files, or none, is refused with the command that makes it; sessions
through one model service get the frames each makes alone."""
import shutil

import numpy as np
import pytest
import torch
from helpers import sessions_frames, tiny_musetalk_folder, write_wav

pytest.importorskip("onnx")

from framegraph.apps.cli import main
from framegraph.models.avatar import build_avatar_graph, load_avatar
from framegraph.models.avatar.base import RunSettings
from framegraph.models.avatar.musetalk.audio import ROWS
from framegraph.models.avatar.musetalk.engines import torch_engines, whisper_engine
from framegraph.models.avatar.musetalk.files import MuseTalkFiles
from framegraph.models.avatar.musetalk.onnx import UNetAtZero, onnx_step
from framegraph.models.onnx import ExportError
from framegraph.models.synth import synthesize
from framegraph.stream.batching import ModelService
from framegraph.stream.media import SAMPLE_RATE, PushAudioSource, read_video


@pytest.fixture(scope="module")
def exported(musetalk_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("musetalk_onnx") / "onnx"
    assert main(["export", "--avatar", str(musetalk_bundle), "--out", str(out)]) == 0
    return load_avatar(musetalk_bundle), str(out)


def inputs(avatar, n: int):
    whisper = whisper_engine(avatar)
    g = torch.Generator().manual_seed(n)
    picks = torch.randint(0, len(avatar.latents), (n,), generator=g)
    return avatar.latents[picks].float(), torch.randn(n, ROWS * whisper.layers, whisper.width, generator=g)


def test_the_export_draws_the_torch_steps_face(exported):
    avatar, out = exported
    step = onnx_step(avatar, RunSettings(onnx_dir=out), threads=1)
    torch_step = torch_engines(avatar, RunSettings()).step
    latents, windows = inputs(avatar, 2)
    with torch.inference_mode():
        want_latent = UNetAtZero(torch_step)(latents, windows)
        want = torch_step(latents, windows)
    got = step(latents, windows)
    assert got.dtype == torch.uint8 and got.shape == want.shape
    latent = step._out[2][0]
    assert float((latent - want_latent).abs().max()) <= 1e-4 * float(want_latent.abs().max())
    diff = (got.int() - want.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01  # a level, where rounding falls apart


def test_a_batch_gives_each_row_its_own_face(exported):
    avatar, out = exported
    step = onnx_step(avatar, RunSettings(onnx_dir=out), threads=1)
    latents, windows = inputs(avatar, 4)
    together = step(latents, windows).clone()
    for i in range(4):
        alone = step(latents[i:i + 1], windows[i:i + 1])
        assert int((alone.int() - together[i:i + 1].int()).abs().max()) <= 1


def speech(tmp_path, text: str = "Hello there, this is the avatar talking."):
    said = synthesize(text, voice="en-us", sample_rate=SAMPLE_RATE).samples
    quiet = np.zeros(SAMPLE_RATE // 2, np.int16)
    return np.concatenate([quiet, said.astype(np.int16), quiet])


def test_a_render_on_the_export_is_the_torch_render(exported, tmp_path):
    avatar, out = exported
    wav = write_wav(tmp_path / "speech.wav", speech(tmp_path))
    videos = []
    for runtime in ("torch", "onnx"):
        path = tmp_path / f"{runtime}.mp4"
        extra = ["--onnx", out] if runtime == "onnx" else []
        assert main(["render", "--avatar", avatar.root, "--audio", str(wav), "--out", str(path), "--runtime", runtime,
                     *extra]) == 0
        videos.append(read_video(path)["frames"].astype(np.float32))
    a, b = videos
    assert a.shape == b.shape
    assert np.abs(a - b).mean() < 0.5  # the same pictures, less the encoder's noise on a level's difference


def test_an_export_of_other_files_or_none_is_refused_with_the_command(exported, tmp_path):
    avatar, out = exported
    other = load_avatar(avatar.root)
    other.files = MuseTalkFiles.find(tiny_musetalk_folder(tmp_path / "other", seed=1))
    with pytest.raises(ExportError, match=r"made from another or an older MuseTalk model.*framegraph export --avatar"):
        onnx_step(other, RunSettings(onnx_dir=out), threads=1)
    with pytest.raises(ExportError, match=r"no ONNX export at .*framegraph export --avatar BUNDLE"):
        onnx_step(avatar, RunSettings(onnx_dir=str(tmp_path / "none")), threads=1)
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "vae_decoder.onnx").unlink()
    with pytest.raises(ExportError, match=r"lacks vae_decoder.onnx"):
        onnx_step(avatar, RunSettings(onnx_dir=str(broken)), threads=1)


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_sessions_through_one_service_get_their_own_frames(exported, runtime):
    avatar, out = exported
    audios = [speech(None, text) for text in ("Quick brown foxes.", "Lazy dogs sleep.")]
    kw = {"runtime": runtime, "onnx_dir": out, "vad": False}
    want = [sessions_frames(avatar, [a], RunSettings(**kw))[0] for a in audios]
    service = ModelService()
    got = sessions_frames(avatar, audios, RunSettings(batching=service, **kw))
    for g, w in zip(got, want):
        assert g.shape == w.shape and np.abs(g.astype(int) - w).max() <= 1
    n = min(len(g) for g in got)
    assert np.abs(got[0][:n].astype(int) - got[1][:n]).max() > 10  # and the two sessions' faces differ
    (lane,) = service.lanes().values()
    assert max(lane.stats.batches) >= 2 and not lane.running  # batches were formed; the lane ended with them


def test_batching_on_a_runtime_without_a_batch_or_onnx_on_a_gpu_is_refused_in_a_sentence(exported):
    avatar, _ = exported
    with pytest.raises(ValueError, match="avatar-musetalk-batch runs on torch or onnx, not 'compiled'"):
        build_avatar_graph(avatar, PushAudioSource(), settings=RunSettings(runtime="compiled", batching=ModelService()))
    with pytest.raises(ValueError, match="runs? on the CPU; got device 'cuda'"):
        build_avatar_graph(avatar, PushAudioSource(), settings=RunSettings(device="cuda", runtime="onnx",
                                                                            batching=ModelService()))
