"""The Wan 2.1 family streamed causally (``WanCausal``) against the stock model over the whole sequence.

A tiny random ``diffusers.WanTransformer3DModel`` is built here. The streamed run (chunk by chunk, a few
denoising steps each, the KV cache refreshed by a clean pass) must give, at every model call, what the
same stock model gives over ``[clean past chunks, this chunk]`` with the block-causal mask (one block per
chunk) and per-token timesteps (0 on the clean past): the stock ``WanAttnProcessor`` with that mask for
SDPA, ``MonarchAttnProcessor(block_causal=True)`` with one grid "frame" per chunk for Monarch.
"""
import copy
import resource

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from framegraph.kernels.processors import KVCache, install_monarch_processors
from framegraph.models.generate import WanCausal

TEXT_TOKENS, TEXT_DIM = 6, 16
TOL = 1e-4  # relative, fp32


def tiny_wan(**config) -> WanTransformer3DModel:
    torch.manual_seed(0)
    defaults = dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=TEXT_DIM, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=256,
    )
    return WanTransformer3DModel(**(defaults | config)).eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class MaskedWanAttn:
    """The stock ``WanAttnProcessor`` given a mask ``[N, N]`` (True: attend) that the stock blocks do not pass."""

    def __init__(self):
        self.stock = WanAttnProcessor()
        self.mask = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        return self.stock(attn, hidden_states, encoder_hidden_states, self.mask, rotary_emb)


