"""The portrait's DiT and VAE decoder in batches: streams at different positions, stacked, each get the block and the
state they get alone (≤ 1e-5), and decoder streams each their frames and cache; live sessions through one model
service get the frames each makes alone; a block the batch cannot start in time is refused and leaves its stream
as it was."""
import time

import numpy as np
import pytest
import torch
from helpers import sessions_frames

from framegraph import assets
from framegraph.models.avatar import RunSettings, load_avatar, random_avatar
from framegraph.models.avatar.portrait.engines import batched_engines
from framegraph.models.dit import generate_block
from framegraph.models.dit.batch import BatchedDiT, BlockStep
from framegraph.models.vae import TorchVAE
from framegraph.models.vae.batch import SHARED, DecodeStep
from framegraph.stream.batching import Missed, ModelService
from framegraph.stream.media import SAMPLE_RATE


@pytest.fixture(scope="module")
def astronaut():
    return load_avatar(assets.path("avatars", "astronaut"))


def advanced_stream(model, reference, blocks: int, seed: int):
    """A stream of ``model`` after ``blocks`` blocks of random audio: its own position and past."""
    g = torch.Generator().manual_seed(seed)
    c, (h, w) = model.config, reference.shape[-2:]
    k = c.frames_per_block
    stream = model.init_stream(reference)
    for _ in range(blocks):
        generate_block(model, stream, torch.randn(1, c.latent_channels, k, h, w, generator=g),
                       torch.randn(1, k, c.audio_dim, generator=g), torch.rand(1, k, c.state_dim, generator=g),
                       steps=2)
    return stream


@pytest.mark.parametrize("which", ["astronaut", "two frames a block"])
@torch.inference_mode()
def test_streams_at_different_positions_in_one_batch_each_get_what_they_get_alone(astronaut, which):
    if which != "astronaut":
        astronaut = random_avatar(region_size=64, chunk_frames=2, dit_config={"frames_per_block": 2})
    model, reference = astronaut.dit.eval(), astronaut.reference_latent()
    c, (h, w) = model.config, reference.shape[-2:]
    k = c.frames_per_block
    streams = [advanced_stream(model, reference, n, seed=n) for n in (0, 3, 7)]
    g = torch.Generator().manual_seed(11)
    blocks = [(torch.randn(1, c.latent_channels, k, h, w, generator=g), torch.randn(1, k, c.audio_dim, generator=g),
               torch.rand(1, k, c.state_dim, generator=g)) for _ in streams]
    rows = []
    for s, b in zip(streams, blocks):
        cos, sin = model.stream_rope(s)
        rows.append((*b, cos[None], sin[None], *s.tensors()))
    out = BlockStep(model, steps=2, shift=astronaut.shift)(*(torch.cat(parts) for parts in zip(*rows)))
    for i, (s, b) in enumerate(zip(streams, blocks)):
        x0 = generate_block(model, s, *b, steps=2, shift=astronaut.shift)  # alone: advances s
        assert float((out[0][i:i + 1] - x0).abs().max()) <= 1e-5
        new = [t for layer in s.layers for t in layer.tensors()] + [s.audio_history]
        assert len(new) == len(out) - 1
        for got, want in zip(out[1:], new):
            assert float((got[i:i + 1] - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))
    assert [s.frames for s in streams] == [k, 4 * k, 8 * k]  # three positions: the rope went per row


@torch.inference_mode()
def test_decoder_streams_in_one_batch_each_get_their_frames_and_cache(astronaut):
    vae, reference = astronaut.vae.eval(), astronaut.region()[0]
    from framegraph.models.vae import uint8_to_frames

    ref = uint8_to_frames(reference)[None]
    c, t = astronaut.dit.config.latent_channels, astronaut.chunk_frames
    h = w = astronaut.region_size // vae.spatial_compression
    g = torch.Generator().manual_seed(5)
    streams = []
    for n in (1, 2, 4):  # decoders n chunks into their streams
        engine = TorchVAE(vae, ref)
        for _ in range(n):
            engine.decode(torch.randn(1, c, t, h, w, generator=g))
        streams.append(engine)
    keys = sorted(k for k in streams[0].cache if not k.startswith(SHARED))
    shared = {k: v[:1] for k, v in streams[0].cache.items() if k.startswith(SHARED)}
    assert keys and shared  # a past of its own, and the reference's features
    chunks = [torch.randn(1, c, t, h, w, generator=g) for _ in streams]
    out = DecodeStep(vae, keys, shared)(torch.cat(chunks), *(torch.cat([s.cache[k] for s in streams]) for k in keys))
    for i, (s, z) in enumerate(zip(streams, chunks)):
        want = s.decode(z)  # alone
        assert float((out[0][i:i + 1] - want).abs().max()) <= 1e-5
        for k, got in zip(keys, out[1:]):
            assert float((got[i:i + 1] - s.cache[k]).abs().max()) <= 1e-5


