"""MuseTalk 1.5's model files, from the user's own folder: found, checked and loaded.

MuseTalk's released layout is below. Each path can be given instead::

    ROOT/models/musetalkV15/musetalk.json    the UNet's config (a diffusers UNet2DConditionModel)
    ROOT/models/musetalkV15/unet.pth         its state dict
    ROOT/models/sd-vae/                      the VAE (diffusers AutoencoderKL, sd-vae-ft-mse)
    ROOT/models/whisper/                     the audio encoder (transformers' whisper-tiny)

Nothing is downloaded. A missing file raises :class:`MuseTalkError`. So does a state dict that does not fit its
config. So does a Whisper whose width is not the UNet's cross-attention width. The error names what was expected.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

UNET_DIR = Path("models/musetalkV15")
UNET_CONFIG, UNET_WEIGHTS = "musetalk.json", "unet.pth"
VAE_DIR, WHISPER_DIR = Path("models/sd-vae"), Path("models/whisper")


# The released models' configs: MuseTalk 1.5's musetalk.json and sd-vae-ft-mse's config.json. Transformers'
# WhisperConfig defaults are whisper-tiny's. They build models of the real size with random weights, for the benches.
RELEASED_UNET_CONFIG = {
    "act_fn": "silu", "attention_head_dim": 8, "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False, "cross_attention_dim": 384,
    "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"], "downsample_padding": 1,
    "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 8, "layers_per_block": 2, "mid_block_scale_factor": 1,
    "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3}
RELEASED_VAE_CONFIG = {
    "block_out_channels": [128, 256, 512, 512], "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4, "layers_per_block": 2, "latent_channels": 4, "norm_num_groups": 32,
    "sample_size": 256, "act_fn": "silu", "in_channels": 3, "out_channels": 3}


def released_size_models(seed: int = 0):
    """``(unet, vae, whisper_encoder)``: the stock classes at the released models' sizes.

    The weights are random. Each model is in eval mode."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(seed)
    return (UNet2DConditionModel(**RELEASED_UNET_CONFIG).eval(), AutoencoderKL(**RELEASED_VAE_CONFIG).eval(),
            WhisperEncoder(WhisperConfig()).eval())


class MuseTalkError(ValueError):
    """MuseTalk's files are missing or do not fit each other."""


@dataclass(frozen=True)
class MuseTalkFiles:
    """Where the four parts are. See the module docstring."""

    unet_config: Path
    unet_weights: Path
    vae: Path
    whisper: Path

    @classmethod
    def find(cls, root=None, *, unet_config=None, unet_weights=None, vae=None, whisper=None) -> MuseTalkFiles:
        """The files under ``root`` in MuseTalk's layout. Each path can be given instead.

        Every file is checked to exist. Raises :class:`MuseTalkError` for a missing one. It also raises when
        ``root`` is not given and a path is missing."""
        if root is None and None in (unet_config, unet_weights, vae, whisper):
            raise MuseTalkError("MuseTalk's files: give the MuseTalk folder (the one holding models/musetalkV15, "
                                "models/sd-vae and models/whisper) or every path")
        base = Path(root) if root is not None else Path()
        files = cls(Path(unet_config or base / UNET_DIR / UNET_CONFIG),
                    Path(unet_weights or base / UNET_DIR / UNET_WEIGHTS),
                    Path(vae or base / VAE_DIR), Path(whisper or base / WHISPER_DIR))
        for what, path, kind in (("the UNet's config", files.unet_config, "file"),
                                 ("the UNet's weights", files.unet_weights, "file"),
                                 ("the VAE", files.vae, "folder"), ("Whisper", files.whisper, "folder")):
            ok = path.is_file() if kind == "file" else (path / "config.json").is_file()
            if not ok:
                expected = path.name if kind == "file" else f"{path.name}/ with a config.json"
                raise MuseTalkError(f"MuseTalk: {what} is not at {str(path)!r} (expected {expected} as MuseTalk "
                                    f"releases it: {UNET_DIR / UNET_CONFIG}, {UNET_DIR / UNET_WEIGHTS}, {VAE_DIR}/, "
                                    f"{WHISPER_DIR}/)")
        return files


