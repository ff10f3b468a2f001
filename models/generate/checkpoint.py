"""Video models from local disk only. Nothing is ever downloaded.

Two layouts:

- a **diffusers folder**, as ``save_pretrained`` and the hub's ``*-Diffusers`` repositories hold it::

      model_index.json          the pipeline's parts (its "_class_name": WanPipeline or SanaVideoPipeline)
      transformer/              config.json + diffusion_pytorch_model*.safetensors  (WanTransformer3DModel
                                or SanaVideoTransformer3DModel)
      vae/                      config.json + weights (AutoencoderKLWan)
      scheduler/                (read by diffusers' pipelines; framegraph samples with its own few-step schedule)
      text_encoder/ tokenizer/  optional: without them, pass precomputed prompt embeddings

- a **single-file causal student** in the original Wan format: ``.safetensors``, ``.pt`` or ``.pth``. These are the
  state dicts Self-Forcing, CausVid and LongLive publish. They may be nested under ``generator_ema`` / ``generator`` /
  ``model`` / ``state_dict``, or prefixed ``model.``. Diffusers' own Wan single-file key mapping converts them. The
  result is a ``WanTransformer3DModel`` built from ``BASE/transformer/config.json``. The VAE and text encoder come
  from ``BASE``. That is a diffusers folder of the same base model, e.g. ``Wan2.1-T2V-1.3B-Diffusers``.

:func:`load_generate_model` checks every part. It says what is missing or wrong and how to fix it.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file

from .family import FAMILIES, Family

__all__ = ["GenerateModel", "cast_keeping_fp32", "detect_family", "load_generate_model", "read_state_dict"]

CLASS_FAMILY = {"WanTransformer3DModel": "wan", "SanaVideoTransformer3DModel": "sana",
                "WanPipeline": "wan", "SanaVideoPipeline": "sana"}
PROMPT_TOKENS = {"wan": 512, "sana": 300}  # text tokens each family was trained with
FPS = {"wan": 16.0, "sana": 16.0}  # the frame rate both families' released checkpoints generate at
NESTED = ("generator_ema", "generator", "model", "state_dict", "module")


@dataclass
class GenerateModel:
    """What :func:`load_generate_model` loaded.

    It holds the family, the transformer and the VAE.
    ``text_folder`` says where the text encoder would be.
    It also holds the prompt length and the native frame rate.
    """

    family: Family
    transformer: torch.nn.Module
    vae: AutoencoderKLWan
    text_folder: str | None
    prompt_tokens: int
    fps: float
    source: str

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Pixels → latent ``(h, w)``. Raises for a size the VAE and the transformer's patches cannot tile."""
        s = self.vae.config.scale_factor_spatial
        p_h, p_w = tuple(self.transformer.config.patch_size)[1:]
        step_h, step_w = s * p_h, s * p_w
        if height <= 0 or width <= 0 or height % step_h or width % step_w:
            raise ValueError(
                f"size {height}x{width} (HxW): height must be a positive multiple of {step_h} and width of {step_w} "
                f"(the VAE's {s}x downscale times the transformer's {p_h}x{p_w} patches), e.g. "
                f"{max(step_h, height // step_h * step_h)}x{max(step_w, width // step_w * step_w)}"
            )
        grid = max(height // step_h, width // step_w)
        if grid > self.transformer.config.rope_max_seq_len:
            raise ValueError(f"size {height}x{width}: {grid} patches on a side exceed the model's rotary table "
                             f"(rope_max_seq_len={self.transformer.config.rope_max_seq_len}); use a smaller --size")
        return height // s, width // s


def _read_json(path: str, what: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: missing; {what}")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc}); {what}") from None


def detect_family(folder: str) -> str:
    """``"wan"`` or ``"sana"`` from a diffusers folder's transformer config or its model_index.json."""
    for path in (os.path.join(folder, "transformer", "config.json"), os.path.join(folder, "model_index.json")):
        if os.path.isfile(path):
            name = _read_json(path, "").get("_class_name")
            if name in CLASS_FAMILY:
                return CLASS_FAMILY[name]
            raise ValueError(f"{path}: _class_name {name!r} is not a family framegraph streams; expected one of "
                             f"{sorted(CLASS_FAMILY)} (Wan 2.1 or SANA-Video)")
    raise FileNotFoundError(f"{folder}: no transformer/config.json or model_index.json; expected a diffusers folder "
                            f"(model_index.json, transformer/, vae/, scheduler/)")


def _check_folder(folder: str) -> None:
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such folder; expected a diffusers model folder or a single-file "
                                f"checkpoint (.safetensors / .pt / .pth) with --base")
    _read_json(os.path.join(folder, "model_index.json"),
               "a diffusers folder starts with model_index.json (download the whole *-Diffusers repository)")
    for part in ("transformer", "vae"):
        _read_json(os.path.join(folder, part, "config.json"),
                   f"the folder needs its {part}/ part (config.json + weights) from the same checkpoint")


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """A single-file checkpoint's tensors, unwrapped from the usual nestings; see the module docs."""
    try:
        if path.endswith(".safetensors"):
            sd = load_file(path)
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which and why
        raise ValueError(f"{path}: cannot be read as a checkpoint ({type(exc).__name__}: {exc}); expected a "
                         f".safetensors file or a torch .pt/.pth state dict") from None
    while isinstance(sd, dict) and not any(isinstance(v, torch.Tensor) for v in sd.values()):
        key = next((k for k in NESTED if isinstance(sd.get(k), dict)), None)
        if key is None:
            raise ValueError(f"{path}: holds {sorted(sd)[:8]} but no tensors; expected a state dict (or one nested "
                             f"under one of {list(NESTED)})")
        sd = sd[key]
    if not isinstance(sd, dict) or not sd:
        raise ValueError(f"{path}: holds no state dict of tensors")
    if all(k.startswith("model.") and not k.startswith("model.diffusion_model.") for k in sd):
        sd = {k[len("model."):]: v for k, v in sd.items()}
    return sd


