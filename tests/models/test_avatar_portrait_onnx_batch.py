"""The portrait's DiT and VAE decoder in batches on ONNX Runtime (the export's dynamic batch axis): over several
blocks, with sessions of different stream ages joining and leaving, each row is what that session gets alone on ONNX
Runtime (≤ 1e-4) and what the torch batch gives (≤ 1e-3); live sessions on ``--runtime onnx`` through one model service
get the frames each makes alone; an export without the batch axis is refused, naming the command, and still runs
one session."""
import numpy as np
import pytest
import torch
from helpers import dit_block_inputs, random_portrait_avatar, rel, sessions_frames

pytest.importorskip("onnx")

from framegraph.models.avatar import RunSettings, random_avatar
from framegraph.models.avatar.portrait import onnx as portrait_onnx
from framegraph.models.avatar.portrait.engines import AvatarExport, OrtBlockStep, OrtDecodeStep, OrtDiT
from framegraph.models.avatar.portrait.onnx import export_avatar
from framegraph.models.dit.batch import BlockStep
from framegraph.models.onnx import ExportError, OrtVAEStream
from framegraph.models.vae import TorchVAE, uint8_to_frames
from framegraph.models.vae.batch import SHARED, DecodeStep
from framegraph.stream.batching import ModelService
from framegraph.stream.media import SAMPLE_RATE

# Which sessions run each block: 2, then 3 (one joins, its stream new), then 2 (the oldest leaves), then 3 again.
ROUNDS = [(0, 1), (0, 1, 2), (1, 2), (1, 2, 3), (1, 2, 3)]


@pytest.fixture(scope="module", params=["one frame a block", "two frames a block"])
def exported(request, tmp_path_factory):
    """A random portrait avatar and the folder of its ONNX export: ``(avatar, folder)``."""
    if request.param == "one frame a block":
        avatar = random_portrait_avatar(torch.Generator().manual_seed(0))
    else:
        avatar = random_avatar(region_size=64, chunk_frames=2, dit_config={"frames_per_block": 2})
    out = str(tmp_path_factory.mktemp("portrait_onnx"))
    export_avatar(avatar, out)
    return avatar, out


def rows(parts):
    """One batch of the rows ``parts``, each a tuple of batch-1 tensors."""
    return [torch.cat(p) for p in zip(*parts)]


@torch.inference_mode()
def test_dit_batches_give_each_session_its_block_alone_as_sessions_join_and_leave(exported):
    avatar, out = exported
    export = AvatarExport(out, avatar)
    model, ref = avatar.dit.eval(), avatar.reference_latent()
    batched = OrtBlockStep(model, export.graph("dit_velocity"), export.graph("dit_commit"), steps=2,
                           shift=avatar.shift)
    torch_step = BlockStep(model, steps=2, shift=avatar.shift)
    g = torch.Generator().manual_seed(3)
    sessions = []  # per session: its stream (advanced by the batches) and its engine alone on ONNX Runtime
    for age in (3, 0, 1, 0):  # blocks each has already made when it joins
        alone = OrtDiT(model, export.graph("dit_velocity"), export.graph("dit_commit"))
        alone.start(ref)
        stream = model.init_stream(ref)
        for _ in range(age):
            block = dit_block_inputs(model.config, ref, g)
            alone.generate(*block, 2, avatar.shift)
            new = torch_step(*block, *(t[None] for t in model.stream_rope(stream)), *stream.tensors())[1:]
            advance(stream, new, model.config.frames_per_block)
        sessions.append((stream, alone))
    for active in ROUNDS:
        blocks = [dit_block_inputs(model.config, ref, g) for _ in active]
        inputs = rows([(*b, *(t[None] for t in model.stream_rope(sessions[i][0])), *sessions[i][0].tensors())
                       for i, b in zip(active, blocks)])
        got, want = batched(*inputs), torch_step(*inputs)
        assert len(got) == len(want) == 2 + 3 * len(model.blocks)
        for a, b in zip(got, want):
            assert a.shape == b.shape and rel(a, b) <= 1e-3
        for row, (i, block) in enumerate(zip(active, blocks)):
            stream, alone = sessions[i]
            x0 = alone.generate(*block, 2, avatar.shift).clone()
            assert rel(got[0][row:row + 1], x0) <= 1e-4
            advance(stream, [t[row:row + 1] for t in got[1:]], model.config.frames_per_block)
            mine = alone.ort.sets[alone.ort.parity]
            for a, b in zip(stream.tensors(), mine.tensors()):
                assert rel(a, b) <= 1e-4
            assert stream.frames == mine.frames
    k = model.config.frames_per_block
    assert [s.frames for s, _ in sessions] == [5 * k, 5 * k, 5 * k, 2 * k]  # each at its own age: the rope per row