@pytest.mark.slow
@torch.inference_mode()
def test_compiled_steps_run_three_streams_as_a_bucket_of_four_each_as_alone():
    """The compiled runtime's batched DiT step: three streams at different positions run as bucket 4 (a copy of the
    last row added), compiled; each real row is the eager batch's (Inductor's rounding apart). The decoder's step is
    bucketed the same way (models/buckets.py, tested on the video generator)."""
    from framegraph.models.avatar.portrait.engines import compiled_batch

    torch.manual_seed(0)
    avatar = random_avatar(region_size=64, chunk_frames=2, dit_config={"frames_per_block": 2})
    avatar.dit.final_proj.weight.normal_(0, 0.05)  # a zero head would make every row the same
    model, reference = avatar.dit.eval(), avatar.reference_latent()
    c, (h, w) = model.config, reference.shape[-2:]
    k, g = c.frames_per_block, torch.Generator().manual_seed(3)
    rows = []
    for n in (0, 3, 5):
        s = advanced_stream(model, reference, n, seed=n)
        cos, sin = model.stream_rope(s)
        rows.append((torch.randn(1, c.latent_channels, k, h, w, generator=g),
                     torch.randn(1, k, c.audio_dim, generator=g), torch.rand(1, k, c.state_dim, generator=g),
                     cos[None], sin[None], *s.tensors()))
    inputs = tuple(torch.cat(parts) for parts in zip(*rows))
    steps = compiled_batch(avatar, RunSettings(runtime="compiled"))
    dit = steps.dit(2)
    dit.buckets = [4]  # one compile here; the lane's runs 1, 2, 4, 8
    want, got = BlockStep(model, steps=2, shift=avatar.shift)(*inputs), dit(*inputs)
    assert len(got) == len(want) and all(a.shape == b.shape for a, b in zip(got, want)) and got[0].shape[0] == 3
    for a, b in zip(got, want):
        assert float((a - b).abs().max()) <= 1e-4 * max(1.0, float(b.abs().max()))
    assert sorted(dit.steps) == [4]


def test_sessions_through_one_service_get_their_own_frames(astronaut):
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    audios = [(np.sin(2 * np.pi * f * t) * a * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.int16)
              for f, a in ((150, 6000), (200, 6000), (250, 0))]  # the last one silent
    settings = RunSettings(steps=1, torch_threads=1)
    want = [sessions_frames(astronaut, [a], settings)[0] for a in audios]
    service = ModelService()
    got = sessions_frames(astronaut, audios, RunSettings(steps=1, torch_threads=1, batching=service))
    for g, w in zip(got, want):
        assert g.shape == w.shape and len(g) >= 25
        assert np.abs(g.astype(int) - w).max() <= 1  # rounding of a value ≤ 1e-5 apart
    moved = np.abs(got[0].astype(int) - got[2]).max(axis=(1, 2, 3))  # per frame, the largest change
    assert (moved > 40).sum() >= 5, "the speaking session's mouth is not the silent one's"
    lanes = {lane.name: lane for lane in service.lanes().values()}
    assert set(lanes) == {"portrait-dit-1-steps-torch", "portrait-vae-torch"}
    for lane in lanes.values():
        assert max(lane.stats.batches) >= 2 and lane.stats.failed == 0 and not lane.running


@torch.inference_mode()
def test_a_block_the_batch_cannot_start_in_time_is_refused_and_the_stream_is_unchanged(astronaut):
    service = ModelService()
    engine = batched_engines(service, astronaut, RunSettings(steps=1))[0](astronaut.dit)
    assert isinstance(engine, BatchedDiT)
    engine.start(astronaut.reference_latent())
    try:
        before = [t.clone() for t in engine.stream.tensors()]
        engine.deadline_ns = time.monotonic_ns() - 1_000_000_000  # a second ago
        with pytest.raises(Missed):
            engine.generate(*engine._zeros(), 1, astronaut.shift)
        assert engine.stream.frames == 0
        assert all(torch.equal(a, b) for a, b in zip(before, engine.stream.tensors()))
        engine.deadline_ns = None
        engine.generate(*engine._zeros(), 1, astronaut.shift)
        assert engine.stream.frames == astronaut.dit.config.frames_per_block
    finally:
        engine.close()
    (lane,) = service.lanes().values()
    assert lane.stats.missed == 1 and lane.stats.served == 1 and not lane.running
