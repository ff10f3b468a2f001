"""The video avatar's generator in batches: on torch and on ONNX Runtime (the export's dynamic batch axis) each row of
a batch is what that session's call alone gives (≤ 1e-5), and on the compiled runtime, a compiled call per batch
bucket, to Inductor's rounding; live sessions on ONNX Runtime through one model service get the frames each makes
alone; an export without the batch axis is refused, naming the command."""
import numpy as np
import pytest
import torch
from helpers import sessions_frames

pytest.importorskip("onnx")

from framegraph.models.avatar import RunSettings, build_avatar_graph
from framegraph.models.avatar.video.onnx import OrtBatchGenerator, OrtGenerator, load_manifest
from framegraph.models.onnx import CheckedExport, ExportError, OrtGraph
from framegraph.models.onnx.trace import export_module
from framegraph.stream.batching import ModelService
from framegraph.stream.media import SAMPLE_RATE, PushAudioSource


@pytest.fixture(scope="module")
def exported(exported_video_avatar):
    return exported_video_avatar


def batch(avatar, n: int):
    S, g = avatar.region_size, torch.Generator().manual_seed(n)
    mask = avatar.mask[None, None].float().expand(n, 1, S, S).contiguous()
    return (torch.rand(n, 3, S, S, generator=g) * (1 - mask), mask, torch.rand(n, 3, S, S, generator=g),
            torch.randn(n, 3, generator=g))


def assert_rows_alone(run_batch, run_one, inputs):
    got = run_batch(*inputs).clone()
    for i in range(got.shape[0]):
        want = run_one(*(t[i:i + 1] for t in inputs))
        assert float((got[i:i + 1] - want).abs().max()) <= 1e-5


@torch.no_grad()
def test_torch_batches_give_each_row_its_own_picture(exported):
    avatar, _ = exported
    for n in (2, 4, 8):
        assert_rows_alone(avatar.generator, avatar.generator, batch(avatar, n))


def test_onnx_batches_give_each_row_its_own_picture(exported):
    avatar, out = exported
    export = CheckedExport(out, load_manifest(out, avatar))
    assert export.manifest["files"]["generator"]["batch"] == "dynamic"
    batched = OrtBatchGenerator(export.graph("generator", 1), avatar.region_size)
    one = OrtGenerator(export.graph("generator", 1), avatar.region_size)
    for n in (2, 4, 8):
        assert_rows_alone(batched, lambda *a: one(*a).clone(), batch(avatar, n))
    with torch.no_grad():  # and the batch is the torch model's
        inputs = batch(avatar, 4)
        assert float((batched(*inputs) - avatar.generator(*inputs)).abs().max()) <= 1e-4


def test_an_export_without_the_batch_axis_is_refused(exported, tmp_path):
    avatar, _ = exported
    path = str(tmp_path / "generator.onnx")
    export_module(avatar.generator.float().eval(), batch(avatar, 1), path, ["masked", "mask", "reference", "shape"],
                  ["picture"])
    with pytest.raises(ExportError, match=r"batch axis fixed to 1.*run `framegraph export --avatar BUNDLE` again"):
        OrtBatchGenerator(OrtGraph(path), avatar.region_size)


def test_sessions_on_onnx_through_one_service_get_their_own_frames(exported):
    avatar, out = exported
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    audios = [(np.sin(2 * np.pi * f * t) * 6000 * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.int16)
              for f in (150, 200, 250)]
    want = [sessions_frames(avatar, [a], RunSettings(runtime="onnx", onnx_dir=out))[0] for a in audios]
    service = ModelService()
    got = sessions_frames(avatar, audios, RunSettings(runtime="onnx", onnx_dir=out, batching=service))
    for g, w in zip(got, want):
        assert g.shape == w.shape and np.abs(g.astype(int) - w).max() <= 1  # rounding of a value ≤ 1e-5 apart
    (lane,) = service.lanes().values()
    assert max(lane.stats.batches) >= 2


@torch.no_grad()
def test_compiled_buckets_give_each_row_its_own_picture(exported):
    """On the compiled runtime a batch runs at its bucket's size, padded with copies of its last row: 1 row runs as
    2, 3 as 4. Each real row is the eager generator's alone (Inductor's rounding apart); one compile per bucket."""
    from framegraph.models.buckets import BucketedStep

    avatar, _ = exported
    step = BucketedStep(avatar.generator, device="cpu", buckets=(2, 4), name="video-generator")
    for n in (1, 3, 4):
        inputs = batch(avatar, n)
        got = step(*inputs)
        assert got.shape[0] == n
        for i in range(n):
            want = avatar.generator(*(t[i:i + 1] for t in inputs))
            assert float((got[i:i + 1] - want).abs().max()) <= 1e-4, (n, i)
    assert sorted(step.steps) == [2, 4]
    with pytest.raises(ValueError, match="a batch of 5 rows; the largest bucket is 4"):
        step(*batch(avatar, 5))


def test_batching_on_the_compiled_runtime_builds_a_lane_of_buckets(exported):
    from framegraph.models.avatar.video.engines import compiled_batch
    from framegraph.models.buckets import BucketedStep
    from framegraph.stream.batching import BUCKETS

    avatar, _ = exported
    engine = compiled_batch(avatar, RunSettings(runtime="compiled"))
    assert isinstance(engine, BucketedStep) and engine.buckets == list(BUCKETS) and not engine.graphs  # CPU: none
    build_avatar_graph(avatar, PushAudioSource(), settings=RunSettings(runtime="compiled", batching=ModelService()))


def test_batching_on_onnx_on_a_gpu_is_refused_in_a_sentence(exported):
    avatar, _ = exported
    with pytest.raises(ValueError, match="runs? on the CPU; got device 'cuda'"):
        build_avatar_graph(avatar, PushAudioSource(), settings=RunSettings(device="cuda", runtime="onnx",
                                                                            batching=ModelService()))
