"""The avatar bundles of this process: the catalogue, and the bundles loaded once and shared.

The catalogue is the avatar folder, the names in it and the default. The server's sessions share the loaded bundles. So
do the demo, the Pipecat avatar and the benches.

    from framegraph.apps.bundles import available_avatars, load_bundle, load_bundle_at
    available_avatars()                       # the bundle names in $FRAMEGRAPH_AVATARS (else assets/avatars)
    avatar = load_bundle("astronaut")         # loads (≈ 2-3 s on a CPU) the first time, then cached
    avatar = load_bundle_at("out/me")         # any folder

Each caller builds its own graph, with its own stream state, on the shared weights. The function
:func:`set_bundle_limit` sets a limit. The least recently used bundles beyond it are dropped from the cache.
Graphs still running on one keep it alive until they end. The catalogue reads folders only. The models load on
first use.
"""
from __future__ import annotations

import collections
import os
import threading
import time

from framegraph import assets
from framegraph.models.avatar.base import AVATAR_JSON

DEFAULT_AVATAR = "astronaut"  # the shipped bundle's name, first among the avatars when present

_cache: collections.OrderedDict[str, object] = collections.OrderedDict()  # path -> bundle, least recent first
_bundle_limit = 0  # 0: keep every bundle loaded
_load_s: dict[str, float] = {}  # path -> seconds its last load took
_lock = threading.Lock()


def avatars_dir() -> str:
    """The avatar folder: ``$FRAMEGRAPH_AVATARS``, else the shipped ``assets/avatars``."""
    return os.environ.get("FRAMEGRAPH_AVATARS") or str(assets.path("avatars"))


def available_avatars(root: str | None = None) -> list[str]:
    """Bundle names in the avatar folder ``root``, the default first. A bundle is a folder with an ``avatar.json``."""
    root = root or avatars_dir()
    if not os.path.isdir(root):
        return []
    names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, AVATAR_JSON)))
    return sorted(names, key=lambda n: n != DEFAULT_AVATAR)


def default_avatar(root: str | None = None) -> str:
    """The bundle a session gets when it names none."""
    names = available_avatars(root)
    return names[0] if names else DEFAULT_AVATAR


def load_bundle(name: str, root: str | None = None):
    """The loaded bundle ``name`` in the avatar folder, as :func:`load_bundle_at` loads it.

    ``root`` is the folder; the default is :func:`avatars_dir`."""
    return load_bundle_at(os.path.join(root or avatars_dir(), name))


def load_bundle_at(path) -> object:
    """The loaded avatar bundle at folder ``path``, of either kind, and the voice detector its graphs use.

    The bundle is cached by its absolute path. The detector is one onnxruntime session per process. Made here, it
    does not delay the first graph's first frame. Raises :class:`~framegraph.models.avatar.AvatarError` naming the
    missing or bad file."""
    from framegraph.models.audio.vad import SileroVAD  # the models: loaded on first use
    from framegraph.models.avatar import PortraitAvatar, RunSettings, load_avatar, warm_avatar
    from framegraph.models.runtime import default_device, default_runtime

    path = os.path.abspath(os.fspath(path))
    with _lock:
        if path not in _cache:
            started = time.monotonic()
            avatar = load_avatar(path)
            if isinstance(avatar, PortraitAvatar):
                avatar.reference_latent()  # computed once, here (not by a session's first frame)
            if avatar.vad:
                SileroVAD()
            # the sessions' first frames then cost what steady ones do (compiled: built and cached on disk)
            warm_avatar(avatar, RunSettings(runtime=default_runtime(default_device()), device=default_device()))
            _cache[path] = avatar
            _load_s[path] = time.monotonic() - started
        _cache.move_to_end(path)
        while _bundle_limit and len(_cache) > _bundle_limit:
            _cache.popitem(last=False)
        return _cache[path]


def set_bundle_limit(n: int) -> None:
    """Keep at most ``n`` bundles loaded. 0 means no limit. A cluster replica sets it."""
    global _bundle_limit
    _bundle_limit = n


def loaded_bundles() -> list[dict]:
    """The bundles loaded now, least recently used first: ``{"name", "load_s"}``."""
    with _lock:
        return [{"name": os.path.basename(p), "load_s": round(_load_s[p], 3)} for p in _cache]
