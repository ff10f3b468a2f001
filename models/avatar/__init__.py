"""The talking avatar: bundles of three kinds, the stream graph that runs any, their training and evaluation.

    from framegraph.models.avatar import load_avatar, build_avatar_graph   # each name imported when first used

- :mod:`.base`: the :class:`AvatarBundle` protocol every kind implements, a run's :class:`RunSettings`,
  the audio side every graph starts with (``AudioFeatures`` → :class:`StateOverride`).
- :mod:`.bundle`: :func:`load_avatar` (any kind, by ``avatar.json``'s ``kind``).
- :mod:`.graph`: :func:`build_avatar_graph` (audio → the bundle's stages → sink), :func:`render_avatar_graph`.
- :mod:`.portrait`: a still portrait talks — ``Denoiser → VAEDecode → Composite``, its training, its ONNX export
  and engines. :mod:`.int8`: that export's int8 files, calibrated on the graph. :mod:`.refine`: its decoder
  trained further.
- :mod:`.video`: a person's own video talks — their frames looped, the mouth redrawn (``MouthShape, VideoLoop →
  MouthRegion``), its training from one video.
- :mod:`.musetalk`: MuseTalk 1.5 from the user's own files — a person prepared once, the audio context live, the
  loop frame's face redrawn (``MuseTalkHearing, VideoLoop → MuseTalkFace``).
- :mod:`.clips`: a person's talking video → training clips (what the trained kinds learn from).
- :mod:`.eval`: measuring an avatar — against synthetic ground truth, and against a person's real frames.
"""
from __future__ import annotations

from framegraph.stream.lazy import lazy_index

_INDEX = {
    **dict.fromkeys(("AVATAR_JSON", "STATE_MODES", "AvatarBundle", "AvatarError", "AvatarStages", "RunSettings",
                     "StateOverride", "onnx_dir"), ".base"),
    **dict.fromkeys(("KINDS", "load_avatar"), ".bundle"),
    **dict.fromkeys(("LIVE_MAX_LAG_MS", "AvatarGraph", "build_avatar_graph", "render_avatar_graph", "warm_avatar"),
                    ".graph"),
    **dict.fromkeys(("SMALL_VAE", "TINY_VAE", "PortraitAvatar", "random_avatar", "save_avatar"), ".portrait.bundle"),
    **dict.fromkeys(("VideoAvatar", "random_video_avatar", "save_video_avatar"), ".video.bundle"),
}
__all__ = sorted(_INDEX)
__getattr__, __dir__ = lazy_index(__name__, _INDEX)
