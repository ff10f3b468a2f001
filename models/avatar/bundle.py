"""Loading an avatar bundle of any kind.

:func:`load_avatar` reads ``avatar.json``'s ``kind``. It hands the folder to that kind's loader.

    DIR/avatar.json     ``kind``: "portrait" (the default: :mod:`.portrait`), "video" (:mod:`.video`) or "musetalk"
                        (:mod:`framegraph.models.avatar.musetalk`), and
                        that kind's settings; the rest of the folder is the kind's own.
"""
from __future__ import annotations

from pathlib import Path

from framegraph.models.avatar.musetalk.bundle import MuseTalkAvatar, load_musetalk_avatar

from .base import AVATAR_JSON, AvatarBundle, AvatarError, load_json
from .portrait.bundle import PortraitAvatar, load_portrait_avatar
from .video.bundle import VideoAvatar, load_video_avatar

KINDS = {PortraitAvatar.kind: load_portrait_avatar, VideoAvatar.kind: load_video_avatar,
         MuseTalkAvatar.kind: load_musetalk_avatar}
KIND_MEANING = {PortraitAvatar.kind: "a still portrait, DiT",
                VideoAvatar.kind: "a person's own video frames with a generated mouth",
                MuseTalkAvatar.kind: "a person's video frames redrawn by MuseTalk 1.5 from the user's files"}


def load_avatar(root) -> AvatarBundle:
    """Load an avatar bundle folder of any kind.

    The kind is ``avatar.json``'s ``kind``, by default ``"portrait"``. :class:`~.base.AvatarError` names the
    missing or bad file."""
    root = Path(root)
    if not root.is_dir():
        raise AvatarError(f"avatar bundle {str(root)!r} does not exist (a folder made by `framegraph avatar train`)")
    cfg = load_json(root / AVATAR_JSON)
    kind = cfg.get("kind", PortraitAvatar.kind)
    if kind not in KINDS:
        known = " or ".join(f"{k!r} ({m})" for k, m in KIND_MEANING.items())
        raise AvatarError(f"avatar bundle {str(root)!r}: {AVATAR_JSON}: kind {kind!r} is not one of {known}")
    return KINDS[kind](root, cfg)


__all__ = ["KINDS", "load_avatar"]