def advance(stream, new, frames: int) -> None:
    """Write a block step's new tensors into ``stream``, ``frames`` on, as the batched engine does."""
    for t, v in zip([t for layer in stream.layers for t in layer.tensors()] + [stream.audio_history], new):
        t.copy_(v)
    stream.frames += frames


@torch.inference_mode()
def test_decoder_batches_give_each_session_its_frames_alone_as_sessions_join_and_leave(exported):
    avatar, out = exported
    export = AvatarExport(out, avatar)
    files = export.manifest["files"]
    vae = avatar.vae.eval()
    ref = uint8_to_frames(avatar.region()[0])[None] if vae.uses_reference else None
    shape = vae.latent_shape(avatar.chunk_frames, avatar.region_size, avatar.region_size)
    g = torch.Generator().manual_seed(4)
    sessions = []  # per session: its torch decoder (for its cache, advanced by the batches) and its ONNX one alone
    for age in (3, 1, 2, 1):  # chunks each has already decoded when it joins: its first starts the cache
        mine, alone = TorchVAE(vae, ref), OrtVAEStream(export.graph("vae_first"), export.graph("vae_next"), files, ref)
        for _ in range(age):
            z = torch.randn(1, *shape, generator=g)
            mine.decode(z)
            alone.decode(z)
        sessions.append((mine, alone))
    keys = sorted(k for k in sessions[0][0].cache if not k.startswith(SHARED))
    shared = {k: v[:1] for k, v in sessions[0][0].cache.items() if k.startswith(SHARED)}
    assert keys
    batched = OrtDecodeStep(export.graph("vae_next"), files, keys, shared)
    torch_step = DecodeStep(vae, keys, shared)
    for active in ROUNDS:
        chunks = [torch.randn(1, *shape, generator=g) for _ in active]
        inputs = rows([(z, *(sessions[i][0].cache[k] for k in keys)) for i, z in zip(active, chunks)])
        got, want = batched(*inputs), torch_step(*inputs)
        for a, b in zip(got, want):
            assert a.shape == b.shape and rel(a, b) <= 1e-3
        for row, (i, z) in enumerate(zip(active, chunks)):
            mine, alone = sessions[i]
            assert rel(got[0][row:row + 1], alone.decode(z)) <= 1e-4
            mine.cache = {**mine.cache, **{k: v[row:row + 1].clone() for k, v in zip(keys, got[1:])}}
            theirs = alone.caches[alone.parity]
            for k in keys:
                assert rel(mine.cache[k], theirs[k]) <= 1e-4


def test_sessions_on_onnx_through_one_service_get_their_own_frames(exported):
    avatar, out = exported
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    audios = [(np.sin(2 * np.pi * f * t) * 6000 * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.int16)
              for f in (150, 200, 250)]
    settings = dict(runtime="onnx", onnx_dir=out, steps=1, torch_threads=1)
    want = [sessions_frames(avatar, [a], RunSettings(**settings))[0] for a in audios]
    service = ModelService()
    got = sessions_frames(avatar, audios, RunSettings(**settings, batching=service))
    for a, b in zip(got, want):
        assert a.shape == b.shape and len(a) >= 10
        assert np.abs(a.astype(int) - b).max() <= 1  # rounding of a value ≤ 1e-5 apart
    lanes = {lane.name: lane for lane in service.lanes().values()}
    assert set(lanes) == {"portrait-dit-1-steps-onnx", "portrait-vae-onnx"}
    for lane in lanes.values():
        assert max(lane.stats.batches) >= 2 and lane.stats.failed == 0 and not lane.running


def test_an_export_without_the_batch_axis_is_refused_and_still_runs_one_session(exported, tmp_path, monkeypatch):
    avatar, _ = exported
    fixed = portrait_onnx.export_module
    monkeypatch.setattr(portrait_onnx, "export_module",
                        lambda *args, dynamic_axes=None: fixed(*args))  # as exports made before the batch axis
    export_avatar(avatar, str(tmp_path))
    export = AvatarExport(str(tmp_path), avatar)  # its manifest still loads
    model, ref = avatar.dit.eval(), avatar.reference_latent()
    with pytest.raises(ExportError, match=r"batch axis fixed to 1.*run `framegraph export --avatar BUNDLE` again"):
        OrtBlockStep(model, export.graph("dit_velocity"), export.graph("dit_commit"), steps=1, shift=avatar.shift)
    with pytest.raises(ExportError, match=r"batch axis fixed to 1"):
        OrtDecodeStep(export.graph("vae_next"), export.manifest["files"], [], {})
    with torch.inference_mode():
        alone = OrtDiT(model, export.graph("dit_velocity"), export.graph("dit_commit"))
        alone.start(ref)
        block = dit_block_inputs(model.config, ref, torch.Generator().manual_seed(0))
        stream = model.init_stream(ref)
        want = BlockStep(model, steps=1, shift=avatar.shift)(*block, *(t[None] for t in model.stream_rope(stream)),
                                                            *stream.tensors())[0]
        assert rel(alone.generate(*block, 1, avatar.shift), want) <= 1e-4


