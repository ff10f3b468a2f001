"""Video sessions batched on one lane get the chunks each would get alone, SANA-Video's and Wan's.

Three streams of one tiny stock model start at different chunks, with their own prompts, seeds and the re-noising
sampler; they run from their own threads through one model service, so the lane stacks rows of different ages.
Each stream's chunks are compared with the same stream run alone on a copy of the model, through re-anchors (a short
rotary table) and, for Wan, a KV cache that fills and evicts while the younger rows' do not. Then whole generate
graphs: two batched sessions decode the frames each decodes alone.
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


def tiny_wan(rope_max_seq_len: int):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=C,
                                  out_channels=C, text_dim=CAPTION, freq_dim=32, ffn_dim=32, num_layers=2,
                                  rope_max_seq_len=rope_max_seq_len).eval()
    with torch.no_grad():  # the stock init zeroes the output projection: make the chunk depend on the model
        for p in model.parameters():
            if p.dim() >= 2 and float(p.abs().max()) == 0:
                p.normal_(0, 0.2)
    return model


# per family: the model, chunks per session, and the re-anchors each makes alone. SANA's 8-frame rotary table
# holds 4 chunks: the 5th re-anchors (2 chunks kept), the 7th again. Wan's 16 frames hold 8 chunks; its cache of
# 8 frames (2 sinks) fills at the 4th chunk and evicts from the 5th; the 9th re-anchors.
CASES = {"sana": (lambda: tiny_sana(rope_max_seq_len=8), {1: 7, 2: 5, 3: 3}, {1: 2, 2: 1, 3: 0}),
         "wan": (lambda: tiny_wan(rope_max_seq_len=16), {1: 9, 2: 6, 3: 3}, {1: 1, 2: 0, 3: 0})}


@pytest.mark.parametrize("family", sorted(CASES))
def test_sessions_of_different_ages_on_one_lane_get_their_chunks_alone(family):
    make, counts, expected = CASES[family]
    model = make()
    alone, reanchors = {}, {}
    for seed, chunks in counts.items():
        stream = FAMILIES[family].open(copy.deepcopy(model), latent_size=(H, W), chunk_frames=F, backend="torch")
        run(stream, seed, chunks, alone.setdefault(seed, []))
        reanchors[seed] = stream.reanchors
    assert reanchors == expected

    service = ModelService(window_ms=30)
    streams = {seed: batched_stream(service, family, model, device="cpu", latent_size=(H, W), chunk_frames=F,
                                    timesteps=TIMESTEPS, renoise=True, prompt_tokens=TOKENS, chunks_per_s=4,
                                    backend="torch") for seed in alone}
    got = {seed: [] for seed in alone}
    for s in streams.values():
        s.open()
    g1 = torch.Generator().manual_seed(1)
    run(streams[1], 1, 2, got[1], g1)  # two chunks ahead of the others
    threads = [threading.Thread(target=run, args=(streams[1], 1, counts[1] - 2, got[1], g1))] + \
        [threading.Thread(target=run, args=(streams[seed], seed, counts[seed], got[seed])) for seed in (2, 3)]
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
    a, b = (batched_stream(service, "sana", model, device="cpu", latent_size=(H, W), chunk_frames=F,
                           timesteps=TIMESTEPS, renoise=True, prompt_tokens=TOKENS, chunks_per_s=4,
                           backend="torch") for _ in range(2))
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


def test_sessions_of_one_model_on_two_schedules_run_on_two_lanes_each_as_alone():
    """A lane's processors live in its model: the second lane of one model (another schedule) runs on a copy."""
    model, schedules = tiny_sana(), {1: TIMESTEPS, 2: [1000.0, 500.0]}
    alone, got = {}, {seed: [] for seed in schedules}
    for seed, ts in schedules.items():
        stream = FAMILIES["sana"].open(copy.deepcopy(model), latent_size=(H, W), chunk_frames=F, backend="torch")
        alone[seed] = chunks_of(stream, seed, 3, ts)
    service = ModelService()
    streams = {seed: batched_stream(service, "sana", model, device="cpu", latent_size=(H, W), chunk_frames=F,
                                    timesteps=ts, renoise=True, prompt_tokens=TOKENS, chunks_per_s=4,
                                    backend="torch") for seed, ts in schedules.items()}
    def session(seed):
        streams[seed].open()
        got[seed].extend(chunks_of(streams[seed], seed, 3, schedules[seed]))

    threads = [threading.Thread(target=session, args=(seed,)) for seed in schedules]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(service.lanes()) == 2
    for seed in schedules:
        assert len(got[seed]) == 3 and all(torch.allclose(a, b, rtol=0, atol=1e-5 * float(a.abs().max()))
                                           for a, b in zip(alone[seed], got[seed])), seed
        streams[seed].close()


def chunks_of(stream, seed, n, timesteps):
    g = torch.Generator().manual_seed(seed)
    embeds, mask = prompt(seed)
    return [stream.generate(torch.randn(1, C, F, H, W, generator=g), embeds, mask, timesteps=timesteps, renoise=True,
                            generator=g) for _ in range(n)]


def test_wan_with_monarch_attention_is_refused_batching_in_a_sentence():
    with pytest.raises(ValueError, match="batching runs Wan with attention 'sdpa'; got 'monarch'"):
        batched_stream(ModelService(), "wan", tiny_wan(16), device="cpu", latent_size=(H, W), chunk_frames=F,
                       timesteps=TIMESTEPS, renoise=True, prompt_tokens=TOKENS, chunks_per_s=4, attention="monarch")


@pytest.mark.parametrize("family", ["sana", "wan"])
def test_two_batched_generate_graphs_decode_the_frames_each_decodes_alone(tmp_path, family):
    from framegraph.models.generate import build_generate_graph, load_generate_model
    from framegraph.stream import RecordingSink

    folder = str(tiny_generate_folder(tmp_path / family, family))
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
