"""Our models' save / load: diffusers' folder format, without importing diffusers."""
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from framegraph.assets import path
from framegraph.models.audio import AudioEncoder
from framegraph.models.pretrained import PretrainedModel, register_to_config
from framegraph.models.vae import VideoVAE


class Tiny(PretrainedModel):
    @register_to_config
    def __init__(self, width: int = 4, sizes: tuple[int, ...] = (1, 2), scale: float | None = None):
        super().__init__()
        self.linear = nn.Linear(width, sum(sizes))


def test_config_holds_every_init_argument_and_is_read_only():
    m = Tiny(6, scale=0.5)
    assert dict(m.config) == {"width": 6, "sizes": (1, 2), "scale": 0.5}
    assert m.config.width == 6
    with pytest.raises(TypeError, match="read-only"):
        m.config["width"] = 3
    m.register_to_config(extra=[1.0])
    assert m.config.extra == [1.0] and m.config.width == 6


def test_save_and_load_round_trip(tmp_path):
    m = Tiny(5, sizes=(3, 4))
    m.register_to_config(note="kept")
    m.save_pretrained(tmp_path / "tiny")
    config = json.loads((tmp_path / "tiny" / "config.json").read_text())
    assert config["_class_name"] == "Tiny" and config["sizes"] == [3, 4]
    back = Tiny.from_pretrained(tmp_path / "tiny")
    assert back.config.width == 5 and back.config.note == "kept" and not back.training
    for a, b in zip(m.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)


def test_a_weight_file_that_does_not_match_names_the_file(tmp_path):
    Tiny(5).save_pretrained(tmp_path / "tiny")
    config = json.loads((tmp_path / "tiny" / "config.json").read_text())
    (tmp_path / "tiny" / "config.json").write_text(json.dumps({**config, "width": 7}))
    with pytest.raises(ValueError, match="diffusion_pytorch_model.safetensors does not match"):
        Tiny.from_pretrained(tmp_path / "tiny")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        Tiny.from_pretrained(tmp_path / "nowhere")


def test_folders_are_interchangeable_with_diffusers(tmp_path):
    """A folder diffusers' ModelMixin writes loads here, and one written here loads in diffusers."""
    from diffusers import ConfigMixin, ModelMixin
    from diffusers.configuration_utils import register_to_config as diffusers_register

    class TinyDiffusers(ModelMixin, ConfigMixin):
        @diffusers_register
        def __init__(self, width: int = 4, sizes: tuple[int, ...] = (1, 2), scale: float | None = None):
            super().__init__()
            self.linear = nn.Linear(width, sum(sizes))

    theirs = TinyDiffusers(3, sizes=(2, 2))
    theirs.save_pretrained(tmp_path / "theirs")
    ours = Tiny.from_pretrained(tmp_path / "theirs")
    assert ours.config.width == 3 and torch.equal(ours.linear.weight, theirs.linear.weight)
    Tiny(4, sizes=(1, 5)).save_pretrained(tmp_path / "ours")
    back = TinyDiffusers.from_pretrained(tmp_path / "ours", low_cpu_mem_usage=False)
    assert back.config.sizes == [1, 5] and back.linear.weight.shape == (6, 4)


def test_shipped_bundle_parts_load(tmp_path):
    """The shipped avatar's parts were written by diffusers; they load, and save / load again the same."""
    audio = AudioEncoder.from_pretrained(path("avatars", "astronaut", "audio"))
    vae = VideoVAE.from_pretrained(path("avatars", "astronaut", "vae"))
    assert vae.config.latent_mean is not None and len(vae.config.latent_mean) == vae.latent_channels
    vae.save_pretrained(tmp_path / "vae")
    again = VideoVAE.from_pretrained(tmp_path / "vae")
    z = torch.randn(1, vae.latent_channels, 1, 4, 4)
    assert torch.equal(vae.denormalize(z), again.denormalize(z))
    assert audio.feature_dim == audio.config.feature_dim


def test_the_avatar_does_not_import_diffusers():
    """diffusers costs ~2 s of start-up (it imports torch._dynamo); our own models need only its file format."""
    code = "import sys, framegraph.models.avatar; print('diffusers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
