"""The exported ONNX graphs run on ORT (zero-copy bindings, state carried) give the torch numbers, over a
stream of chunks: audio encoder, DiT denoise + append, VAE decode with its cache."""
import json
import os

import pytest
import torch

pytest.importorskip("onnx")

from framegraph.models.audio.features import StreamingFeatures
from framegraph.models.audio.onnx import OrtAudioEncoder
from framegraph.models.avatar import random_avatar
from framegraph.models.avatar.portrait.engines import AvatarExport, OrtDiTStream
from framegraph.models.avatar.portrait.onnx import export_avatar, load_manifest
from framegraph.models.dit.generate import generate_block
from framegraph.models.onnx import ExportError, OrtVAEStream
from framegraph.models.sampler import sample_euler
from framegraph.models.vae.model import uint8_to_frames


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    avatar = random_avatar(region_size=64, chunk_frames=2, dit_config={"frames_per_block": 2})
    out = str(tmp_path_factory.mktemp("onnx"))
    export_avatar(avatar, out)
    return avatar, out


def test_audio_encoder_streamed_ort_equals_torch(exported):
    avatar, out = exported
    ex = AvatarExport(out, avatar)
    enc = avatar.audio
    ort_enc = OrtAudioEncoder(ex.graph("audio"), enc.receptive_field, enc.feature_dim)
    audio = (torch.randn(16_000 * 6 // 10) * 3000).to(torch.int16)
    a, b = StreamingFeatures(enc, 25), StreamingFeatures(enc, 25, encode=ort_enc)
    got_a, got_b = [], []
    for chunk in audio.split(320):  # 20 ms chunks, the context carried from one to the next
        got_a += a.push(chunk)
        got_b += b.push(chunk)
    assert len(got_a) == len(got_b) >= 10
    for (ka, fa), (kb, fb) in zip(got_a, got_b):
        assert ka == kb and rel(fb, fa) <= 1e-4


def dit_parts(exported):
    """The export's reader, the bundle's DiT, its reference latent, config and frames per block."""
    avatar, out = exported
    model = avatar.dit
    return AvatarExport(out, avatar), model, avatar.reference_latent(), model.config, model.config.frames_per_block


def test_dit_streamed_ort_equals_torch(exported):
    ex, model, ref, c, k = dit_parts(exported)
    with torch.inference_mode():
        torch_stream = model.init_stream(ref)
        ort = OrtDiTStream(model, model.init_stream(ref), ex.graph("dit_velocity"), ex.graph("dit_commit"))
        addresses = [t.data_ptr() for s in ort.sets for t in s.tensors()]
        gen = torch.Generator().manual_seed(0)
        for _ in range(4):  # several blocks: the state carried by the appends must match
            noise = torch.randn(1, c.latent_channels, k, *ref.shape[-2:], generator=gen)
            audio, label = torch.randn(1, k, c.audio_dim, generator=gen), torch.rand(1, k, c.state_dim, generator=gen)
            want = generate_block(model, torch_stream, noise, audio, label, steps=2)
            got = sample_euler(lambda x, t: ort.velocity(x, t, audio, label), noise, steps=2)
            ort.append(got, audio, label)
            assert rel(got, want) <= 1e-4
        for a, b in zip(torch_stream.layers, ort.sets[ort.parity].layers):
            assert rel(b.attn.kv, a.attn.kv) <= 1e-4 and float(a.attn.kv.abs().max()) > 0
        assert ort.frames == torch_stream.frames == 4 * k
        assert [t.data_ptr() for s in ort.sets for t in s.tensors()] == addresses  # state updated in place, bound


def test_vae_streamed_ort_equals_torch(exported):
    avatar, out = exported
    ex = AvatarExport(out, avatar)
    vae = avatar.vae
    ref = uint8_to_frames(avatar.region()[0])[None] if vae.uses_reference else None
    ort = OrtVAEStream(ex.graph("vae_first"), ex.graph("vae_next"), ex.manifest["files"], ref)
    cache = None
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for i in range(4):
            z = torch.randn(1, *vae.latent_shape(avatar.chunk_frames, 64, 64), generator=gen)
            want, cache = vae.decode(z, cache, reference=ref if i == 0 else None)
            assert rel(ort.decode(z), want) <= 1e-4


def test_stale_foreign_missing_and_non_onnx_exports_are_refused(exported, tmp_path):
    avatar, out = exported
    other = random_avatar(region_size=64, chunk_frames=2, seed=1, dit_config={"frames_per_block": 2})
    with pytest.raises(ExportError, match="another or an older bundle"):
        load_manifest(out, other)
    with pytest.raises(ExportError, match="no ONNX export .*framegraph export"):
        load_manifest(str(tmp_path), avatar)
    bad = tmp_path / "bad"
    bad.mkdir()
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    json.dump(manifest, open(bad / "manifest.json", "w"))
    for f in manifest["files"].values():
        if "file" in f:
            (bad / f["file"]).write_text("not a model")
    ex = AvatarExport(str(bad), avatar)
    with pytest.raises(ExportError, match="dit_velocity.onnx is not a loadable ONNX model"):
        ex.graph("dit_velocity")
    os.remove(bad / "vae_next.onnx")
    with pytest.raises(ExportError, match="lacks vae_next.onnx"):
        AvatarExport(str(bad), avatar)
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(ExportError, match="not a readable export manifest"):
        AvatarExport(str(bad), avatar)


def test_unrolled_spd_solve_equals_linalg_solve():
    from framegraph.models.vae.register import solve_spd_unrolled

    g = torch.Generator().manual_seed(0)
    m = torch.randn(5, 6, 6, generator=g, dtype=torch.float64)
    a, b = m @ m.transpose(1, 2) + 0.1 * torch.eye(6, dtype=torch.float64), torch.randn(5, 6, 1, generator=g,
                                                                                         dtype=torch.float64)
    assert torch.allclose(solve_spd_unrolled(a, b), torch.linalg.solve(a, b), rtol=1e-9, atol=1e-9)


def test_dit_ort_reset_starts_the_stream_afresh(exported):
    ex, model, ref, c, k = dit_parts(exported)
    gen = torch.Generator().manual_seed(3)
    blocks = [(torch.randn(1, c.latent_channels, k, *ref.shape[-2:], generator=gen),
               torch.randn(1, k, c.audio_dim, generator=gen), torch.rand(1, k, c.state_dim, generator=gen))
              for _ in range(3)]
    with torch.inference_mode():
        ort = OrtDiTStream(model, model.init_stream(ref), ex.graph("dit_velocity"), ex.graph("dit_commit"))

        def run(noise, audio, label):
            x0 = sample_euler(lambda x, t: ort.velocity(x, t, audio, label), noise, steps=1)
            ort.append(x0, audio, label)
            return x0

        first = run(*blocks[0])
        later = run(*blocks[1])
        assert rel(later, first) > 1e-3  # a different block on a stream with a past
        run(*blocks[2])  # the parity flips an odd number of times before the reset
        ort.reset()
        assert ort.frames == 0 and rel(run(*blocks[0]), first) <= 1e-6


def test_denoiser_on_ort_resets_on_its_thread_outside_inference_mode(exported):
    """The graph calls a stage's reset() between frames, outside inference mode (a barge-in): the ORT engine's
    buffers, made under it at setup, are reset in place and the stream starts over (it once raised instead)."""
    from types import SimpleNamespace

    from framegraph.models.avatar.portrait.engines import OrtDiT
    from framegraph.models.dit import Denoiser
    from framegraph.stream import Clock, Frame, StageContext

    ex, model, ref, c, k = dit_parts(exported)
    den = Denoiser(model, ref, steps=1, chunk_frames=k, seed=5,
                   engine=lambda m: OrtDiT(m, ex.graph("dit_velocity"), ex.graph("dit_commit")))
    den.setup(StageContext(Clock("fast"), torch.device("cpu")))
    made = []
    out = SimpleNamespace(write=lambda port: made.append(Frame(den.outputs[port], 1)) or made[-1])
    gen = torch.Generator().manual_seed(1)
    features, labels = torch.randn(2 * k, c.audio_dim, generator=gen), torch.rand(2 * k, c.state_dim, generator=gen)

    def chunk():
        for i in range(k):
            inputs = {"features": Frame(den.inputs["features"], 1), "state": Frame(den.inputs["state"], 1)}
            inputs["features"].data.copy_(features[i])
            inputs["state"].data.copy_(labels[i])
            den.process(inputs, out)

    chunk()
    chunk()
    assert not torch.is_inference_mode_enabled()
    den.reset()
    chunk()
    assert len(made) == 3 and rel(made[1].data, made[0].data) > 1e-3  # the second chunk had a past
    assert rel(made[2].data, made[0].data) <= 1e-6  # after the reset: the first chunk again
