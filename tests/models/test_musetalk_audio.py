"""MuseTalk's audio context, against a readable twin written here from its algorithm with transformers' own
feature extractor and encoder forward: every-layer features at 50 Hz, each frame's 10-row window, the position
code."""
import math

import numpy as np
import pytest
import torch
from helpers import MUSETALK_AUDIO_DIM, tiny_musetalk_folder

from framegraph.models.avatar.musetalk.audio import ROWS, every_layer_features, frame_windows, position_code
from framegraph.models.avatar.musetalk.files import load_whisper


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    root = tiny_musetalk_folder(tmp_path_factory.mktemp("musetalk"))
    return load_whisper(root / "models/whisper", MUSETALK_AUDIO_DIM)


def speech(seconds: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.float32)


def reference_windows(encoder, wave: np.ndarray, fps: int) -> torch.Tensor:
    """The algorithm as MuseTalk describes it: 30-s segments through Whisper's feature extractor, the encoder's
    hidden states stacked, cut to the audio's length, padded 4 rows before and 12 after, 10 rows a frame."""
    from transformers import WhisperFeatureExtractor

    extract = WhisperFeatureExtractor(feature_size=80)
    states = []
    for start in range(0, len(wave), 30 * 16000):
        mel = extract(wave[start:start + 30 * 16000], sampling_rate=16000, return_tensors="pt").input_features
        with torch.no_grad():
            states.append(torch.stack(encoder(mel, output_hidden_states=True).hidden_states, dim=2))
    feats = torch.cat(states, dim=1)[:, :math.floor(len(wave) / 16000 * 50)]
    feats = torch.cat([torch.zeros_like(feats[:, :4]), feats, torch.zeros_like(feats[:, :12])], dim=1)
    frames = math.floor(len(wave) / 16000 * fps)
    clips = [feats[:, math.floor(i * 50 / fps):math.floor(i * 50 / fps) + 10] for i in range(frames)]
    return torch.cat(clips).flatten(1, 2)


@pytest.mark.parametrize("seconds", [1.3, 31.0])  # within one 30-s segment, and across two
def test_every_frames_context_equals_the_readable_twin(encoder, seconds):
    wave = speech(seconds)
    feats = every_layer_features(encoder, torch.from_numpy(wave))
    layers = encoder.config.encoder_layers + 1
    assert feats.shape == (math.floor(seconds * 50), layers, MUSETALK_AUDIO_DIM)
    got = frame_windows(feats, 25)
    want = reference_windows(encoder, wave, 25)
    assert got.shape == want.shape == (math.floor(seconds * 25), ROWS * layers, MUSETALK_AUDIO_DIM)
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.count_nonzero(got[0, :4 * layers]) == 0 and torch.count_nonzero(got[5]) > 0


def test_frames_past_the_audio_attend_to_silence_and_the_position_code_is_sinusoidal(encoder):
    feats = every_layer_features(encoder, torch.from_numpy(speech(0.4)))
    windows = frame_windows(feats, 25, frames=20)  # the audio covers 10 frames
    assert windows.shape[0] == 20 and torch.count_nonzero(windows[-1]) == 0
    code = position_code(50, 8)
    assert torch.allclose(code[:, 0], torch.sin(torch.arange(50.0)))
    assert torch.allclose(code[:, 1], torch.cos(torch.arange(50.0)))
    assert torch.allclose(code[3, 6], torch.tensor(math.sin(3 / 10000 ** (6 / 8))), atol=1e-6)
