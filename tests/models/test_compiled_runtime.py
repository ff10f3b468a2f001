"""The ``"compiled"`` runtime: every model it compiles computes what its torch engine computes (Inductor on the
CPU, float32, ≤ 1e-4 relative), chunk after chunk with its stream state; its caches live where
``FRAMEGRAPH_CACHE`` says; off CUDA a graphed step is the step itself. (On CUDA the same steps replay from CUDA
graphs: ``tests/models/test_compiled_cuda.py``.)"""
import copy
import os

import pytest
import torch
from helpers import dit_block_inputs, random_portrait_avatar, rel, started_dit_engines

from framegraph.models import runtime
from framegraph.models.compile import CACHE_ENV, CompileSettings, cache_dir, use_cache_dir
from framegraph.models.graphs import GraphedStep

pytestmark = pytest.mark.usefixtures("compile_cache")


def test_every_compiled_model_is_registered():
    import framegraph.models.avatar  # noqa: F401  (registers the avatar kinds' runtimes)
    import framegraph.models.generate  # noqa: F401

    for model in ("avatar-portrait", "avatar-video", "generate-denoiser", "generate-vae"):
        assert "compiled" in runtime.runtimes(model), model


def test_caches_follow_framegraph_cache_and_a_users_own_directory_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "fg"))
    assert cache_dir() == tmp_path / "fg"
    dirs = use_cache_dir()
    assert dirs == {"inductor": str(tmp_path / "fg" / "inductor"), "triton": str(tmp_path / "fg" / "triton")}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert use_cache_dir()["triton"] == str(tmp_path / "mine")
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "framegraph"
    use_cache_dir(os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(tmp_path)))  # leave the session's cache in use


def test_a_graphed_step_off_cuda_is_the_step_itself():
    calls = []

    def step(x):
        calls.append(1)
        return x * 2

    g = GraphedStep(step, enabled=True)
    x = torch.ones(3)
    assert torch.equal(g(x), x * 2) and not g.captured and len(calls) == 1
    assert not CompileSettings().graphs("cpu") and CompileSettings().graphs("cuda")
    assert not CompileSettings(cuda_graphs=False).graphs("cuda")


# ---- the portrait avatar ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def portrait():
    return random_portrait_avatar(torch.Generator().manual_seed(3))


def test_compiled_dit_block_step_equals_torch_block_after_block(portrait):
    from framegraph.models.avatar.portrait.compiled import streamed_tensors

    model, ref = portrait.dit, portrait.reference_latent()
    c, g = model.config, torch.Generator().manual_seed(0)
    with torch.inference_mode():
        eager, fast = started_dit_engines(model, ref)
        for block in range(4):
            noise, audio, labels = dit_block_inputs(c, ref, g)
            want = eager.generate(noise, audio, labels, 2, 1.0)
            got = fast.generate(noise, audio, labels, 2, 1.0)
            assert rel(got, want) <= 1e-4, block
        assert fast.stream.frames == eager.stream.frames == 4 * c.frames_per_block
        for a, b in zip(streamed_tensors(fast.stream), streamed_tensors(eager.stream)):
            assert rel(a, b) <= 1e-4
        fast.reset()
        eager.reset()
        assert rel(fast.generate(noise, audio, labels, 2, 1.0), eager.generate(noise, audio, labels, 2, 1.0)) <= 1e-4


def test_compiled_vae_decoder_equals_torch_chunk_after_chunk(portrait):
    from framegraph.models.avatar.portrait.compiled import CompiledVAE
    from framegraph.models.vae import TorchVAE, uint8_to_frames

    vae = portrait.vae
    reference = uint8_to_frames(portrait.region()[0])[None]
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        eager, fast = TorchVAE(vae, reference), CompiledVAE(vae, reference)
        for chunk in range(4):
            z = torch.randn(1, *vae.latent_shape(1, 64, 64), generator=g)
            assert rel(fast.decode(z), eager.decode(z)) <= 1e-4, chunk
        assert fast.step is not None


def test_compiled_portrait_graph_renders_what_torch_renders(portrait):
    """The whole avatar graph on runtime "compiled" (its audio side on torch) against runtime "torch"."""
    from framegraph.apps.bench.launches import _audio_source
    from framegraph.models.avatar import RunSettings, build_avatar_graph
    from framegraph.stream.record import RecordingSink

    frames = {}
    for name in ("torch", "compiled"):
        settings = RunSettings(runtime=name, torch_threads=1, steps=2)  # the step count the block-step test compiled
        ag = build_avatar_graph(portrait, _audio_source(0.6), audio_sink=None, settings=settings)
        sink = ag.graph.add(RecordingSink({"video": ag.video.outputs["video"]}))
        ag.graph.connect(ag.video, sink, "video", "video")
        ag.graph.run()
        frames[name] = torch.stack(sink.data()).float()
    assert frames["torch"].shape[0] >= 12
    assert (frames["compiled"] - frames["torch"]).abs().max() <= 1.0  # uint8 pictures: at most a rounding apart


