"""BlockLinearAttnProcessor inside a tiny random SanaVideoTransformer3DModel (no downloads)."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers import SanaVideoTransformer3DModel
from helpers import DEVICE

from framegraph.kernels.processors import (
    BlockLinearAttnProcessor,
    StreamingRotaryPosEmbed,
    install_block_linear_processors,
    reset_block_linear_state,
    set_update_state,
)

FRAMES, HEIGHT, WIDTH = 3, 8, 8  # latent; patch (1, 2, 2) -> 16 tokens per frame, 48 tokens
TOKENS_PER_FRAME = (HEIGHT // 2) * (WIDTH // 2)


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(**config):
    torch.manual_seed(0)
    return SanaVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32,
        caption_channels=16, sample_size=8, patch_size=(1, 2, 2), **config,
    ).to(DEVICE).eval()


def model_inputs():
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, FRAMES, HEIGHT, WIDTH, generator=g).to(DEVICE)
    text = torch.randn(1, 5, 16, generator=g).to(DEVICE)
    return latents, text, torch.tensor([500], device=DEVICE)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@torch.no_grad()
def test_one_block_reproduces_stock_model_output(backend):
    model = tiny_model()
    latents, text, timestep = model_inputs()
    expected = model(latents, text, timestep).sample
    processors = install_block_linear_processors(model, backend=backend)
    assert len(processors) == 2 and all(isinstance(p, BlockLinearAttnProcessor) for p in processors.values())
    torch.testing.assert_close(model(latents, text, timestep).sample, expected, rtol=1e-5, atol=1e-5)


def self_attention_inputs(model):
    """The first block's attention module, hidden states [1, N, C] and the absolute rotary tables."""
    latents, _, _ = model_inputs()
    cos, sin = model.rope(latents)  # [1, N, 1, D] each
    hidden = torch.randn(1, cos.shape[1], 32, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    return model.transformer_blocks[0].attn1, hidden, (cos.float(), sin.float())


@torch.no_grad()
def test_stateful_streaming_frame_by_frame_equals_block_causal_full_sequence():
    model = tiny_model()
    attn, hidden, (cos, sin) = self_attention_inputs(model)
    attn.set_processor(BlockLinearAttnProcessor(block_size=TOKENS_PER_FRAME))
    full = attn(hidden, rotary_emb=(cos, sin))

    processor = BlockLinearAttnProcessor(block_size=TOKENS_PER_FRAME, stateful=True)
    attn.set_processor(processor)
    outs = []
    for frame in range(FRAMES):
        tokens = slice(frame * TOKENS_PER_FRAME, (frame + 1) * TOKENS_PER_FRAME)
        processor.update_state = False  # e.g. a denoising step: read the past, do not advance
        peek = attn(hidden[:, tokens], rotary_emb=(cos[:, tokens], sin[:, tokens]))
        processor.update_state = True
        outs.append(attn(hidden[:, tokens], rotary_emb=(cos[:, tokens], sin[:, tokens])))
        torch.testing.assert_close(peek, outs[-1])
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-5, atol=1e-6)

    processor.reset()
    first = attn(hidden[:, :TOKENS_PER_FRAME], rotary_emb=(cos[:, :TOKENS_PER_FRAME], sin[:, :TOKENS_PER_FRAME]))
    torch.testing.assert_close(first, outs[0])


@torch.no_grad()
def test_block_causal_model_first_frame_ignores_later_frames():
    model = tiny_model()
    attn, hidden, rope = self_attention_inputs(model)
    attn.set_processor(BlockLinearAttnProcessor(block_size=TOKENS_PER_FRAME))
    out = attn(hidden, rotary_emb=rope)
    changed = hidden.clone()
    changed[:, -1] += 1.0
    out2 = attn(changed, rotary_emb=rope)
    torch.testing.assert_close(out2[:, : 2 * TOKENS_PER_FRAME], out[:, : 2 * TOKENS_PER_FRAME])


@torch.no_grad()
def test_install_helpers_keep_one_state_per_layer():
    model = tiny_model()
    processors = install_block_linear_processors(model, block_size=TOKENS_PER_FRAME, stateful=True)
    latents, text, timestep = model_inputs()
    model(latents, text, timestep)
    states = [p.state for p in processors.values()]
    assert all(s is not None for s in states) and states[0].kv.data_ptr() != states[1].kv.data_ptr()
    set_update_state(processors, False)
    assert not any(p.update_state for p in processors.values())
    reset_block_linear_state(processors)
    assert all(p.state is None for p in processors.values())


def test_bad_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size=0"):
        BlockLinearAttnProcessor(block_size=0)
    model = tiny_model()
    attn, hidden, rope = self_attention_inputs(model)
    attn.set_processor(BlockLinearAttnProcessor(block_size=20))
    with pytest.raises(ValueError, match="does not divide the sequence length N=48"):
        attn(hidden, rotary_emb=rope)


