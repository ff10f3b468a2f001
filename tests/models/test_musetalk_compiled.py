"""MuseTalk's compiled runtime: one step per batch size, each what the torch step draws. On a CPU the wiring is
checked with Inductor off (compiling the tiny UNet and VAE takes over a minute on 2 cores); on CUDA (GPU only,
run by ``benchmarks/gpu_run.sh``) the compiled step replayed from CUDA graphs is checked against the eager one, and
a render on the compiled runtime against a render on torch."""
import numpy as np
import pytest
import torch

from framegraph.models.avatar import load_avatar
from framegraph.models.avatar.base import RunSettings
from framegraph.models.avatar.musetalk.audio import ROWS
from framegraph.models.avatar.musetalk.engines import CompiledStep, compiled_engines, torch_engines
from framegraph.models.compile import CompileSettings


def inputs(avatar, whisper, n: int, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(n)
    return (avatar.latents[:n].to(device, dtype),
            torch.randn(n, ROWS * whisper.layers, whisper.width, generator=g).to(device, dtype))


def test_the_compiled_step_keeps_a_step_per_batch_size_each_the_torch_steps_faces(musetalk_bundle):
    avatar = load_avatar(musetalk_bundle)
    eager = torch_engines(avatar, RunSettings())
    step = CompiledStep(eager.step, CompileSettings(inductor=False), "cpu")
    assert (step.max_rows, step.width) == (eager.step.max_rows, eager.step.width) and not step.graphs
    with torch.inference_mode():
        for n in (1, 2, 1):
            x = inputs(avatar, eager.whisper, n)
            assert torch.equal(step(*x), eager.step(*x))
    assert sorted(step._steps) == [1, 2]


@pytest.mark.gpu
@pytest.mark.usefixtures("compile_cache")
def test_on_cuda_the_graphed_compiled_step_draws_the_eager_steps_faces(musetalk_bundle):
    avatar = load_avatar(musetalk_bundle)
    settings = RunSettings(runtime="compiled", device="cuda")
    fast, eager = compiled_engines(avatar, settings), torch_engines(avatar, RunSettings(device="cuda"))
    assert fast.step.graphs and fast.dtype == torch.float16
    with torch.inference_mode():
        for n in (1, 2):
            x = inputs(avatar, eager.whisper, n, "cuda", torch.float16)
            want = eager.step(*x)
            for _ in range(3):  # warm-up, capture, replays
                got = fast.step(*x)
            assert int((got.int() - want.int()).abs().max()) <= 2
    assert all(s.captured for s in fast.step._steps.values())


@pytest.mark.gpu
@pytest.mark.usefixtures("compile_cache")
def test_on_cuda_a_render_on_the_compiled_runtime_is_the_torch_render(musetalk_bundle, tmp_path):
    from helpers import write_wav

    from framegraph.apps.cli import main
    from framegraph.models.synth import synthesize
    from framegraph.stream.media import read_video

    said = synthesize("The compiled face speaks.", voice="en-us", sample_rate=16_000).samples.astype(np.int16)
    wav = write_wav(tmp_path / "s.wav", said)
    videos = []
    for runtime in ("torch", "compiled"):
        out = tmp_path / f"{runtime}.mp4"
        assert main(["render", "--avatar", str(musetalk_bundle), "--audio", str(wav), "--out", str(out),
                     "--runtime", runtime, "--device", "cuda"]) == 0
        videos.append(read_video(out)["frames"].astype(np.float32))
    assert videos[0].shape == videos[1].shape and np.abs(videos[0] - videos[1]).mean() < 1.0