def _load_weights(cls, part: str, state: dict[str, torch.Tensor] | None, source: str, dtype: torch.dtype):
    """``cls`` built from ``part/config.json`` with ``state``. None means ``part``'s own safetensors shards.

    It is checked key by key and shape by shape.
    A mismatch is a clear error, never a silently random layer.
    """
    model = cls.from_config(cls.load_config(part))
    if state is None:
        shards = sorted(glob.glob(os.path.join(part, "*.safetensors")))
        if not shards:
            raise FileNotFoundError(f"{part}: no *.safetensors weights next to config.json; copy the weights of "
                                    f"this part (diffusion_pytorch_model*.safetensors) from the checkpoint")
        state = {}
        for shard in shards:
            try:
                state.update(load_file(shard))
            except Exception as exc:  # safetensors' own error types: a truncated or foreign file
                raise ValueError(f"{shard}: not a readable safetensors file ({exc}); download it again") from None
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k} {list(state[k].shape)} (expected {list(expected[k].shape)})"
             for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(
            f"{source} does not match {part}/config.json: {len(missing)} missing keys {missing[:3]}, {len(unexpected)} "
            f"unexpected {unexpected[:3]}, {len(wrong)} of another shape {wrong[:3]}; the weights and the config come "
            f"from different models (e.g. 1.3B vs 14B) — use the config of the model the weights were trained from"
        )
    model.load_state_dict(state, strict=True)
    return cast_keeping_fp32(model, dtype)


