"""The talking avatar: bundles of three kinds, the stream graph that runs any, their training and evaluation.

    from framegraph.models.avatar import load_avatar, build_avatar_graph   # each name imported when first used

- :mod:`.base`: the :class:`AvatarBundle` protocol every kind implements. It holds a run's
  :class:`RunSettings`. It holds the audio side every graph starts with, ``AudioFeatures`` →
  :class:`StateOverride`.
- :mod:`.bundle`: :func:`load_avatar`. It loads any kind, by ``avatar.json``'s ``kind``.
- :mod:`.graph`: :func:`build_avatar_graph`, audio → the bundle's stages → sink. Also
  :func:`render_avatar_graph`.
- :mod:`.portrait`: a still portrait talks, as ``Denoiser → VAEDecode → Composite``. It holds the training,
  the ONNX export and the engines.
- :mod:`.int8`: the portrait export's int8 files, calibrated on the graph.
- :mod:`.refine`: the portrait's decoder, trained further.
- :mod:`.video`: a person's own video talks. Their frames are looped and the mouth redrawn, as
  ``MouthShape, VideoLoop → MouthRegion``. It holds the training from one video.
- :mod:`.musetalk`: MuseTalk 1.5 from the user's own files. A person is prepared once. The audio context runs
  live. The loop frame's face is redrawn, as ``MuseTalkHearing, VideoLoop → MuseTalkFace``.
- :mod:`.clips`: a person's talking video → training clips. The trained kinds learn from these.
- :mod:`.eval`: measuring an avatar, against synthetic ground truth and against a person's real frames.
"""
from __future__ import annotations

from framegraph.stream.lazy import lazy_index

_INDEX = {
    **dict.fromkeys(("AVATAR_JSON", "LIVE_MAX_LAG_MS", "STATE_MODES", "AvatarBundle", "AvatarError", "AvatarStages",
                     "RunSettings", "StateOverride", "onnx_dir"), ".base"),
    **dict.fromkeys(("KINDS", "load_avatar"), ".bundle"),
    **dict.fromkeys(("AvatarGraph", "build_avatar_graph", "render_avatar_graph", "warm_avatar"), ".graph"),
    **dict.fromkeys(("SMALL_VAE", "TINY_VAE", "PortraitAvatar", "random_avatar", "save_avatar"), ".portrait.bundle"),
    **dict.fromkeys(("VideoAvatar", "random_video_avatar", "save_video_avatar"), ".video.bundle"),
}
__all__ = sorted(_INDEX)
__getattr__, __dir__ = lazy_index(__name__, _INDEX)