def test_sessions_of_an_export_made_before_the_batch_axis_run_alone_and_the_log_says_why(exported, tmp_path,
                                                                                       monkeypatch, caplog):
    """A server that batches keeps serving a bundle whose export is older: its sessions run alone, as before."""
    import json

    from framegraph.models.avatar import build_avatar_graph
    from framegraph.stream.media import PushAudioSource

    avatar, _ = exported
    fixed = portrait_onnx.export_module
    monkeypatch.setattr(portrait_onnx, "export_module", lambda *args, dynamic_axes=None: fixed(*args))
    export_avatar(avatar, str(tmp_path))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for entry in manifest["files"].values():
        entry.pop("batch", None)  # as an older export's manifest
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    service = ModelService()
    settings = RunSettings(runtime="onnx", onnx_dir=str(tmp_path), steps=1, torch_threads=1, batching=service)
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    audio = (np.sin(2 * np.pi * 200 * t) * 6000).astype(np.int16)
    with caplog.at_level("WARNING"):
        ag = build_avatar_graph(avatar, PushAudioSource(), settings=settings)
        frames = sessions_frames(avatar, [audio], settings)[0]
    assert not ag.batched and not service.lanes() and len(frames) >= 10
    assert "has no batch axis, so its sessions run alone; run `framegraph export --avatar BUNDLE`" in caplog.text


@pytest.mark.slow
def test_sessions_on_onnx_int8_through_one_service_get_their_own_frames(tmp_path, caplog):
    """On ``onnx-int8`` with static scales the lanes run the int8 files. A value a row's neighbours move by 1e-6 may
    round to the next int8 step, so a session's frames are its own alone to within int8's rounding: on average far
    closer than int8 is to float32. With dynamic scales (each call's activations scaled over the whole batch) the
    sessions run alone, and the log says why."""
    from framegraph.models.avatar import build_avatar_graph
    from framegraph.models.avatar.int8 import quantize_export
    from framegraph.stream.media import PushAudioSource

    avatar = random_avatar(region_size=64, chunk_frames=2, dit_config={"frames_per_block": 2})
    folders = {mode: str(tmp_path / mode) for mode in ("static", "dynamic")}
    for mode, folder in folders.items():
        export_avatar(avatar, folder)
        quantize_export(avatar, folder, mode, models=["dit", "vae"], calibration_seconds=1.0)
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    audios = [(np.sin(2 * np.pi * f * t) * 6000 * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.int16)
              for f in (150, 250)]
    settings = dict(onnx_dir=folders["static"], steps=1, torch_threads=1)
    want = [sessions_frames(avatar, [a], RunSettings(runtime="onnx-int8", **settings))[0] for a in audios]
    fp32 = [sessions_frames(avatar, [a], RunSettings(runtime="onnx", **settings))[0] for a in audios]
    service = ModelService()
    got = sessions_frames(avatar, audios, RunSettings(runtime="onnx-int8", **settings, batching=service))
    for a, b, c in zip(got, want, fp32):
        assert a.shape == b.shape == c.shape and len(a) >= 10
        batched, int8 = np.abs(a.astype(int) - b), np.abs(b.astype(int) - c)
        assert batched.mean() < 0.25 * int8.mean() and batched.max() <= int8.max(), (batched.mean(), int8.mean())
    lanes = {lane.name: lane for lane in service.lanes().values()}
    assert set(lanes) == {"portrait-dit-1-steps-onnx-int8", "portrait-vae-onnx-int8"}
    assert all(max(lane.stats.batches) >= 2 for lane in lanes.values())
    service = ModelService()
    with caplog.at_level("WARNING"):
        ag = build_avatar_graph(avatar, PushAudioSource(), settings=RunSettings(
            runtime="onnx-int8", onnx_dir=folders["dynamic"], steps=1, torch_threads=1, batching=service))
    assert not ag.batched and not service.lanes()
    assert "scale each call's activations (mode dynamic), so a batch would mix its sessions" in caplog.text
