"""One frame of MuseTalk's step against a readable twin of the same algorithm written here (the stock classes
called as MuseTalk's inference calls them), on tiny random models in MuseTalk's layout."""
import math

import numpy as np
import pytest
import torch
from helpers import MUSETALK_AUDIO_DIM, astronaut, tiny_musetalk_folder
from PIL import Image

from framegraph.models.avatar.musetalk.audio import ROWS
from framegraph.models.avatar.musetalk.files import MuseTalkFiles, load_unet, load_vae
from framegraph.models.avatar.musetalk.step import MuseTalkStep, face_latents


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    files = MuseTalkFiles.find(tiny_musetalk_folder(tmp_path_factory.mktemp("musetalk")))
    return load_unet(files.unet_config, files.unet_weights), load_vae(files.vae)


def reference_frame(unet, vae, face: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """MuseTalk's frame, spelled out: [0, 1] pixels, the lower half zeroed, normalised to [-1, 1]; both encoded
    (posterior mean) and scaled; masked then whole on channels; the UNet at t = 0 on the window plus the sinusoidal
    code; the output decoded to uint8."""
    x = face.permute(2, 0, 1).float()[None] / 255.0
    half = x.clone()
    half[:, :, x.shape[2] // 2:] = 0
    s = vae.config.scaling_factor
    lat = torch.cat([vae.encode(half * 2 - 1).latent_dist.mean * s, vae.encode(x * 2 - 1).latent_dist.mean * s], 1)
    n, d = window.shape
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    out = unet(lat, torch.tensor(0), encoder_hidden_states=(window + pe)[None]).sample
    image = vae.decode(out / s).sample
    return ((image / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)[0].permute(1, 2, 0)


def test_one_frame_equals_the_readable_twin(models):
    unet, vae = models
    torch.manual_seed(0)
    face = torch.from_numpy(np.asarray(Image.fromarray(astronaut()).resize((256, 256))).copy())  # a real picture
    window = torch.randn(ROWS * 3, MUSETALK_AUDIO_DIM)  # 10 rows × 3 layers of the tiny Whisper
    with torch.inference_mode():
        got = MuseTalkStep(unet, vae)(face_latents(vae, face[None]), window[None])
        want = reference_frame(unet, vae, face, window)
    assert got.shape == (1, 256, 256, 3) and got.dtype == torch.uint8
    # the same algorithm; the random decoder amplifies float order (its outputs reach ±10 before the clamp), so a
    # few per cent of the pixels move a level or two
    diff = (got[0].int() - want.int()).abs()
    assert diff.max() <= 3 and diff.float().mean() < 0.1
    assert got.float().std() > 1  # a picture, not a constant


def test_a_batch_of_frames_equals_each_frame_alone(models):
    unet, vae = models
    torch.manual_seed(1)
    faces = torch.randint(0, 256, (3, 256, 256, 3), dtype=torch.uint8)
    windows = torch.randn(3, ROWS * 3, MUSETALK_AUDIO_DIM)
    step = MuseTalkStep(unet, vae)
    with torch.inference_mode():
        latents = face_latents(vae, faces)
        batch = step(latents, windows)
        alone = torch.cat([step(latents[i:i + 1], windows[i:i + 1]) for i in range(3)])
    assert latents.shape == (3, 8, 32, 32)
    diff = (batch.int() - alone.int()).abs()
    assert diff.max() <= 3 and diff.float().mean() < 0.1
    with pytest.raises(ValueError, match="context rows; the position code holds"):
        step(latents[:1], torch.zeros(1, 100, MUSETALK_AUDIO_DIM))
