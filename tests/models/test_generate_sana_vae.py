"""SANA-Video streamed block by block, and AutoencoderKLWan decoded chunk by chunk, over tiny random
configs of the stock diffusers classes (no downloads): streaming == the whole sequence at once."""
import copy

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers import AutoencoderKLWan, SanaVideoTransformer3DModel

from framegraph.kernels.processors import install_block_linear_processors
from framegraph.models.generate import (
    SanaVideoStream,
    WanDecodeState,
    decode_chunk,
    install_block_causal_convs,
    sigmas_from_timesteps,
)

C, H, W = 4, 4, 4          # latent channels and frame size; patch (1, 2, 2) -> 4 tokens per frame
BLOCK = 2                  # latent frames per causal block (= per chunk here)
TIMESTEPS = [1000, 500]    # two denoising steps per chunk
TEXT_LEN, CAPTION = 5, 16


def tiny_sana(**config):
    torch.manual_seed(0)
    config = dict(
        in_channels=C, out_channels=C, num_attention_heads=2, attention_head_dim=12, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24,
        caption_channels=CAPTION, sample_size=H, patch_size=(1, 2, 2),
    ) | config
    model = SanaVideoTransformer3DModel(**config).eval()
    with torch.no_grad():  # the stock init leaves some projections at zero; make every path matter
        for block in model.transformer_blocks:
            block.ff.conv_temp.weight.normal_(0, 0.3)
        model.proj_out.weight.normal_(0, 0.1)
    return model


def tiny_wan_vae():
    torch.manual_seed(0)
    return AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
    ).eval()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


class Recorder:
    """Records each call of the stock model (hidden_states, timestep, output) through a forward hook."""

    def __init__(self, model):
        self.calls = []
        model.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output):
        self.calls.append((args[0].clone(), args[2].clone(), output.sample.clone()))