@torch.no_grad()
def test_streaming_rope_gives_the_stock_rows_for_later_frames():
    model = tiny_model()
    latents, _, _ = model_inputs()
    cos, sin = model.rope(latents)
    streaming = StreamingRotaryPosEmbed(model.rope)
    for offset in range(FRAMES):
        tokens = slice(offset * TOKENS_PER_FRAME, None)
        cos_at, sin_at = streaming(latents[:, :, offset:], frame_offset=offset)
        assert cos_at.dtype == cos.dtype and cos_at.shape == cos[:, tokens].shape
        assert torch.equal(cos_at, cos[:, tokens]) and torch.equal(sin_at, sin[:, tokens])


@torch.no_grad()
def test_pinned_rope_buffers_outlive_an_unpin_for_the_graphs_that_read_them():
    """A CUDA graph captured around the model reads the pinned buffers. Every pin refills the same pair: once an
    unpin dropped them, and the next pin allocated a new pair while the graph still read the freed one (the
    compiled Wan and SANA steps on an H200 were 0.0085 / 0.028 off eager)."""
    class Position:
        tokens_seen = 0

    model = tiny_model()
    latents, _, _ = model_inputs()
    chunk = latents[:, :, :1]
    position = Position()
    streaming = StreamingRotaryPosEmbed(model.rope, [position])
    first = streaming.pin(chunk)
    pointers = (first[0].data_ptr(), first[1].data_ptr())
    streaming.unpin()
    position.tokens_seen = 2 * TOKENS_PER_FRAME  # the stream moved on by two frames
    again = streaming.pin(chunk)
    assert (again[0].data_ptr(), again[1].data_ptr()) == pointers
    want = streaming.rope(latents)
    rows = slice(2 * TOKENS_PER_FRAME, 3 * TOKENS_PER_FRAME)
    assert torch.equal(again[0], want[0][:, rows]) and torch.equal(again[1], want[1][:, rows])
    assert streaming(latents) is again  # pinned: forward returns the buffers as they are
    streaming.unpin()
    assert streaming(latents)[0].shape == want[0].shape


def stream(model, processors, chunks):
    """Streams model_inputs() by chunks of latent frames ``(start, stop)``: per chunk a read-only pass,
    then the appending pass (same input, so equal outputs prove the read-only pass moved nothing).
    Returns the appended outputs."""
    latents, text, timestep = model_inputs()
    outs = []
    for start, stop in chunks:
        set_update_state(processors, False)  # e.g. a denoising step: reads the past
        peek = model(latents[:, :, start:stop], text, timestep).sample
        set_update_state(processors, True)  # the append: state and stream position advance
        outs.append(model(latents[:, :, start:stop], text, timestep).sample)
        torch.testing.assert_close(peek, outs[-1], rtol=0, atol=0)
    return outs


@torch.no_grad()
def test_streamed_model_equals_block_causal_model_chunk_for_chunk():
    """stream_rope=True: streaming the model by chunks of whole frames == one block-causal call.

    The stock feed-forward (GLUMBTempConv) mixes each frame with its neighbours on both sides through
    ``conv_temp`` (a centred 3-tap convolution over frames), which no causal stream can reproduce; it is
    zeroed here. Every other part of the model is then per frame (patch embedding, timestep and caption
    conditioning, cross-attention, output norm and projection) or the block-causal attention, so whole
    model outputs are compared. Without the rotary offset every chunk after the first is wrong.
    """
    model = tiny_model()
    for block in model.transformer_blocks:
        block.ff.conv_temp.weight.zero_()
    latents, text, timestep = model_inputs()
    install_block_linear_processors(model, block_size=TOKENS_PER_FRAME)
    full = model(latents, text, timestep).sample
    chunks = [(0, 1), (1, 3)]

    processors = install_block_linear_processors(model, block_size=TOKENS_PER_FRAME, stateful=True, stream_rope=True)
    assert isinstance(model.rope, StreamingRotaryPosEmbed)
    outs = stream(model, processors, chunks)
    for (start, stop), out in zip(chunks, outs):
        torch.testing.assert_close(out, full[:, :, start:stop], rtol=1e-5, atol=1e-5)
    reset_block_linear_state(processors)  # a new stream starts at frame 0 again
    torch.testing.assert_close(stream(model, processors, chunks[:1])[0], outs[0], rtol=0, atol=0)

    processors = install_block_linear_processors(model, block_size=TOKENS_PER_FRAME, stateful=True)
    assert type(model.rope).__name__ == "WanRotaryPosEmbed"  # the stock table again: every call from frame 0
    first, second = stream(model, processors, chunks)
    torch.testing.assert_close(first, full[:, :, :1], rtol=1e-5, atol=1e-5)
    assert (second - full[:, :, 1:]).abs().max() > 1e-3  # 100x the tolerance met with the offset


@torch.no_grad()
def test_streaming_past_the_rotary_table_is_refused():
    with pytest.raises(ValueError, match="stream_rope=True needs stateful=True"):
        install_block_linear_processors(tiny_model(), stream_rope=True)
    model = tiny_model(rope_max_seq_len=4)
    install_block_linear_processors(model, block_size=TOKENS_PER_FRAME, stateful=True, stream_rope=True)
    latents, text, timestep = model_inputs()
    model(latents, text, timestep)  # appends frames [0, 3)
    with pytest.raises(ValueError, match=r"frames \[3, 5\) .* max_seq_len=4"):
        model(latents[:, :, :2], text, timestep)
