"""AvatarDiT: shapes, block causality, streaming == teacher-forced full sequence, flat state, reset,
Monarch option, save/load."""
from __future__ import annotations

import pytest
import torch

from framegraph.models.dit import AvatarDiT, DiTStreamState, generate
from framegraph.models.dit.layers import patchify, unpatchify

C, H, W, F = 4, 4, 4, 8


def tiny(seed: int = 0, **config) -> AvatarDiT:
    """A tiny model with every weight random (the default init zeroes the output and temporal taps,
    which would make causality and streaming checks trivially true)."""
    torch.manual_seed(seed)
    cfg = dict(latent_channels=C, sample_size=H, width=32, depth=2, heads=2, audio_dim=F, audio_past_frames=2,
               temporal_kernel=3, freq_dim=32, ffn_ratio=2.0, backend="torch")
    cfg.update(config)
    model = AvatarDiT(**cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15)
    return model.eval()


def inputs(B: int, T: int, seed: int = 1, h: int = H, w: int = W, block: int = 1):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(B, C, T, h, w, generator=g)
    noisy = torch.randn(B, C, T, h, w, generator=g)
    t = torch.rand(B, T // block, generator=g).repeat_interleave(block, dim=1)
    audio = torch.randn(B, T, F, generator=g)
    label = torch.rand(B, T, 4, generator=g)
    ref = torch.randn(B, C, h, w, generator=g)
    return x0, noisy, t, audio, label, ref


def assert_close(a, b, tol=1e-5):
    scale = max(1.0, b.abs().max().item())
    assert (a - b).abs().max().item() <= tol * scale, (a - b).abs().max().item()


def test_patchify_round_trip_and_token_order():
    x = torch.randn(2, C, 3, H, W)
    for p in (1, 2):
        tokens = patchify(x, p)
        assert tokens.shape == (2, 3 * (H // p) * (W // p), C * p * p)
        assert torch.equal(unpatchify(tokens, C, 3, H, W, p), x)
    # the tokens of frame f are a contiguous run (frame-major order)
    assert torch.equal(patchify(x, 2)[:, 4:8], patchify(x[:, :, 1:2], 2))


@pytest.mark.parametrize("patch, block", [(1, 1), (2, 2)])
def test_shapes_of_every_call(patch, block):
    model = tiny(patch_size=patch, frames_per_block=block)
    T = 2 * block
    x0, noisy, t, audio, label, ref = inputs(2, T, block=block)
    assert model(noisy, t, audio, label, ref).shape == (2, C, T, H, W)
    assert model(noisy, t[:, 0], audio, label, ref[0]).shape == (2, C, T, H, W)  # t [B], ref [C, h, w]
    assert model(noisy, t, audio, label, ref, clean=x0).shape == (2, C, T, H, W)
    stream = model.init_stream(ref)
    sl = slice(0, block)
    assert model(noisy[:, :, sl], t[:, sl], audio[:, sl], label[:, sl], stream=stream).shape == (2, C, block, H, W)
    # a latent grid other than sample_size also runs (the model is resolution-agnostic)
    x0b, noisyb, tb, audiob, labelb, refb = inputs(1, T, h=8, w=4, block=block)
    assert model(noisyb, tb, audiob, labelb, refb).shape == (1, C, T, 8, 4)


def test_bad_inputs_say_what_was_expected():
    model = tiny(frames_per_block=2)
    x0, noisy, t, audio, label, ref = inputs(1, 4, block=2)
    with pytest.raises(ValueError, match="multiple of frames_per_block=2"):
        model(noisy[:, :, :3], t[:, :3], audio[:, :3], label[:, :3], ref)
    with pytest.raises(ValueError, match="audio has shape"):
        model(noisy, t, audio[:, :2], label, ref)
    with pytest.raises(ValueError, match="ref has shape"):
        model(noisy, t, audio, label, ref[:, :2])
    with pytest.raises(ValueError, match="one block"):
        model(noisy, t, audio, label, stream=model.init_stream(ref))
    with pytest.raises(ValueError, match="patch_size"):
        AvatarDiT(sample_size=5, patch_size=2)
    with pytest.raises(ValueError, match="decay"):
        AvatarDiT(attention_decay=1.5)


@pytest.mark.parametrize("teacher_forced, decay", [(False, 1.0), (True, 1.0), (True, 0.8)])
def test_block_causal_later_frames_do_not_change_earlier_outputs(teacher_forced, decay):
    model = tiny(frames_per_block=2, attention_decay=decay)
    T, changed_block = 6, 1
    x0, noisy, t, audio, label, ref = inputs(2, T, block=2)
    clean = x0 if teacher_forced else None
    base = model(noisy, t, audio, label, ref, clean=clean)
    later = slice(2 * changed_block, T)
    noisy2, audio2, label2 = noisy.clone(), audio.clone(), label.clone()
    noisy2[:, :, later] += 1.0
    audio2[:, later] += 1.0
    label2[:, later] = 1 - label2[:, later]
    x02 = x0.clone()
    x02[:, :, later] += 1.0
    out = model(noisy2, t, audio2, label2, ref, clean=x02 if teacher_forced else None)
    earlier = slice(0, 2 * changed_block)
    assert torch.equal(out[:, :, earlier], base[:, :, earlier])
    assert (out[:, :, later] - base[:, :, later]).abs().max() > 1e-3
    if teacher_forced:
        # the clean past of block b is the clean latents: block b's noisy input reaches no other block
        noisy3 = noisy.clone()
        noisy3[:, :, 2:4] += 1.0
        out3 = model(noisy3, t, audio, label, ref, clean=x0)
        assert torch.equal(out3[:, :, 4:], base[:, :, 4:])
        assert torch.equal(out3[:, :, :2], base[:, :, :2])


@pytest.mark.parametrize("patch, block, decay", [(1, 1, 1.0), (2, 2, 1.0), (1, 3, 1.0), (1, 1, 0.8), (2, 2, 0.5)])
def test_streaming_block_by_block_equals_the_teacher_forced_full_sequence(patch, block, decay):
    model = tiny(patch_size=patch, frames_per_block=block, attention_decay=decay)
    T = 4 * block
    x0, noisy, t, audio, label, ref = inputs(2, T, block=block)
    with torch.no_grad():
        full = model(noisy, t, audio, label, ref, clean=x0)
        stream = model.init_stream(ref)
        outs = []
        for start in range(0, T, block):
            sl = slice(start, start + block)
            outs.append(model(noisy[:, :, sl], t[:, sl], audio[:, sl], label[:, sl], stream=stream))
            # denoising calls only read the state: a second call gives the same numbers
            again = model(noisy[:, :, sl], t[:, sl], audio[:, sl], label[:, sl], stream=stream)
            assert torch.equal(again, outs[-1])
            model.append(x0[:, :, sl], audio[:, sl], label[:, sl], stream)
    assert stream.frames == T
    assert_close(torch.cat(outs, dim=2), full)


@pytest.mark.parametrize("decay", [1.0, 0.7])
def test_append_in_one_call_equals_append_block_by_block(decay):
    model = tiny(frames_per_block=1, attention_decay=decay)
    x0, noisy, t, audio, label, ref = inputs(1, 4)
    with torch.no_grad():
        a, b = model.init_stream(ref), model.init_stream(ref)
        model.append(x0, audio, label, a)
        for f in range(4):
            model.append(x0[:, :, f:f + 1], audio[:, f:f + 1], label[:, f:f + 1], b)
        for ta, tb in zip(a.tensors(), b.tensors()):
            assert_close(ta, tb)


def test_decay_bounds_how_far_back_a_block_sees():
    """With decay, a block far in the past weighs decay^distance: its influence fades; without, it stays."""
    x0, noisy, t, audio, label, ref = inputs(1, 12)
    gaps = {}
    for decay in (1.0, 0.3):
        model = tiny(frames_per_block=1, attention_decay=decay, temporal_kernel=1)
        with torch.no_grad():
            base = model(noisy, t, audio, label, ref, clean=x0)
            x02 = x0.clone()
            x02[:, :, 0] += 3.0  # change the first clean frame only
            out = model(noisy, t, audio, label, ref, clean=x02)
        gaps[decay] = (out[:, :, -1] - base[:, :, -1]).abs().max().item()
    assert gaps[0.3] < 1e-3 * gaps[1.0], gaps


def test_stream_state_memory_is_flat_however_long_the_stream():
    model = tiny(frames_per_block=1)
    x0, noisy, t, audio, label, ref = inputs(1, 1)
    with torch.inference_mode():
        stream = model.init_stream(ref)
        assert isinstance(stream, DiTStreamState)
        size0 = stream.nbytes()
        shapes0 = [tuple(t.shape) for t in stream.tensors()]
        ptrs0 = [t.data_ptr() for t in stream.tensors()]
        for _ in range(30):
            model.append(torch.randn_like(x0), torch.randn_like(audio), label, stream)
    assert stream.frames == 30
    assert stream.nbytes() == size0
    assert [tuple(t.shape) for t in stream.tensors()] == shapes0
    assert [t.data_ptr() for t in stream.tensors()] == ptrs0  # updated in place
    assert all(layer.attn.kv.dtype == torch.float32 for layer in stream.layers)
    # per layer: kv [B, H, d, d] + k_sum [B, H, d] in fp32 and a (k - 1)-frame FFN cache
    d = 32 // 2
    expected = 2 * (2 * d * d + 2 * d) * 4 + 2 * (2 * H * W * 32) * 4
    assert sum(t.numel() * t.element_size() for layer in stream.layers for t in layer.tensors()) == expected


def test_reset_starts_the_stream_over():
    model = tiny(frames_per_block=1)
    x0, noisy, t, audio, label, ref = inputs(1, 3)
    with torch.inference_mode():
        stream = model.init_stream(ref)
        first = model(noisy[:, :, :1], t[:, :1], audio[:, :1], label[:, :1], stream=stream)
        model.append(x0, audio, label, stream)
        later = model(noisy[:, :, :1], t[:, :1], audio[:, :1], label[:, :1], stream=stream)
        stream.reset()
        after = model(noisy[:, :, :1], t[:, :1], audio[:, :1], label[:, :1], stream=stream)
    assert stream.frames == 0
    assert not torch.allclose(later, first)
    assert torch.equal(after, first)


def test_generate_is_deterministic_and_steps_matter():
    model = tiny(frames_per_block=2)
    _, _, _, audio, label, ref = inputs(1, 4, block=2)
    with torch.inference_mode():
        a = generate(model, ref, audio, label, steps=2, generator=torch.Generator().manual_seed(3))
        b = generate(model, ref, audio, label, steps=2, generator=torch.Generator().manual_seed(3))
        c = generate(model, ref, audio, label, steps=1, generator=torch.Generator().manual_seed(3))
    assert a.shape == (1, C, 4, H, W)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_monarch_attention_runs_whole_sequences_only():
    model = tiny(attention="monarch")
    x0, noisy, t, audio, label, ref = inputs(1, 3)
    out = model(noisy, t, audio, label, ref)
    assert out.shape == noisy.shape and torch.isfinite(out).all()
    noisy2 = noisy.clone()
    noisy2[:, :, 2] += 1.0
    assert torch.allclose(model(noisy2, t, audio, label, ref)[:, :, :2], out[:, :, :2], atol=1e-6)  # frame-causal
    with pytest.raises(ValueError, match="monarch"):
        model(noisy, t, audio, label, ref, clean=x0)
    with pytest.raises(ValueError, match="monarch"):
        model(noisy[:, :, :1], t[:, :1], audio[:, :1], label[:, :1], stream=model.init_stream(ref))
    with pytest.raises(ValueError, match="frames_per_block=1"):
        AvatarDiT(attention="monarch", frames_per_block=2)


def test_teacher_forced_training_reaches_every_parameter():
    model = tiny(frames_per_block=1).train()
    x0, noisy, t, audio, label, ref = inputs(2, 3)
    model(noisy, t, audio, label, ref, clean=x0).pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_save_pretrained_round_trip(tmp_path):
    model = tiny(frames_per_block=2, patch_size=2)
    model.save_pretrained(tmp_path / "dit")
    assert (tmp_path / "dit" / "config.json").exists()
    loaded = AvatarDiT.from_pretrained(tmp_path / "dit").eval()
    assert loaded.config.frames_per_block == 2 and loaded.config.patch_size == 2
    x0, noisy, t, audio, label, ref = inputs(1, 4, block=2)
    with torch.no_grad():
        assert torch.equal(loaded(noisy, t, audio, label, ref, clean=x0), model(noisy, t, audio, label, ref, clean=x0))


def test_presets_build():
    model = AvatarDiT.from_preset("tiny", latent_channels=8)
    assert model.config.width == 128 and model.config.depth == 4
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    with pytest.raises(ValueError, match="unknown preset"):
        AvatarDiT.from_preset("huge")


def test_a_bfloat16_model_streams_with_fp32_state():
    model = tiny(frames_per_block=1).to(torch.bfloat16)
    _, _, _, audio, label, ref = inputs(1, 2)
    with torch.inference_mode():
        stream = model.init_stream(ref)
        x = generate(model, ref, audio, label, steps=2, generator=torch.Generator().manual_seed(0), stream=stream)
    assert x.dtype == torch.bfloat16 and torch.isfinite(x.float()).all()
    assert stream.layers[0].attn.kv.dtype == torch.float32 and stream.ref.dtype == torch.bfloat16


@pytest.mark.gpu
def test_cuda_triton_kernels_match_the_torch_reference_and_stream():
    model = tiny(frames_per_block=2, width=64, heads=2).cuda()
    x0, noisy, t, audio, label, ref = (v.cuda() for v in inputs(2, 6, block=2))
    with torch.no_grad():
        config = {k: v for k, v in model.config.items() if not k.startswith("_")}
        auto = AvatarDiT(**{**config, "backend": "auto"}).cuda().eval()
        auto.load_state_dict(model.state_dict())
        full_ref = model(noisy, t, audio, label, ref, clean=x0)
        full = auto(noisy, t, audio, label, ref, clean=x0)
        assert_close(full, full_ref, 1e-4)
        stream, outs = auto.init_stream(ref), []
        for s in range(0, 6, 2):
            sl = slice(s, s + 2)
            outs.append(auto(noisy[:, :, sl], t[:, sl], audio[:, sl], label[:, sl], stream=stream))
            auto.append(x0[:, :, sl], audio[:, sl], label[:, sl], stream)
        assert_close(torch.cat(outs, dim=2), full, 1e-4)
    auto(noisy, t, audio, label, ref, clean=x0).pow(2).mean().backward()
    assert all(p.grad is not None for p in auto.parameters())