def cast_keeping_fp32(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast ``model``'s floating parameters and buffers to ``dtype``, as diffusers'
    ``from_pretrained(torch_dtype=...)`` does.

    The modules its class keeps in float32 are left out: ``_keep_in_fp32_modules``.
    For Wan those are the norms, time embedder, modulation tables and rotary table.
    """
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and not keep.intersection(name.split(".")):
            tensor.data = tensor.data.to(dtype)
    return model


def _single_file_transformer(path: str, base: str | None, dtype: torch.dtype) -> torch.nn.Module:
    from diffusers import WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    if base is None:
        raise ValueError(f"{path} is a single-file checkpoint; pass --base DIR, a diffusers folder of its base model "
                         f"(e.g. Wan2.1-T2V-1.3B-Diffusers) for the transformer config, the VAE and the text encoder")
    config_path = os.path.join(base, "transformer", "config.json")
    config = _read_json(config_path, "--base must be a diffusers folder with transformer/config.json")
    if CLASS_FAMILY.get(config.get("_class_name")) != "wan":
        raise ValueError(f"{config_path}: _class_name {config.get('_class_name')!r}; single-file checkpoints are "
                         f"loaded for the Wan family only (a WanTransformer3DModel base)")
    sd = read_state_dict(path)
    if "blocks.0.self_attn.q.weight" not in sd and "model.diffusion_model.blocks.0.self_attn.q.weight" not in sd:
        raise ValueError(f"{path}: not an original-format Wan transformer (no 'blocks.0.self_attn.q.weight' among "
                         f"{len(sd)} keys, e.g. {sorted(sd)[:3]}); expected a Wan 2.1 causal student's state dict")
    converted = convert_wan_transformer_to_diffusers(dict(sd))
    return _load_weights(WanTransformer3DModel, os.path.join(base, "transformer"), converted, path, dtype)


def load_generate_model(model: str, *, family: str | None = None, base: str | None = None,
                        device: str = "cpu", dtype: torch.dtype = torch.float32) -> GenerateModel:
    """Load a diffusers folder, or a single-file Wan causal student with ``base``; see the module docs.

    Args:
        model: the folder or the checkpoint file.
        family: ``"wan" | "sana"``. None: from the folder's config.
        base: for single files, the diffusers folder supplying config, VAE and text encoder. For folders it is
            optional. It supplies parts the model folder lacks, such as its text encoder.
        device / dtype: where and in what precision the transformer and VAE run.
    """
    single = os.path.isfile(model)
    folder = base if single else model
    if folder is None:
        raise ValueError(f"{model}: a single file needs --base DIR (a diffusers folder of its base model)")
    _check_folder(folder)
    found = detect_family(folder)
    if family is not None and family != found:
        raise ValueError(f"{folder}: holds a {found!r} model but --family {family} was given; drop --family (it is "
                         f"read from the folder) or point --model at a {family} folder")
    fam = FAMILIES[found]
    if single:
        transformer = _single_file_transformer(model, base, dtype)
    else:
        part = os.path.join(folder, "transformer")
        transformer = _load_weights(fam.transformer_class, part, None, part, dtype)
    fam.check(transformer, os.path.join(folder, "transformer", "config.json"))
    vae_config = _read_json(os.path.join(folder, "vae", "config.json"), "")
    if vae_config.get("_class_name") != fam.vae_class.__name__:
        raise ValueError(f"{folder}/vae/config.json: a {vae_config.get('_class_name')}; the {found} family streams "
                         f"its video through the causal {fam.vae_class.__name__}")
    vae = _load_weights(fam.vae_class, os.path.join(folder, "vae"), None, os.path.join(folder, "vae"), dtype)
    if vae.config.z_dim != transformer.config.in_channels:
        raise ValueError(f"{folder}: the VAE's z_dim={vae.config.z_dim} differs from the transformer's "
                         f"in_channels={transformer.config.in_channels}; the vae/ belongs to another model")
    text_folder = next((f for f in (model if not single else None, base)
                        if f and os.path.isdir(os.path.join(f, "text_encoder"))), None)
    return GenerateModel(fam, transformer.to(device).eval().requires_grad_(False),
                         vae.to(device).eval().requires_grad_(False), text_folder, PROMPT_TOKENS[found], FPS[found],
                         model)


def load_folder_vae(folder: str):
    """The ``AutoencoderKLWan`` of a diffusers model folder, float32 on the CPU.

    It reads ``folder/vae``: config.json + safetensors.
    It is loaded and checked as ``framegraph generate`` loads it.
    """
    part = os.path.join(folder, "vae")
    config = _read_json(os.path.join(part, "config.json"), "expected a diffusers video model folder with vae/ "
                                                           "(config.json + weights); for a single-file student, "
                                                           "pass its --base folder")
    if config.get("_class_name") != AutoencoderKLWan.__name__:
        raise ValueError(f"{part}/config.json: a {config.get('_class_name')}; the ONNX export is for the causal "
                         f"AutoencoderKLWan (Wan 2.1 / 2.2, SANA-Video)")
    return _load_weights(AutoencoderKLWan, part, None, part, torch.float32).eval().requires_grad_(False)