# ---- the video avatar ---------------------------------------------------------------------------------------------
def test_compiled_video_avatar_picture_and_shape_equal_torch():
    from framegraph.models.avatar.video.bundle import random_video_avatar
    from framegraph.models.avatar.video.jaw import kept_share
    from framegraph.models.avatar.video.stages import MouthRegion, MouthShape

    avatar = random_video_avatar(n_frames=4, region_size=64)
    engines = runtime.engines("avatar-video", "compiled", avatar, type("S", (), {"cuda_graphs": None,
                                                                                  "device": "cpu"})())
    kw = dict(frame_size=(avatar.height, avatar.width), box_side=avatar.box_side, kept_share=True)
    eager = MouthRegion(avatar.generator, avatar.mask, avatar.paste, avatar.reference, **kw)
    fast = MouthRegion(avatar.generator, avatar.mask, avatar.paste, avatar.reference, engine=engines.picture, **kw)
    g = torch.Generator().manual_seed(2)
    for box, jaw in zip(avatar.boxes[:3], avatar.jaws):
        frame = torch.randint(0, 256, (avatar.height, avatar.width, 3), dtype=torch.uint8, generator=g)
        b, shape = torch.tensor([int(round(float(v))) for v in box], dtype=torch.int32), torch.randn(3, generator=g)
        kept = kept_share(jaw, b.tolist())  # below the jaw line the frame is kept
        want = eager.picture_at(frame, b, shape, kept).float()
        got = fast._direct(frame, b, shape, kept, out=torch.empty_like(frame)).float()
        assert (got - want).abs().max() <= 1.0  # uint8: a rounding apart at most
    shape_eager = MouthShape(avatar.shape_head, avatar.rest_shape)
    shape_fast = MouthShape(avatar.shape_head, avatar.rest_shape, engine=engines.head)
    for t in range(5):
        feats = torch.randn(avatar.shape_head.config.feature_dim, generator=g)
        assert rel(shape_fast.step(feats, t % 2 == 0), shape_eager.step(feats, t % 2 == 0)) <= 1e-4


# ---- generate -----------------------------------------------------------------------------------------------------
def _streams(family: str, **open_kw):
    from framegraph.apps.bench.generate import build_model
    from framegraph.models.generate.compiled import compile_stream

    gm = build_model(family, "tiny", "cpu", torch.float32)
    twin = copy.deepcopy(gm.transformer)
    eager = gm.family.open(gm.transformer, latent_size=(8, 12), **open_kw)
    fast = compile_stream(gm.family.open(twin, latent_size=(8, 12), **open_kw))
    return gm, eager, fast


@pytest.mark.parametrize("family, open_kw, chunks", [
    ("wan", {"chunk_frames": 1, "cache_frames": 3, "sink_frames": 1}, 5),  # the window fills, then evicts
    ("sana", {"chunk_frames": 2}, 3),
])
def test_compiled_transformer_streams_what_torch_streams(family, open_kw, chunks):
    gm, eager, fast = _streams(family, **open_kw)
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, 6, gm.family.text_dim(gm.transformer), generator=g)
    mask = torch.ones(1, 6)
    with torch.no_grad():
        for chunk in range(chunks):
            noise = torch.randn(1, gm.transformer.config.in_channels, open_kw["chunk_frames"], 8, 12, generator=g)
            kw = dict(timesteps=[1000, 750, 500], renoise=True)
            want = eager.generate(noise, embeds, mask, generator=torch.Generator().manual_seed(chunk), **kw)
            got = fast.generate(noise, embeds, mask, generator=torch.Generator().manual_seed(chunk), **kw)
            assert rel(got, want) <= 1e-4, chunk
    assert fast.frames_seen == eager.frames_seen == chunks * open_kw["chunk_frames"]


def test_compiled_wan_vae_decoder_equals_torch():
    from diffusers import AutoencoderKLWan

    from framegraph.models.generate.compiled import CompiledWanVAE
    from framegraph.models.generate.stages import TorchWanVAE

    torch.manual_seed(0)  # a two-level decoder: the temporal upsampling and its cache, fewer ops to compile
    vae = AutoencoderKLWan(base_dim=4, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[True]).eval()
    eager, fast = TorchWanVAE(vae), CompiledWanVAE(vae)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for chunk in range(3):  # the first frame, the second and the steady ones decode through different graphs
            z = torch.randn(1, 4, 2, 8, 12, generator=g)
            assert rel(fast.decode(z), eager.decode(z)) <= 1e-4, chunk
