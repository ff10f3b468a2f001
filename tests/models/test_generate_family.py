"""The family layer under the generate stages: streamed VAE encode equals one ``vae.encode``; re-anchoring
before the rotary table ends continues the stream from its recent chunks; bf16 loading keeps the modules
diffusers keeps in float32 and still streams."""
import pytest
import torch
from diffusers import AutoencoderKLWan
from helpers import tiny_generate_folder

from framegraph.models.generate import FAMILIES, encode_chunk, load_generate_model, warp_timesteps
from framegraph.models.generate.wan import WanCausal


def test_streamed_vae_encode_equals_one_shot_encode():
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True]).eval()
    video = torch.rand(1, 3, 1 + 4 * 5, 32, 32) * 2 - 1
    with torch.no_grad():
        whole = vae.encode(video).latent_dist.mean
    pieces, state = [], None
    for start, end in ((0, 5), (5, 13), (13, 17), (17, 21)):  # 1 + 4, then 8, 4, 4 frames
        latents, state = encode_chunk(vae, video[:, :, start:end], state)
        pieces.append(latents)
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"T = a multiple of 4"):
        encode_chunk(vae, video[:, :, :3], state)
    with pytest.raises(ValueError, match=r"T = 1 \+ 4 \* k \(the stream's first chunk\)"):
        encode_chunk(vae, video[:, :, :4])


@torch.no_grad()
def test_reanchoring_continues_from_the_recent_chunks(tmp_path):
    """A Wan stream at its 8-frame rotary table re-anchors: the next chunk is what a fresh stream gives after
    appending the same recent chunks from position 0."""
    gm = load_generate_model(str(tiny_generate_folder(tmp_path / "wan", "wan", rope_max_seq_len=8)))
    stream = FAMILIES["wan"].open(gm.transformer, latent_size=(2, 2), chunk_frames=2, cache_frames=6, sink_frames=2)
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, 4, 16, generator=g)
    chunks = [stream.generate(torch.randn(1, 16, 2, 2, 2, generator=g), embeds, timesteps=[1000, 500], renoise=False)
              for _ in range(4)]
    assert stream.reanchors == 0 and stream.frames_seen == 8
    noise = torch.randn(1, 16, 2, 2, 2, generator=g)
    after = stream.generate(noise, embeds, timesteps=[1000, 500], renoise=False)
    assert stream.reanchors == 1 and stream.frames_seen == 2 * stream.anchor_chunks + 2
    stream.streamer.uninstall()
    fresh = WanCausal(gm.transformer, chunk_frames=2, cache_frames=6, sink_frames=2)
    for clean in chunks[-stream.anchor_chunks:]:
        fresh.append(clean, embeds)
    torch.testing.assert_close(after, fresh.generate_chunk(embeds, noise, timesteps=[1000, 500], renoise=False))


@torch.no_grad()
@pytest.mark.parametrize("family", ["wan", "sana"])
def test_bf16_loading_keeps_fp32_modules_and_streams(tmp_path, family):
    gm = load_generate_model(str(tiny_generate_folder(tmp_path / family, family)), dtype=torch.bfloat16)
    kept = set(type(gm.transformer)._keep_in_fp32_modules or [])
    for name, p in gm.transformer.named_parameters():
        assert p.dtype == (torch.float32 if kept.intersection(name.split(".")) else torch.bfloat16), name
    stream = gm.family.open(gm.transformer, latent_size=(4, 6), chunk_frames=2,
                            **({"backend": "torch"} if family == "sana" else {}))
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        clean = stream.generate(torch.randn(1, 16, 2, 4, 6, generator=g).bfloat16(),
                                torch.randn(1, 4, 16, generator=g).bfloat16(), torch.ones(1, 4),
                                timesteps=[1000, 500], generator=g)
        assert clean.dtype == torch.bfloat16 and torch.isfinite(clean).all() and clean.float().std() > 0.1


def test_timesteps_are_warped_as_the_wan_students_sample():
    """Self-Forcing's [1000, 750, 500, 250] with shift 5 are sigmas 1, 0.9375, 0.8333, 0.625."""
    assert warp_timesteps([1000, 750, 500, 250], 5.0) == pytest.approx([1000, 937.5, 833.333, 625], abs=1e-3)
    assert warp_timesteps([1000, 500], 1.0) == [1000, 500]
    with pytest.raises(ValueError, match="shift=0"):
        warp_timesteps([1000], 0)
