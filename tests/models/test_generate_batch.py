"""SANA-Video sessions batched on one lane get the chunks each would get alone.

Three streams of one tiny stock SanaVideoTransformer3DModel start at different chunks, with their own prompts,
seeds and the re-noising sampler; they run from their own threads through one model service, so the lane stacks
rows of different ages. Each stream's chunks are compared with the same stream run alone on a copy of the model,
through a re-anchor (a rotary table of 8 latent frames). Then whole generate graphs: two batched sessions decode the
frames each decodes alone.
"""
import copy
import threading

import pytest
import torch
from helpers import tiny_generate_folder, tiny_prompt_embeds
from test_generate_sana_vae import tiny_sana

from framegraph.models.generate import FAMILIES
from framegraph.models.generate.batch import batched_stream
from framegraph.stream.batching import Cancelled, ModelService

C, H, W, F = 4, 4, 4, 2
TIMESTEPS = [1000.0, 750.0, 500.0]
TOKENS, CAPTION = 5, 16


def prompt(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, TOKENS, CAPTION, generator=g), (torch.arange(TOKENS) < TOKENS - seed % 3).float()[None]


def run(stream, seed, chunks, out, g=None):
    """``chunks`` chunks of session ``seed`` into ``out``; ``g`` its generator, to go on with (None: a new one)."""
    g = torch.Generator().manual_seed(seed) if g is None else g
    embeds, mask = prompt(seed)
    for _ in range(chunks):
        noise = torch.randn(1, C, F, H, W, generator=g)
        out.append(stream.generate(noise, embeds, mask, timesteps=TIMESTEPS, renoise=True, generator=g))


def test_sessions_of_different_ages_on_one_lane_get_their_chunks_alone_through_a_reanchor():
    model = tiny_sana(rope_max_seq_len=8)
    alone, reanchors = {}, {}
    for seed, chunks in ((1, 7), (2, 5), (3, 3)):
        stream = FAMILIES["sana"].open(copy.deepcopy(model), latent_size=(H, W), chunk_frames=F, backend="torch")
        run(stream, seed, chunks, alone.setdefault(seed, []))
        reanchors[seed] = stream.reanchors
    assert reanchors == {1: 2, 2: 1, 3: 0}  # 8 frames hold 4 chunks: the 5th re-anchors (2 kept), the 7th again

    service = ModelService(window_ms=30)
    streams = {seed: batched_stream(service, model, device="cpu", latent_size=(H, W), chunk_frames=F,
                                    timesteps=TIMESTEPS, renoise=True, prompt_tokens=TOKENS, chunks_per_s=4,
                                    backend="torch") for seed in alone}
    got = {seed: [] for seed in alone}
    for s in streams.values():
        s.open()
    g1 = torch.Generator().manual_seed(1)
    run(streams[1], 1, 2, got[1], g1)  # two chunks ahead of the others
    threads = [threading.Thread(target=run, args=(streams[1], 1, 5, got[1], g1))] + \
        [threading.Thread(target=run, args=(streams[seed], seed, n, got[seed])) for seed, n in ((2, 5), (3, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in streams.values():
        s.close()
    for seed in alone:
        assert len(got[seed]) == len(alone[seed]), seed
        for i, (a, b) in enumerate(zip(alone[seed], got[seed])):
            err = float((a - b).abs().max() / a.abs().max())
            assert err < 1e-5, (seed, i, err)
    assert {seed: s.reanchors for seed, s in streams.items()} == reanchors
    lane = next(iter(service.lanes().values()))
    assert max(lane.stats.batches) >= 2, lane.stats.batches  # rows of different sessions did share a batch
    assert streams[1].state_nbytes() == streams[3].state_nbytes()  # one size, whatever the age


def test_a_cancelled_session_returns_and_the_others_go_on():
    model = tiny_sana()
    service = ModelService()
    a, b = (batched_stream(service, model, device="cpu", latent_size=(H, W), chunk_frames=F, timesteps=TIMESTEPS,
                           renoise=True, prompt_tokens=TOKENS, chunks_per_s=4, backend="torch") for _ in range(2))
    a.open()
    b.open()
    a.cancel()
    with pytest.raises(Cancelled):
        run(a, 1, 1, [])
    out = []
    run(b, 2, 2, out)
    assert len(out) == 2 and all(torch.isfinite(x).all() for x in out)
    a.close()
    b.close()


def test_a_wan_model_is_refused_batching_in_a_sentence(tmp_path):
    from framegraph.models.generate import build_generate_graph, load_generate_model

    gm = load_generate_model(str(tiny_generate_folder(tmp_path / "wan", "wan")))
    with pytest.raises(ValueError, match="batching runs SANA-Video streams .* is 'wan'"):
        build_generate_graph(gm, size=(32, 32), chunks=1, prompt_embeds=str(tiny_prompt_embeds(tmp_path / "p.st")),
                             chunk_frames=2, batching=ModelService())


def test_two_batched_generate_graphs_decode_the_frames_each_decodes_alone(tmp_path):
    from framegraph.models.generate import build_generate_graph, load_generate_model
    from framegraph.stream import RecordingSink

    folder = str(tiny_generate_folder(tmp_path / "sana", "sana"))
    embeds = [str(tiny_prompt_embeds(tmp_path / f"p{i}.safetensors", seed=i)) for i in range(2)]

    def frames(gm, i, batching=None):
        gg = build_generate_graph(gm, size=(32, 32), chunks=3, prompt_embeds=embeds[i], chunk_frames=2, seed=i,
                                  timesteps=TIMESTEPS, batching=batching, backend="torch")
        sink = gg.graph.add(RecordingSink({"video": gg.decode.outputs["video"]}))
        gg.graph.connect(gg.decode, sink, "video", capacity=8)
        gg.graph.run(timeout=120)
        return torch.stack([r.data for r in sink.records])

    alone = [frames(load_generate_model(folder), i) for i in range(2)]
    gm, service = load_generate_model(folder), ModelService(window_ms=30)
    got = [None, None]
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, frames(gm, i, service))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for a, b in zip(alone, got):
        assert a.shape == b.shape and a.shape[0] == 21  # 1 + 4 (F - 1) = 5 frames, then 4 F = 8 per chunk
        assert (a.int() - b.int()).abs().max() <= 1, "a batched session's pictures differ from its own alone"
        assert a.float().std() > 1  # a picture, not a flat field
    assert max(next(iter(service.lanes().values())).stats.batches) >= 2
