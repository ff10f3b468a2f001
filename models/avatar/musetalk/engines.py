"""MuseTalk's engines (:mod:`framegraph.models.runtime`): what its stages call per frame, on a runtime.

    engines = runtime.engines("avatar-musetalk", "torch", avatar, settings)
    engines.step(latents [B, 8, h, w], context [B, N, D]) → uint8 [B, S, S, 3]   (on settings.device)
    engines.whisper                                                             (the audio context's encoder)

The torch engines: the UNet and the VAE in float32 on a CPU, float16 on a GPU (as MuseTalk's realtime path runs
them); Whisper's encoder in float32 on the CPU, beside the audio. The models are loaded once per bundle, device and
precision, and shared by its sessions.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from .files import load_unet, load_vae, load_whisper
from .hearing import EveryLayerEngine
from .step import MuseTalkStep

_LOCK = threading.Lock()


@dataclass
class MuseTalkEngines:
    step: MuseTalkStep
    whisper: EveryLayerEngine
    dtype: torch.dtype


def _models(avatar, device: str, dtype: torch.dtype) -> MuseTalkEngines:
    """The bundle's models on ``device`` in ``dtype``, loaded once (kept on the bundle, shared by its sessions)."""
    key = (str(torch.device(device)), dtype)
    with _LOCK:
        cache = avatar.engines_cache
        if key not in cache:
            f = avatar.files
            unet = load_unet(f.unet_config, f.unet_weights)
            whisper = EveryLayerEngine(load_whisper(f.whisper, unet.config.cross_attention_dim))
            step = MuseTalkStep(unet, load_vae(f.vae)).to(device, dtype).eval().requires_grad_(False)
            cache[key] = MuseTalkEngines(step, whisper, dtype)
        return cache[key]


def torch_engines(avatar, settings) -> MuseTalkEngines:
    """The torch runtime: float16 on CUDA, float32 elsewhere."""
    device = torch.device(settings.device)
    return _models(avatar, settings.device, torch.float16 if device.type == "cuda" else torch.float32)


__all__ = ["MuseTalkEngines", "torch_engines"]
