"""The generate pipeline's causal VAE decoder (diffusers' ``AutoencoderKLWan``, a tiny config built here) exported
to ONNX and streamed on ORT gives the frames of the streamed torch decode (``decode_chunk``), chunk after
chunk, for a stream that starts with one latent frame per chunk and with two; the export's two rewrites (the
nearest-exact upsampler, the cache padded to its steady layout) change nothing in torch either; a missing,
stale or foreign export is refused naming the export command."""
import pytest
import torch
from diffusers import AutoencoderKLWan
from torch import nn

pytest.importorskip("onnx")

from framegraph.models.generate.onnx import (
    Nearest2x,
    WanVAEExport,
    cache_shapes,
    export_wan_vae,
    exportable,
    steady_cache,
)
from framegraph.models.generate.vae import decode_chunk
from framegraph.models.onnx import ExportError

SIZE = (32, 48)  # HxW: 4x6 latents


def tiny_vae(seed: int = 0) -> AutoencoderKLWan:
    torch.manual_seed(seed)
    return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True]).eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def latents(n: int, frames: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 16, frames, SIZE[0] // 8, SIZE[1] // 8, generator=gen) for _ in range(n)]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    vae = tiny_vae()
    out = {}
    for f in (1, 2):
        out[f] = str(tmp_path_factory.mktemp(f"wan_f{f}"))
        export_wan_vae(vae, out[f], size=SIZE, chunk_frames=f, source="tiny")
    return vae, out


def test_nearest2x_is_the_stock_nearest_exact_upsample():
    x = torch.randn(2, 3, 5, 7)
    assert torch.equal(Nearest2x()(x), nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact")(x))
    vae = tiny_vae()
    copy = exportable(vae)
    assert not any(isinstance(m, nn.Upsample) for m in copy.modules())
    assert any(isinstance(m, nn.Upsample) for m in vae.modules())  # the caller's model is untouched
    state_a = state_b = None
    for z in latents(3, 2):
        a, state_a = decode_chunk(vae, z, state_a)
        b, state_b = decode_chunk(copy, z, state_b)
        assert torch.equal(a, b)


@pytest.mark.parametrize("frames", [1, 2])
def test_the_steady_cache_layout_decodes_as_diffusers_own_state(frames):
    """After the first chunk diffusers keeps 1-frame entries and "Rep" markers (frames=1); their 2-frame
    zero-padded form decodes the next chunks to the same frames (the readable twin of the ONNX cache)."""
    vae = tiny_vae()
    shapes = cache_shapes(vae, (SIZE[0] // 8, SIZE[1] // 8), frames)
    first, *rest = latents(3, frames)
    _, state = decode_chunk(vae, first)
    if frames == 1:
        assert any(isinstance(t, str) for t in state.feat_cache)  # "Rep": the layouts do differ
    padded = type(state)(list(state.feat_cache), state.frames, state.latent_shape)
    for i, t in zip(shapes, steady_cache(state.feat_cache, shapes)):
        assert tuple(t.shape) == shapes[i]
        padded.feat_cache[i] = t
    for z in rest:
        a, state = decode_chunk(vae, z, state)
        b, padded = decode_chunk(vae, z, padded)
        assert torch.allclose(a, b, rtol=0, atol=1e-6) and a.std() > 0.01


@pytest.mark.parametrize("frames", [1, 2])
def test_streamed_ort_decode_equals_streamed_torch_decode(exports, frames):
    vae, out = exports
    ort = WanVAEExport(out[frames], vae, size=SIZE, chunk_frames=frames).stream()
    bound = [t.data_ptr() for c in ort.caches for t in c.values()]
    chunks = latents(5, frames)
    state, first = None, None
    for k, z in enumerate(chunks):
        want, state = decode_chunk(vae, z, state)
        got = ort.decode(z)
        assert got.shape == want.shape == (1, 3, 1 + 4 * (frames - 1) if k == 0 else 4 * frames, *SIZE)
        assert rel(got, want) <= 1e-4 and want.std() > 0.01  # a picture, not a constant
        first = got.clone() if k == 0 else first
    assert [t.data_ptr() for c in ort.caches for t in c.values()] == bound  # the cache stays bound in place
    ort.reset()  # a new stream: decoded as a first chunk again, the past forgotten
    assert rel(ort.decode(chunks[0]), first) <= 1e-6


def test_missing_stale_and_foreign_exports_are_refused_naming_the_command(exports, tmp_path):
    vae, out = exports
    with pytest.raises(ExportError, match=r"no ONNX export .*framegraph export --generate MODEL_DIR --size 32x48 "
                                          r"--chunk-frames 2"):
        WanVAEExport(str(tmp_path), vae, size=SIZE, chunk_frames=2)
    with pytest.raises(ExportError, match="another or an older VAE.*stale.*framegraph export --generate m"):
        WanVAEExport(out[2], tiny_vae(seed=1), size=SIZE, chunk_frames=2, model="m")
    with pytest.raises(ExportError, match=r"made for chunk_frames=1; this run needs chunk_frames=2"):
        WanVAEExport(out[1], vae, size=SIZE, chunk_frames=2)
    with pytest.raises(ExportError, match=r"made for size_hw=\[32, 48\]; this run needs size_hw=\[48, 48\]"):
        WanVAEExport(out[1], vae, size=(48, 48), chunk_frames=1)
    from framegraph.models.avatar import random_avatar
    from framegraph.models.avatar.portrait.engines import AvatarExport

    with pytest.raises(ExportError, match="format 'framegraph-onnx-wan-vae/1', expected 'framegraph-onnx-avatar/1'"):
        AvatarExport(out[1], random_avatar(region_size=64))  # a VAE export is no avatar export