def block_causal_reference(model):
    """The same model and weights run over a whole sequence at once, block-causally, without a stream."""
    reference = copy.deepcopy(model)
    install_block_linear_processors(reference, block_size=BLOCK * (H // 2) * (W // 2))
    install_block_causal_convs(reference, BLOCK, stateful=False)
    return reference


@torch.no_grad()
def stream_and_compare(clear_conv_cache: bool = False, chunks: int = 3) -> float:
    """Streams ``chunks`` chunks through SanaVideoStream.generate_chunk and checks every model call against
    the block-causal model over [the clean chunks so far, the chunk being denoised], with per-token
    timesteps (0 for the clean past, the step's timestep for the chunk). Returns the largest relative error
    of the velocities and of the generated chunks against a sampler run on the reference model."""
    model = tiny_sana()
    stream = SanaVideoStream(model, latent_size=(H, W), frames_per_block=BLOCK, backend="torch")
    reference = block_causal_reference(model)
    recorder = Recorder(model)
    g = torch.Generator().manual_seed(1)
    sigmas = sigmas_from_timesteps(TIMESTEPS)
    # One prompt: a streamed past keeps the prompt it was appended with, a single call has one prompt.
    text = torch.randn(1, TEXT_LEN, CAPTION, generator=g)
    past, worst = [], 0.0
    for c in range(chunks):
        noise = torch.randn(1, C, BLOCK, H, W, generator=g)
        recorder.calls.clear()
        if clear_conv_cache:
            for conv in stream.convs.values():
                conv.reset()
        clean = stream.generate_chunk(noise, text, TIMESTEPS)
        assert len(recorder.calls) == len(TIMESTEPS) + 1  # the steps, then the append pass
        assert [t.item() for _, t, _ in recorder.calls] == TIMESTEPS + [0]

        def full_velocity(x, t):
            sequence = torch.cat(past + [x], dim=2)
            tokens = torch.full((1, sequence.shape[2], (H // 2) * (W // 2)), 0.0)
            tokens[:, -BLOCK:] = t
            return reference(sequence, text, tokens.flatten(1)).sample[:, :, -BLOCK:]

        for x, t, v in recorder.calls[:-1]:  # per step, on the stream's own input
            worst = max(worst, relative_error(v, full_velocity(x, t.item())))
        x = noise  # the sampler on the reference model, independently
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + (s_next - s) * full_velocity(x, 1000 * s.item())
        worst = max(worst, relative_error(clean, x))
        assert torch.equal(recorder.calls[-1][0], clean)  # the append pass saw the clean chunk
        past.append(clean)
    assert stream.frames_seen == chunks * BLOCK
    return worst


def test_streamed_sana_video_equals_block_causal_model_per_chunk_and_step():
    assert stream_and_compare() <= 1e-4


def test_streaming_without_the_conv_cache_breaks_parity():
    """The feed-forward's temporal cache is what carries the previous chunk's last frame; forgetting it
    between chunks (attention state kept) changes every chunk after the first far beyond the tolerance."""
    assert stream_and_compare(clear_conv_cache=True) > 1e-3  # 10x the tolerance (it is ~2e-2)


@torch.no_grad()
def test_block_causal_conv_keeps_stock_taps_inside_a_block():
    """Inside a block the conv is the stock centred conv; its last frame reads zeros instead of the next
    block, and no output depends on a later block."""
    model = tiny_sana()
    stock = model.transformer_blocks[0].ff.conv_temp
    x = torch.randn(1, 24, 6, 4)  # [B, C, F, N]
    convs = install_block_causal_convs(model, 3, stateful=False)
    conv = convs["transformer_blocks.0.ff.conv_temp"]
    assert conv.conv is stock
    out = conv(x)
    torch.testing.assert_close(out[:, :, :3], stock(x[:, :, :3]), rtol=0, atol=1e-6)  # first block: zero past
    changed = x.clone()
    changed[:, :, 3:] += 1.0
    torch.testing.assert_close(conv(changed)[:, :, :3], out[:, :, :3], rtol=0, atol=0)  # blind to the future
    assert not torch.allclose(stock(changed)[:, :, :3], stock(x)[:, :, :3])  # ... which the stock conv is not


@torch.no_grad()
def test_read_only_passes_leave_the_state_and_reset_restarts_the_stream():
    model = tiny_sana()
    stream = SanaVideoStream(model, latent_size=(H, W), frames_per_block=BLOCK, backend="torch")
    g = torch.Generator().manual_seed(2)
    noise, text = torch.randn(1, C, BLOCK, H, W, generator=g), torch.randn(1, TEXT_LEN, CAPTION, generator=g)
    first = stream.generate_chunk(noise, text, TIMESTEPS)
    state = [t.clone() for t in stream.state_tensors()]
    v = stream.velocity(noise, 1.0, text)
    assert all(torch.equal(a, b) for a, b in zip(state, stream.state_tensors())) and stream.frames_seen == BLOCK
    torch.testing.assert_close(stream.velocity(noise, 1.0, text), v, rtol=0, atol=0)
    stream.generate_chunk(noise, text, TIMESTEPS)
    stream.reset()
    assert stream.state_tensors() == [] and stream.frames_seen == 0
    torch.testing.assert_close(stream.generate_chunk(noise, text, TIMESTEPS), first, rtol=0, atol=0)


@torch.no_grad()
def test_streamed_vae_decode_equals_one_shot_decode():
    vae = tiny_wan_vae()
    g = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 16, 6, 4, 4, generator=g)
    full = vae.decode(latents).sample  # [1, 3, 1 + 4 * 5, 32, 32]
    state, pieces = None, []
    for start, stop in [(0, 1), (1, 3), (3, 4), (4, 6)]:
        video, state = decode_chunk(vae, latents[:, :, start:stop], state)
        pieces.append(video)
    assert [p.shape[2] for p in pieces] == [1, 8, 4, 8] and state.frames == 6
    streamed = torch.cat(pieces, dim=2)
    assert streamed.shape == full.shape == (1, 3, 21, 32, 32)
    assert relative_error(streamed, full) <= 1e-4

    again, _ = decode_chunk(vae, latents[:, :, 4:6], WanDecodeState(list(state.feat_cache), 4, state.latent_shape))
    assert relative_error(again, pieces[-1]) > 1e-3  # the wrong past decodes differently: the cache is used
    state.reset()
    restarted, _ = decode_chunk(vae, latents[:, :, :3], state)
    torch.testing.assert_close(restarted, torch.cat(pieces[:2], dim=2), rtol=0, atol=0)


@torch.no_grad()
def test_streamed_vae_decode_equals_one_shot_decode_wan22_layout():
    """The Wan 2.2 layout: residual up blocks (their shortcut trims the stream's first chunk) and 2x2
    pixel patches."""
    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=4, z_dim=8, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        is_residual=True, in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
        latents_mean=[0.0] * 8, latents_std=[1.0] * 8,
    ).eval()
    latents = torch.randn(1, 8, 4, 2, 2, generator=torch.Generator().manual_seed(6))
    full = vae.decode(latents).sample  # [1, 3, 1 + 4 * 3, 32, 32]
    state, pieces = None, []
    for start, stop in [(0, 1), (1, 3), (3, 4)]:
        video, state = decode_chunk(vae, latents[:, :, start:stop], state)
        pieces.append(video)
    streamed = torch.cat(pieces, dim=2)
    assert streamed.shape == full.shape == (1, 3, 13, 32, 32)
    assert relative_error(streamed, full) <= 1e-4


@torch.no_grad()
def test_endless_stream_keeps_its_state_size_constant():
    """200 chunks through the model and the VAE: the state's tensors keep their count and size."""
    model = tiny_sana(rope_max_seq_len=256)
    stream = SanaVideoStream(model, latent_size=(H, W), frames_per_block=1, backend="torch")
    vae = tiny_wan_vae()
    vae_proj = torch.randn(16, C, generator=torch.Generator().manual_seed(4)) / C  # model latents -> VAE's 16 channels
    g = torch.Generator().manual_seed(5)
    text = torch.randn(1, TEXT_LEN, CAPTION, generator=g)
    decoder_state, sizes = None, set()
    for c in range(200):
        clean = stream.generate_chunk(torch.randn(1, C, 1, H, W, generator=g), text, [1000])
        video, decoder_state = decode_chunk(vae, torch.einsum("zc,bcfhw->bzfhw", vae_proj, clean), decoder_state)
        assert torch.isfinite(video).all() and video.shape[2] == (1 if c == 0 else 4)
        if c >= 2:  # after warm-up (the VAE's caches fill over the first two latent frames)
            sizes.add((tuple(t.numel() for t in stream.state_tensors()), stream.state_nbytes(),
                       tuple(t.numel() for t in decoder_state.tensors()), decoder_state.nbytes()))
    assert len(sizes) == 1 and stream.frames_seen == 200
    with pytest.raises(ValueError, match=r"frames \[256, 257\) .* max_seq_len=256"):
        for _ in range(57):
            stream.generate_chunk(torch.randn(1, C, 1, H, W, generator=g), text, [1000])


@torch.no_grad()
def test_bad_input_is_refused_clearly():
    model = tiny_sana()
    stream = SanaVideoStream(model, latent_size=(H, W), frames_per_block=BLOCK, backend="torch")
    text = torch.randn(1, TEXT_LEN, CAPTION)
    with pytest.raises(ValueError, match=r"3 latent frames is not a whole number of 2-frame blocks"):
        stream.generate_chunk(torch.randn(1, C, 3, H, W), text)
    with pytest.raises(ValueError, match=r"latents have shape \(1, 3, 2, 4, 4\); expected \[B, C=4, F, H=4, W=4\]"):
        stream.generate_chunk(torch.randn(1, 3, BLOCK, H, W), text)
    with pytest.raises(ValueError, match=r"expected \[B, C=4, F, H=4, W=4\]"):
        stream.generate_chunk(torch.randn(1, C, BLOCK, H, 2 * W), text)
    with pytest.raises(ValueError, match=r"prompt_embeds have shape \(1, 5, 8\); "
                                         r"expected \[B=1, L, caption_channels=16\]"):
        stream.generate_chunk(torch.randn(1, C, BLOCK, H, W), torch.randn(1, TEXT_LEN, 8))
    for bad in ([], [500, 1000], [1000, 0], [1500], 1000):
        with pytest.raises(ValueError, match="timesteps="):
            stream.generate_chunk(torch.randn(1, C, BLOCK, H, W), text, bad)
    assert stream.frames_seen == 0 and stream.state_tensors() == []  # nothing was appended
    stream.generate_chunk(torch.randn(1, C, BLOCK, H, W), text, [1000])
    with pytest.raises(ValueError, match=r"batch size 2 differs from the streamed state's 1; call reset\(\)"):
        stream.generate_chunk(torch.randn(2, C, BLOCK, H, W), text.expand(2, -1, -1))
    with pytest.raises(ValueError, match=r"latent_size=\(5, 4\); expected positive multiples of the patch size"):
        SanaVideoStream(model, latent_size=(5, 4), frames_per_block=1)
    with pytest.raises(ValueError, match=r"frames_per_block=0; expected an int >= 1"):
        SanaVideoStream(model, latent_size=(H, W), frames_per_block=0)
    with pytest.raises(ValueError, match=r"patch_size=\(2, 2, 2\) groups 2 latent frames"):
        SanaVideoStream(tiny_sana(patch_size=(2, 2, 2)), latent_size=(H, W), frames_per_block=2)
    with pytest.raises(TypeError, match="model is a AutoencoderKLWan; expected a SanaVideoTransformer3DModel"):
        SanaVideoStream(tiny_wan_vae(), latent_size=(H, W), frames_per_block=1)

    vae = tiny_wan_vae()
    with pytest.raises(ValueError, match=r"latents have shape \(1, 4, 2, 4, 4\); "
                                         r"expected \[B, z_dim=16, F >= 1, h, w\]"):
        decode_chunk(vae, torch.randn(1, 4, 2, 4, 4))
    _, state = decode_chunk(vae, torch.randn(1, 16, 1, 4, 4))
    with pytest.raises(ValueError, match=r"\(1, 4, 8\) do not continue the stream's \(1, 4, 4\)"):
        decode_chunk(vae, torch.randn(1, 16, 1, 4, 8), state)
