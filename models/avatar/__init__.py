"""The talking avatar put together: the bundle folder, the stream graph, training and evaluation.

    from framegraph.models.avatar import load_avatar, build_avatar_graph, train_avatar, evaluate_avatar

- :mod:`.bundle`: ``Avatar``, ``load_avatar`` / ``save_avatar`` (``DIR/{vae,dit,audio}/`` + ``avatar.json``).
- :mod:`.graph`: ``build_avatar_graph`` (audio → AudioFeatures → Denoiser → VAEDecode → Composite → sink).
- :mod:`.data`: clips → face-region latents, audio features and state labels (cached once).
- :mod:`.video`: ``prepare_video``: a person's own talking video → a clips folder ``train_avatar`` accepts.
  :mod:`.video_io`: its reading (frame by frame, turned upright) and the clips' writing (PyAV).
- :mod:`.train`: ``train_avatar`` (VAE, latents, flow matching, distillation, rollout training).
- :mod:`.refine`: ``refine_decoder`` (a trained bundle's VAE decoder trained further, with the reference warp).
- :mod:`.evaluate`: mouth-openness estimator and ``evaluate_avatar`` (correlation, closed lips, identity SSIM).
"""
from . import data, evaluate, refine, train, video
from .bundle import AVATAR_JSON, SMALL_VAE, TINY_VAE, Avatar, AvatarError, load_avatar, random_avatar, save_avatar
from .graph import STATE_MODES, AvatarGraph, StateOverride, build_avatar_graph, render_avatar_graph

__all__ = ["AVATAR_JSON", "Avatar", "AvatarError", "SMALL_VAE", "TINY_VAE", "load_avatar", "random_avatar",
           "save_avatar", "STATE_MODES", "AvatarGraph", "StateOverride", "build_avatar_graph", "render_avatar_graph"]


def __getattr__(name):  # training / eval pull in more; import them on first use
    if name in ("train_avatar", "AvatarTrainResult", "TrainConfig"):
        return getattr(train, name)
    if name in ("evaluate_avatar", "mouth_openness", "generate_clip"):
        return getattr(evaluate, name)
    if name in ("ClipData", "prepare_clips"):
        return getattr(data, name)
    if name == "refine_decoder":
        return refine.refine_decoder
    if name in ("prepare_video", "PreparedVideo"):
        return getattr(video, name)
    raise AttributeError(name)
