"""MuseTalk's files from a folder in its released layout (tiny random models of the same stock classes): they load,
and each thing a user can get wrong is a sentence naming what was expected."""
import json
import shutil

import pytest
import torch
from helpers import MUSETALK_AUDIO_DIM, tiny_musetalk_folder

from framegraph.models.avatar.musetalk.files import MuseTalkError, MuseTalkFiles, load_unet, load_vae, load_whisper


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_musetalk_folder(tmp_path_factory.mktemp("musetalk"))


def test_the_released_layout_loads_into_the_stock_classes(folder):
    files = MuseTalkFiles.find(folder)
    unet = load_unet(files.unet_config, files.unet_weights)
    assert unet.config.in_channels == 8 and unet.config.cross_attention_dim == MUSETALK_AUDIO_DIM
    saved = torch.load(files.unet_weights, weights_only=True)
    assert all(torch.equal(unet.state_dict()[k], v) for k, v in saved.items())  # the weights, not fresh ones
    assert load_vae(files.vae).config.latent_channels == 4
    assert load_whisper(files.whisper, MUSETALK_AUDIO_DIM).config.d_model == MUSETALK_AUDIO_DIM


def test_a_missing_part_names_the_layout(folder, tmp_path):
    with pytest.raises(MuseTalkError, match=r"the UNet's config is not at .*musetalk\.json.*musetalkV15/unet.pth"):
        MuseTalkFiles.find(tmp_path)
    copy = tmp_path / "mt"
    shutil.copytree(folder, copy)
    shutil.rmtree(copy / "models/whisper")
    with pytest.raises(MuseTalkError, match=r"Whisper is not at .*models/whisper.*expected whisper/ with a config"):
        MuseTalkFiles.find(copy)
    with pytest.raises(MuseTalkError, match="give the MuseTalk folder"):
        MuseTalkFiles.find(None, vae=copy / "models/sd-vae")
    # each path can be given instead
    files = MuseTalkFiles.find(copy, whisper=folder / "models/whisper")
    assert files.whisper == folder / "models/whisper" and files.vae == copy / "models/sd-vae"


def test_weights_that_do_not_fit_the_config_name_the_first_three(folder, tmp_path):
    files = MuseTalkFiles.find(folder)
    state = torch.load(files.unet_weights, weights_only=True)
    keys = sorted(state)
    del state[keys[0]]
    state["extra.weight"] = torch.zeros(1)
    shape_key = next(k for k in keys[1:] if state[k].dim() == 4)
    state[shape_key] = torch.zeros(1, 1, 1, 1)
    torch.save(state, tmp_path / "unet.pth")
    with pytest.raises(MuseTalkError) as e:
        load_unet(files.unet_config, tmp_path / "unet.pth")
    message = str(e.value)
    assert f"{keys[0]} missing" in message and "extra.weight not in the config's model" in message
    assert f"{shape_key} is [1, 1, 1, 1], the config's" in message
    (tmp_path / "bad.json").write_text(json.dumps({"in_channels": "eight"}))
    with pytest.raises(MuseTalkError, match="does not build a UNet2DConditionModel"):
        load_unet(tmp_path / "bad.json", files.unet_weights)
    (tmp_path / "junk.pth").write_bytes(b"not a state dict")
    with pytest.raises(MuseTalkError, match="do not load as a state dict"):
        load_unet(files.unet_config, tmp_path / "junk.pth")


def test_a_whisper_of_another_size_is_refused(folder):
    with pytest.raises(MuseTalkError, match=r"is 16 wide; the UNet attends to 384-wide audio features"):
        load_whisper(folder / "models/whisper", 384)