def stream(wan: WanCausal, chunks: int, timesteps, latent_hw=(6, 8), seed=1):
    """Generate ``chunks`` chunks; returns (clean chunks, per chunk: frames held before it, its model calls).

    Each model call is recorded as ``(latents in, timestep [B], velocity out)`` by a forward hook."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randn(1, TEXT_TOKENS, TEXT_DIM, generator=g)
    calls = []
    hook = wan.model.register_forward_hook(
        lambda module, args, out: calls.append((args[0].clone(), args[1].clone(), out[0].clone()))
    )
    clean, held, per_chunk = [], [], []
    try:
        for _ in range(chunks):
            held.append(wan.caches[0].held_frames())
            noise = torch.randn(1, 4, wan.chunk_frames, *latent_hw, generator=g)
            start = len(calls)
            clean.append(wan.generate_chunk(prompt, noise, timesteps=timesteps, generator=g))
            per_chunk.append(calls[start:])
    finally:
        hook.remove()
    return prompt, clean, held, per_chunk


def reference(ref_model, prompt, past, latents, timestep, chunk_frames, held, attention):
    """The stock model over ``[past chunks, latents]``; returns the velocity of the last chunk's frames."""
    full = torch.cat(past + [latents], dim=2)  # [B, C, F, H, W]
    _, _, frames, height, width = full.shape
    tokens = (height // 2) * (width // 2)  # per latent frame (patch 1x2x2)
    frame_t = torch.zeros(frames)
    frame_t[-chunk_frames:] = float(timestep[0])
    per_token = frame_t.repeat_interleave(tokens)[None]  # [B, N]: 0 on the clean past
    if attention == "sdpa":
        allowed = torch.zeros(frames, frames, dtype=torch.bool)  # [query frame, key frame]
        for c, kept in enumerate(held[: frames // chunk_frames]):
            rows = slice(c * chunk_frames, (c + 1) * chunk_frames)
            allowed[rows, kept] = True
            allowed[rows, rows] = True
        mask = allowed.repeat_interleave(tokens, 0).repeat_interleave(tokens, 1)
        for module in ref_model.modules():
            if isinstance(getattr(module, "processor", None), MaskedWanAttn):
                module.processor.mask = mask
    else:  # one grid "frame" per chunk: block-causal Monarch with chunk-sized blocks
        install_monarch_processors(
            ref_model, grid=(frames // chunk_frames, chunk_frames * (height // 2), width // 2),
            num_iters=2, block_causal=True,
        )
    out = ref_model(full, per_token, prompt, return_dict=False)[0]
    return out[:, :, -chunk_frames:]


def masked_stock(model):
    ref = copy.deepcopy(model)
    for module in ref.modules():
        if isinstance(getattr(module, "processor", None), WanAttnProcessor) and not module.is_cross_attention:
            module.set_processor(MaskedWanAttn())
    return ref


CASES = {
    "sdpa": dict(chunks=3, cache_frames=8, sink_frames=0, attention="sdpa"),
    "sdpa-rolling-with-sinks": dict(chunks=4, cache_frames=4, sink_frames=2, attention="sdpa"),
    "monarch": dict(chunks=3, cache_frames=8, sink_frames=0, attention="monarch", num_iters=2),
}


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_streamed_equals_whole_sequence_block_causal(case):
    cfg = dict(CASES[case])
    chunks = cfg.pop("chunks")
    model = tiny_wan()
    stock = copy.deepcopy(model)
    ref = masked_stock(stock) if cfg["attention"] == "sdpa" else stock
    wan = WanCausal(model, chunk_frames=2, **cfg)
    prompt, clean, held, per_chunk = stream(wan, chunks, timesteps=[1000, 500])

    if case == "sdpa-rolling-with-sinks":  # frames 2, 3 evicted before the last chunk; the sinks 0, 1 kept
        assert held == [[], [0, 1], [0, 1, 2, 3], [0, 1, 4, 5]]
    for c, calls in enumerate(per_chunk):
        assert len(calls) == 3  # two denoising steps, then the clean pass at t = 0
        assert torch.equal(calls[-1][0], clean[c]) and float(calls[-1][1][0]) == 0.0
        for latents, timestep, streamed in calls:
            want = reference(ref, prompt, clean[:c], latents, timestep, 2, held, cfg["attention"])
            assert rel(streamed, want) <= TOL, (case, c, float(timestep[0]))

    if case == "monarch":  # it is Monarch being compared, not exact attention
        latents, timestep, streamed = per_chunk[-1][0]
        exact = reference(masked_stock(tiny_wan()), prompt, clean[:-1], latents, timestep, 2, held, "sdpa")
        assert rel(streamed, exact) > 1e-3


@torch.no_grad()
def test_without_the_rope_offset_the_stream_differs():
    model = tiny_wan()
    ref = masked_stock(model)
    wan = WanCausal(model, chunk_frames=2, cache_frames=8)
    model.rope = model.rope.rope  # the stock table: every chunk numbered from frame 0
    prompt, clean, held, per_chunk = stream(wan, 2, timesteps=[1000])
    first = [reference(ref, prompt, clean[:c], x, t, 2, held, "sdpa") for c, ((x, t, _), _) in enumerate(per_chunk)]
    assert rel(per_chunk[0][0][2], first[0]) <= TOL  # chunk 0 sits at frame 0 either way
    assert rel(per_chunk[1][0][2], first[1]) > 1e-3  # chunk 1 at frames [0, 2) instead of [2, 4)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@torch.no_grad()
def test_endless_stream_memory_is_fixed_and_sinks_are_kept():
    wan = WanCausal(tiny_wan(), chunk_frames=1, cache_frames=4, sink_frames=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randn(1, TEXT_TOKENS, TEXT_DIM, generator=g)
    start = g.get_state()

    def chunk():
        return wan.generate_chunk(prompt, torch.randn(1, 4, 1, 4, 4, generator=g), timesteps=[1000], generator=g)

    def storage():
        return [(b.data_ptr(), b.numel()) for c in wan.caches for b in (c.k, c.v)]

    first = chunk()
    sink_keys = [c.k[:, :, : c.tokens_per_frame].clone() for c in wan.caches]  # frame 0, every layer
    layout = storage()
    for _ in range(19):
        chunk()
    rss_warm = rss_bytes()
    for _ in range(180):
        out = chunk()
        assert storage() == layout  # the cache's tensors are never reallocated nor grown
    assert torch.isfinite(out).all()
    assert wan.frames_seen == 200
    assert all(c.held_frames() == [0, 197, 198, 199] and c.frames == 4 for c in wan.caches)
    for c, keys in zip(wan.caches, sink_keys):
        assert torch.equal(c.k[:, :, : c.tokens_per_frame], keys)
    assert rss_bytes() - rss_warm < 16 * 2**20, "RSS grew by more than 16 MiB over 180 chunks after warm-up"

    wan.reset()  # a new stream: frame 0 again, the same noise -> the same first chunk, in the same storage
    g.set_state(start)
    assert wan.frames_seen == 0
    assert torch.equal(chunk(), first)
    assert storage() == layout


@torch.no_grad()
def test_uninstall_gives_the_stock_model_back():
    model = tiny_wan()
    stock = copy.deepcopy(model)
    x, prompt, t = torch.randn(1, 4, 2, 4, 4), torch.randn(1, TEXT_TOKENS, TEXT_DIM), torch.tensor([500.0])
    wan = WanCausal(model, chunk_frames=2, cache_frames=4)
    wan.generate_chunk(prompt, x, timesteps=[1000])
    wan.uninstall()
    assert torch.equal(model(x, t, prompt).sample, stock(x, t, prompt).sample)
    with pytest.raises(ValueError, match="uninstalled"):
        wan.generate_chunk(prompt, x)


@torch.no_grad()
def test_a_second_stream_on_the_same_model_streams_what_the_first_did():
    """Installing again (a second graph on one loaded model) replaces the streaming rotary table, never wraps it
    in another: the stock table stays one level down."""
    from framegraph.kernels.processors.streaming_rope import StreamingRotaryPosEmbed

    model = tiny_wan()
    prompt, x = torch.randn(1, TEXT_TOKENS, TEXT_DIM), torch.randn(1, 4, 2, 4, 4)
    def stream():
        wan = WanCausal(model, chunk_frames=2, cache_frames=4)
        return wan.generate_chunk(prompt, x.clone(), timesteps=[1000, 500], renoise=False)

    first = stream()
    again = stream()
    assert isinstance(model.rope, StreamingRotaryPosEmbed)
    assert not isinstance(model.rope.rope, StreamingRotaryPosEmbed)
    assert torch.equal(again, first)


def test_bad_input_is_refused_clearly():
    model = tiny_wan()
    prompt = torch.randn(1, TEXT_TOKENS, TEXT_DIM)
    # a temporal patch joining frames of two chunks is not causal
    with pytest.raises(ValueError, match=r"chunk_frames=3 is not a multiple of the model's temporal patch size 2"):
        WanCausal(tiny_wan(patch_size=(2, 2, 2)), chunk_frames=3, cache_frames=6)
    # a cache too small for one chunk next to its sinks
    with pytest.raises(ValueError, match=r"3-frame chunk does not fit the rolling window of 2 frames"):
        WanCausal(model, chunk_frames=3, cache_frames=4, sink_frames=2)
    with pytest.raises(ValueError, match="sink_frames=2 leaves no rolling window"):
        KVCache(capacity_frames=2, sink_frames=2)
    # Monarch fits whole chunks as blocks
    with pytest.raises(ValueError, match="multiples of chunk_frames=2"):
        WanCausal(model, chunk_frames=2, cache_frames=5, attention="monarch")
    with pytest.raises(ValueError, match="attention='flash'"):
        WanCausal(model, chunk_frames=2, cache_frames=4, attention="flash")
    with pytest.raises(ValueError, match="expected a diffusers WanTransformer3DModel"):
        WanCausal(torch.nn.Linear(4, 4), chunk_frames=1, cache_frames=4)

    wan = WanCausal(model, chunk_frames=2, cache_frames=4)
    # a chunk that is not the stream's whole latent frames
    with pytest.raises(ValueError, match=r"expected a chunk \[B, C, 2, H, W\]"):
        wan.generate_chunk(prompt, torch.randn(1, 4, 3, 4, 4))
    with pytest.raises(ValueError, match=r"multiples of the patch size \(1, 2, 2\)"):
        wan.generate_chunk(prompt, torch.randn(1, 4, 2, 5, 4))
    with pytest.raises(ValueError, match="decreasing list"):
        wan.generate_chunk(prompt, torch.randn(1, 4, 2, 4, 4), timesteps=[250, 500])
    # a stream keeps one layout: another size mid-stream needs reset()
    wan.generate_chunk(prompt, torch.randn(1, 4, 2, 4, 4), timesteps=[1000])
    with pytest.raises(ValueError, match="reset"):
        wan.generate_chunk(prompt, torch.randn(1, 4, 2, 6, 4), timesteps=[1000])
    wan.reset()
    assert wan.generate_chunk(prompt, torch.randn(1, 4, 2, 6, 4), timesteps=[1000]).shape == (1, 4, 2, 6, 4)


@torch.no_grad()
def test_a_stream_past_the_rotary_table_ends_with_a_clear_error():
    """Positions are absolute in the stream: past rope_max_seq_len latent frames there are no rows left."""
    wan = WanCausal(tiny_wan(rope_max_seq_len=4), chunk_frames=2, cache_frames=2)
    prompt, noise = torch.randn(1, TEXT_TOKENS, TEXT_DIM), torch.randn(1, 4, 2, 4, 4)
    wan.generate_chunk(prompt, noise, timesteps=[1000])
    wan.generate_chunk(prompt, noise, timesteps=[1000])  # frames [2, 4): the table's last rows
    with pytest.raises(ValueError, match=r"latent frames \[4, 6\).*max_seq_len=4"):
        wan.generate_chunk(prompt, noise, timesteps=[1000])
    wan.reset()
    wan.generate_chunk(prompt, noise, timesteps=[1000])
