"""Audio features: mel filterbank, log-mel, the causal encoder, streaming == offline, look-ahead, reset."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from framegraph.models.audio import (
    AudioEncoder,
    FrameTiming,
    LogMel,
    StreamingFeatures,
    default_encoder,
    extract_features,
    mel_center_frequencies,
    mel_filterbank,
)

SR = 16_000


@pytest.fixture(scope="module")
def model():
    return default_encoder(seed=0)


def noise(seconds: float, seed: int = 0, amp: float = 3000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * SR)) * amp).clip(-32768, 32767).astype(np.int16)


def test_filterbank_covers_every_band_with_unit_area_triangles():
    fb = mel_filterbank(80, 512, SR, f_min=40.0)
    assert fb.shape == (80, 257)
    assert (fb >= 0).all()
    assert ((fb > 0).sum(dim=1) >= 1).all(), "every mel band must cover at least one FFT bin"
    centres = mel_center_frequencies(80, 40.0, SR / 2)
    assert torch.all(centres[1:] > centres[:-1])
    with pytest.raises(ValueError, match="cover no FFT bin"):
        mel_filterbank(256, 64, SR)


@pytest.mark.parametrize("freq", [300.0, 1000.0, 3000.0])
def test_a_tone_peaks_in_the_mel_band_centred_on_it(freq):
    logmel = LogMel()
    t = torch.arange(SR) / SR
    mel = logmel(0.5 * torch.sin(2 * math.pi * freq * t))  # [80, 100]
    assert mel.shape == (80, 100)
    peak = mel[:, 10:].mean(dim=1).argmax().item()
    centres = mel_center_frequencies(80, 40.0, SR / 2)
    expected = (centres - freq).abs().argmin().item()
    assert abs(peak - expected) <= 1, (peak, expected, centres[peak].item())
    # far bands are much quieter than the peak (log power: e^6 ≈ 400x)
    assert mel[:, 50][peak] - mel[:, 50][(peak + 30) % 80] > 6


def test_silence_is_the_log_floor_and_frames_are_causal():
    logmel = LogMel()
    assert torch.equal(logmel(torch.zeros(1600)), torch.full((80, 10), math.log(logmel.log_floor)))
    x = torch.zeros(1600)
    x[1000] = 1.0  # an impulse at sample 1000 shows only in the frames whose window holds it
    mel = logmel(x)
    loud = (mel > logmel.floor_value + 1).any(dim=0).nonzero().flatten().tolist()
    assert loud == [j for j in range(10) if (j + 1) * 160 - 400 <= 1000 < (j + 1) * 160]  # windows holding it


def test_timing_maps_video_frames_onto_audio_samples(model):
    timing = FrameTiming.of(model, 25)
    assert timing.end_sample(0) == 640 and timing.end_sample(24) == SR
    assert timing.n_frames(SR) == 25 and timing.n_frames(SR + 1) == 26
    assert all(0 <= timing.lookahead_ms(k) <= 80 for k in range(100))
    t30 = FrameTiming.of(model, 30)
    assert all(0 <= t30.lookahead_ms(k) <= 80 for k in range(100))
    with pytest.raises(ValueError, match="fps"):
        FrameTiming.of(model, 200)


def test_encoder_shapes_and_limits(model):
    mel = torch.randn(2, 80, 50)
    out = model(mel)
    assert out.shape == (2, model.feature_dim, 50 - model.receptive_field + 1)
    with pytest.raises(ValueError, match="lookahead_ms"):
        AudioEncoder(lookahead_ms=100)
    with pytest.raises(ValueError, match="multiple of hop_ms"):
        AudioEncoder(lookahead_ms=45)


@pytest.mark.parametrize("fps", [25, 30, 29.97])
def test_streaming_gives_the_offline_numbers_for_any_chunking(model, fps):
    x = noise(2.3, seed=1)
    offline = extract_features(model, x, fps)
    assert offline.shape == (math.ceil(len(x) * fps / SR), model.feature_dim)
    rng = np.random.default_rng(2)
    stream = StreamingFeatures(model, fps)
    got, i = [], 0
    while i < len(x):
        n = int(rng.integers(1, 900))
        got += stream.push(x[i:i + n])
        i += n
    got += stream.flush()
    assert [k for k, _ in got] == list(range(len(offline)))
    torch.testing.assert_close(torch.stack([f for _, f in got]), offline, atol=1e-5, rtol=0)
    # 20 ms chunks, as the audio sources send them
    stream.restart()
    chunked = [f for i in range(0, len(x), 320) for _, f in stream.push(x[i:i + 320])] + \
              [f for _, f in stream.flush()]
    torch.testing.assert_close(torch.stack(chunked), offline, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lookahead_ms", [40.0, 80.0])
def test_features_look_at_most_80_ms_past_the_end_of_their_frame(lookahead_ms):
    model = default_encoder(seed=0, lookahead_ms=lookahead_ms)
    timing = FrameTiming.of(model, 25)
    x = noise(1.5, seed=3)
    base = extract_features(model, x, 25)
    k = 10
    limit = timing.end_sample(k) + int(lookahead_ms * SR / 1000)
    assert limit - timing.end_sample(k) <= 80 * SR // 1000
    changed = x.copy()
    changed[limit:] = noise(1.5, seed=4)[limit:]
    after = extract_features(model, changed, 25)
    torch.testing.assert_close(after[: k + 1], base[: k + 1], atol=0, rtol=0)  # frames 0..k untouched
    # ... while audio inside the look-ahead does change frame k (the bound is tight)
    inside = x.copy()
    inside[limit - 160:limit] = noise(0.01, seed=5)[:160]
    assert (extract_features(model, inside, 25)[k] - base[k]).abs().max() > 1e-4


def test_reset_forgets_the_audio_heard_so_far(model):
    x = noise(1.2, seed=6)
    cut = 9 * 320  # a barge-in after 9 chunks
    stream = StreamingFeatures(model, 25)
    got = []
    for i in range(0, len(x), 320):
        if i == cut:
            stream.reset()
        got += stream.push(x[i:i + 320])
    got += stream.flush()
    silent_before = x.copy()
    silent_before[:cut] = 0
    expected = extract_features(model, silent_before, 25)
    first_after = next(i for i, (k, _) in enumerate(got) if FrameTiming.of(model, 25).required_samples(k) > cut)
    assert [k for k, _ in got] == list(range(len(expected))), "counters go on through a reset"
    torch.testing.assert_close(torch.stack([f for _, f in got[first_after:]]), expected[first_after:],
                               atol=1e-5, rtol=0)


def test_save_pretrained_round_trip(model, tmp_path):
    model.save_pretrained(tmp_path / "enc")
    assert (tmp_path / "enc" / "config.json").is_file()
    assert list((tmp_path / "enc").glob("*.safetensors"))
    loaded = AudioEncoder.from_pretrained(tmp_path / "enc").eval()
    assert loaded.config.lookahead_ms == model.config.lookahead_ms
    x = noise(0.5, seed=7)
    torch.testing.assert_close(extract_features(loaded, x, 25), extract_features(model, x, 25))
