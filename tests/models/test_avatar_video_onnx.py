"""The video avatar on ONNX Runtime: the exported generator draws what the torch one draws, the whole graph on
runtime "onnx" gives the torch frames, and an export of another bundle is refused naming the command."""
import numpy as np
import pytest
import torch
from helpers import avatar_session, psnr_per_frame

pytest.importorskip("onnx")

from framegraph.models.avatar import RunSettings, build_avatar_graph, random_video_avatar
from framegraph.models.avatar.video.onnx import OrtGenerator, load_manifest
from framegraph.models.onnx import CheckedExport, ExportError
from framegraph.stream.media import SAMPLE_RATE, PushAudioSource


@pytest.fixture(scope="module")
def exported(exported_video_avatar):
    return exported_video_avatar


def test_the_exported_generator_draws_the_torch_picture(exported):
    avatar, out = exported
    S = avatar.region_size
    ort = OrtGenerator(CheckedExport(out, load_manifest(out, avatar)).graph("generator", 1), S)
    mask = avatar.mask[None, None].float()
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x, ref, shape = torch.rand(1, 3, S, S, generator=g), torch.rand(1, 3, S, S, generator=g), torch.randn(1, 3)
        with torch.no_grad():
            want = avatar.generator(x * (1 - mask), mask, ref, shape)
        got = ort(x * (1 - mask), mask, ref, shape)
        assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def frames(avatar, audio: np.ndarray, **kw) -> np.ndarray:
    graph, sink = avatar_session(avatar, audio, RunSettings(**kw))
    graph.run(timeout=120)
    return torch.stack(sink.data()).numpy()


def test_the_graph_on_onnx_gives_the_torch_frames(exported):
    avatar, out = exported
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    speech = (np.sin(2 * np.pi * 180 * t) * 6000 * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.int16)
    torch_frames = frames(avatar, speech)
    ort_frames = frames(avatar, speech, runtime="onnx", onnx_dir=out)
    assert len(ort_frames) == len(torch_frames) == 25
    assert psnr_per_frame(torch_frames, ort_frames).min() >= 40.0


def test_an_export_of_another_bundle_or_runtime_is_refused(exported, tmp_path):
    _, out = exported
    other = random_video_avatar(seed=1)
    with pytest.raises(ExportError, match="another or an older bundle.*framegraph export --avatar"):
        build_avatar_graph(other, PushAudioSource(), settings=RunSettings(runtime="onnx", onnx_dir=out))
    with pytest.raises(ExportError, match="no ONNX export"):
        build_avatar_graph(other, PushAudioSource(), settings=RunSettings(runtime="onnx", onnx_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="avatar-video runs on torch, compiled or onnx, not 'onnx-int8'"):
        build_avatar_graph(other, PushAudioSource(), settings=RunSettings(runtime="onnx-int8", onnx_dir=out))