def _mismatch(model: torch.nn.Module, state: dict) -> list[str]:
    """The differences between a model's parameters and a state dict. They are missing keys, unexpected keys and
    other shapes."""
    own = model.state_dict()
    found = [f"{k} missing" for k in own if k not in state]
    found += [f"{k} not in the config's model" for k in state if k not in own]
    found += [f"{k} is {list(state[k].shape)}, the config's {list(own[k].shape)}" for k in own
              if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    return found


def load_unet(config_path, weights_path):
    """The UNet from its config and state dict: a diffusers ``UNet2DConditionModel`` in float32, in eval mode.

    Raises :class:`MuseTalkError` when the config does not build, or the weights do not load or fit."""
    from diffusers import UNet2DConditionModel

    try:
        config = json.loads(Path(config_path).read_text())
        unet = UNet2DConditionModel.from_config(config)
    except (OSError, ValueError, TypeError) as e:
        raise MuseTalkError(f"MuseTalk: the UNet's config {str(config_path)!r} does not build a "
                            f"UNet2DConditionModel ({type(e).__name__}: {e})") from e
    try:
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: any of pickle's errors
        raise MuseTalkError(f"MuseTalk: the UNet's weights {str(weights_path)!r} do not load as a state dict "
                            f"({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise MuseTalkError(f"MuseTalk: {str(weights_path)!r} holds a {type(state).__name__}, not a state dict")
    differ = _mismatch(unet, state)
    if differ:
        raise MuseTalkError(f"MuseTalk: the UNet's weights {str(weights_path)!r} do not fit its config "
                            f"{str(config_path)!r}: {'; '.join(differ[:3])}"
                            f"{f' (and {len(differ) - 3} more)' if len(differ) > 3 else ''}")
    unet.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return unet.eval()


def load_vae(folder):
    """The VAE of a diffusers folder: an ``AutoencoderKL`` in float32, in eval mode.

    Raises :class:`MuseTalkError` when the folder does not load."""
    from diffusers import AutoencoderKL

    try:
        return AutoencoderKL.from_pretrained(folder).eval()
    except (OSError, ValueError, RuntimeError) as e:
        raise MuseTalkError(f"MuseTalk: the VAE folder {str(folder)!r} does not load as an AutoencoderKL "
                            f"({type(e).__name__}: {str(e)[:200]})") from e


def load_whisper(folder, width: int):
    """Whisper's encoder of a transformers folder: a ``WhisperEncoder`` in float32, in eval mode.

    It is checked to be ``width`` wide. That is the UNet's cross-attention width, whisper-tiny's 384. Raises
    :class:`MuseTalkError` when the folder does not load or the width differs."""
    from framegraph.models.audio.whisper import WhisperModelError, encoder_from_transformers, model_kind

    try:
        if model_kind(folder) != "transformers":
            raise WhisperModelError(f"{str(folder)!r} is a {model_kind(folder)} Whisper; MuseTalk's is a "
                                    f"transformers folder (its encoder's every layer is read)")
        encoder = encoder_from_transformers(folder)
    except (WhisperModelError, OSError) as e:
        raise MuseTalkError(f"MuseTalk: the Whisper folder {str(folder)!r} does not load ({e})") from e
    if encoder.config.d_model != width:
        raise MuseTalkError(f"MuseTalk: the Whisper in {str(folder)!r} is {encoder.config.d_model} wide; the UNet "
                            f"attends to {width}-wide audio features (whisper-tiny's: another Whisper size does "
                            f"not fit this UNet)")
    return encoder


__all__ = ["MuseTalkError", "MuseTalkFiles", "RELEASED_UNET_CONFIG", "RELEASED_VAE_CONFIG", "load_unet", "load_vae",
           "load_whisper", "released_size_models", "UNET_DIR", "UNET_CONFIG", "UNET_WEIGHTS", "VAE_DIR", "WHISPER_DIR"]
