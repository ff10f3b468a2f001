"""Our own models' save and load, in diffusers' folder format, without importing diffusers.

    class AudioEncoder(PretrainedModel):
        @register_to_config
        def __init__(self, channels: int = 128, ...): ...

    model.save_pretrained("bundle/audio")   # config.json + diffusion_pytorch_model.safetensors
    AudioEncoder.from_pretrained("bundle/audio")

The folder is what diffusers' ``ModelMixin`` and ``ConfigMixin`` write and read.
``config.json`` holds the ``__init__`` arguments and ``_class_name``. The weights are one safetensors file.
So bundles written by either load with either.
Importing diffusers is slow, since it imports ``torch._dynamo``.
Our models need only this file format, so they pay nothing for it.
The stock diffusers classes still come from diffusers, in :mod:`framegraph.models.generate`.
Those are Wan, SANA-Video and their VAE.

``register_to_config`` records every ``__init__`` argument, defaults included, in ``model.config``.
That is a read-only mapping with attribute access, such as ``model.config.width``.
``model.register_to_config(k=v)`` adds or changes entries afterwards. They are saved with the model.
"""
from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

import torch
from torch import nn

from framegraph.stream.files import write_json, written_whole

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"


class FrozenConfig(dict):
    """A model's configuration: a dict whose entries read as attributes and cannot be changed in place."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no entry {name!r}") from None

    def _frozen(self, *args, **kwargs):
        raise TypeError("a model's config is read-only; use model.register_to_config(key=value)")

    def __reduce__(self):  # copies and pickles build a new one from its entries
        return type(self), (dict(self),)

    __setitem__ = __delitem__ = __setattr__ = update = pop = setdefault = clear = _frozen


def register_to_config(init):
    """Decorator for a :class:`PretrainedModel`'s ``__init__``.

    Its arguments, defaults included, become ``self.config`` before the body runs.
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = {k: v for k, v in bound.arguments.items() if k != "self"}
        nn.Module.__setattr__(self, "_config", FrozenConfig(values))  # before nn.Module.__init__ runs
        init(self, *args, **kwargs)
        nn.Module.__setattr__(self, "_config", FrozenConfig(values))  # nn.Module.__init__ leaves it alone

    wrapper._registers_config = True
    return wrapper


def _to_json(value):
    if isinstance(value, tuple | list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


class PretrainedModel(nn.Module):
    """``nn.Module`` with a recorded config and diffusers-format ``save_pretrained`` and ``from_pretrained``."""

    @property
    def config(self) -> FrozenConfig:
        return self._config

    def register_to_config(self, **values) -> None:
        """Add or change config entries. :meth:`save_pretrained` keeps them."""
        nn.Module.__setattr__(self, "_config", FrozenConfig({**self._config, **values}))

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @classmethod
    def from_config(cls, config: dict):
        """A new, randomly initialised model with ``config``'s ``__init__`` arguments. Other keys are ignored."""
        params = inspect.signature(cls.__init__).parameters
        return cls(**{k: v for k, v in dict(config).items() if k in params and k != "self"})

    def save_pretrained(self, folder) -> None:
        """Write ``folder/config.json`` and ``folder/diffusion_pytorch_model.safetensors``.

        Each is written whole: a crash leaves the previous file, never half of one.
        """
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"_class_name": type(self).__name__, **_to_json(dict(self.config))}
        write_json(folder / CONFIG_NAME, config, sort_keys=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        with written_whole(folder / WEIGHTS_NAME) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, folder, low_cpu_mem_usage: bool | None = None, torch_dtype: torch.dtype | None = None):
        """Load a folder written by :meth:`save_pretrained`, or by diffusers' ``ModelMixin``.

        Config keys that are not ``__init__`` arguments are ignored, such as ``_class_name`` and ``_diffusers_version``.
        A weight file whose tensors do not match the model is an error naming the file.
        Tensors may be missing, unexpected or mis-shaped.
        ``low_cpu_mem_usage`` is accepted for diffusers' signature and has no effect.
        """
        from safetensors.torch import load_file

        folder = Path(folder)
        config_path, weights_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
        for path in (config_path, weights_path):
            if not path.is_file():
                raise FileNotFoundError(f"{cls.__name__}.from_pretrained: {path} is missing")
        config = json.loads(config_path.read_text())
        model = cls.from_config(config)
        known = set(model.config)
        extra = {k: v for k, v in config.items() if not k.startswith("_") and k not in known}
        if extra:  # entries added with register_to_config after __init__
            model.register_to_config(**extra)
        state = load_file(str(weights_path))
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"{cls.__name__}.from_pretrained: {weights_path} does not match the model in "
                             f"{config_path}: {exc}") from None
        if torch_dtype is not None:
            model = model.to(torch_dtype)
        return model.eval()


__all__ = ["PretrainedModel", "register_to_config", "FrozenConfig", "CONFIG_NAME", "WEIGHTS_NAME"]
