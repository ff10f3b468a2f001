"""The ``avatar`` pipeline: the client's microphone drives a talking portrait.

    mic (PushAudioSource) ─▶ AudioFeatures ─▶ StateOverride ─▶ Denoiser ─▶ VAEDecode ─▶ Composite ─▶ encode ─▶ send
        └──────────────────────────────── audio echoed back, same pts ─────────────────────────────────────▲

(a video avatar bundle, kind ``"video"``: MouthShape, VideoLoop → MouthRegion in place of the three
generating stages; ``models.avatar.build_avatar_graph`` picks by the bundle's kind.)

The picture is an avatar bundle (``models.avatar``) from the server's avatar folder :data:`AVATARS_DIR`
(``$FRAMEGRAPH_AVATARS``, default ``assets/avatars``): ``assets/avatars/<portrait>/`` — start option
``portrait`` (a name, never a client path; default ``astronaut``, else the first bundle there). Video
size and fps are the bundle's (its portrait's size; the client may only ask for exactly those).

Options (besides the common video ones): ``portrait``, ``steps`` (sampler steps 1–4, default the
bundle's), ``state`` (initial state), ``backend`` (``torch`` | ``compiled`` — Inductor and CUDA graphs, the
default on CUDA — | ``onnx``: the model stages on ONNX Runtime
from the bundle's ``onnx/`` export, made by ``framegraph export``; ``onnx-int8``: the same, the models that
export keeps in int8 — ``framegraph export --int8`` — running int8; a missing or stale export refuses the
session with a clear message). Live ``config``: ``state`` ∈ ``auto`` (Silero VAD decides speaking
/ idle) | ``speaking`` | ``listening`` | ``idle`` (forced). ``interrupt`` (barge-in) is the session's
``graph.reset()``: the audio context, the denoiser's stream state and the decoder cache start afresh
and the next frame is flagged ``INTERRUPTED``.

Importing this module registers the pipeline only when at least one bundle is in :data:`AVATARS_DIR`
(otherwise it raises ``ImportError`` saying how to make one, so servers and the demo report the
avatar as unavailable and fall back).
"""
from __future__ import annotations

import collections
import os
import threading
import time

import torch

from framegraph import assets
from framegraph.stream import Clock, Graph
from framegraph.stream.media import PushAudioSource

from .pipelines import (
    AUDIO_CHUNK,
    PCM16_FORMAT,
    Options,
    Pipeline,
    add_video_out,
    register,
    video_options,
)
from .protocol import ErrorCode, ProtocolError

AVATARS_DIR = os.environ.get("FRAMEGRAPH_AVATARS") or str(assets.path("avatars"))
DEFAULT_AVATAR = "astronaut"
STATES = ("auto", "speaking", "listening", "idle")

_cache: collections.OrderedDict[str, object] = collections.OrderedDict()  # path -> bundle, least recent first
_bundle_limit = 0  # 0: keep every bundle loaded
_load_s: dict[str, float] = {}  # path -> seconds its last load took
_lock = threading.Lock()


def available_avatars(root: str | None = None) -> list[str]:
    """Bundle names (folders with an ``avatar.json``) in the avatar folder, the default first."""
    root = root or AVATARS_DIR
    if not os.path.isdir(root):
        return []
    names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "avatar.json")))
    return sorted(names, key=lambda n: n != DEFAULT_AVATAR)


def default_avatar(root: str | None = None) -> str:
    """The bundle a session gets when it names no ``portrait``."""
    names = available_avatars(root)
    return names[0] if names else DEFAULT_AVATAR


def load_bundle(name: str, root: str | None = None):
    """The loaded bundle ``name`` (cached: sessions share the weights, each has its own stream state),
    and the voice detector its sessions use (one onnxruntime session per process: importing onnxruntime and
    creating it takes ~0.2 s, which would otherwise delay the first session's first frame).
    With a limit (:func:`set_bundle_limit`) the least recently used bundles beyond it are dropped from
    the cache (sessions still running on one keep it alive until they end)."""
    from framegraph.models.audio.vad import SileroVAD
    from framegraph.models.avatar import PortraitAvatar, load_avatar, warm_avatar
    from framegraph.models.runtime import default_runtime

    path = os.path.join(root or AVATARS_DIR, name)
    with _lock:
        if path not in _cache:
            started = time.monotonic()
            avatar = load_avatar(path)
            if isinstance(avatar, PortraitAvatar):
                avatar.reference_latent()  # computed once, here (not by a session's first frame)
            if avatar.vad:
                SileroVAD()
            warm_avatar(avatar, device=_device(), runtime=default_runtime(_device()))  # compiled, caches filled
            _cache[path] = avatar
            _load_s[path] = time.monotonic() - started
        _cache.move_to_end(path)
        while _bundle_limit and len(_cache) > _bundle_limit:
            _cache.popitem(last=False)
        return _cache[path]


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def set_bundle_limit(n: int) -> None:
    """Keep at most ``n`` bundles loaded (0: no limit); a cluster replica sets it."""
    global _bundle_limit
    _bundle_limit = n


def loaded_bundles() -> list[dict]:
    """The bundles loaded now, least recently used first: ``{"name", "load_s"}``."""
    with _lock:
        return [{"name": os.path.basename(p), "load_s": round(_load_s[p], 3)} for p in _cache]


def build_avatar_pipeline(opts: Options, root: str | None = None) -> Pipeline:
    from framegraph.models.avatar import AvatarError, build_avatar_graph
    from framegraph.models.onnx import ExportError
    from framegraph.models.runtime import RUNTIMES, default_runtime

    names = available_avatars(root)
    name = opts._get("portrait")
    if name is None:
        name = default_avatar(root)
    if not isinstance(name, str) or name not in names:
        raise opts._bad("portrait", name, f"one of the server's avatars {names}")
    try:
        avatar = load_bundle(name, root)
    except AvatarError as exc:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"avatar: portrait {name!r}: {exc}") from None
    v = video_options(opts, size=(avatar.width, avatar.height), fps=avatar.fps)
    if (v.width, v.height) != (avatar.width, avatar.height):
        raise opts._bad("size", f"{v.width}x{v.height}", f"the avatar's size {avatar.width}x{avatar.height}")
    if abs(v.fps - avatar.fps) > 1e-6:
        raise opts._bad("fps", v.fps, f"the avatar's frame rate {avatar.fps:g}")
    steps = opts.integer("steps", None, 1, 4)
    state = opts.choice("state", "auto", STATES)
    backend = opts.choice("backend", default_runtime(_device()), RUNTIMES)
    opts.done()
    device = _device() if backend in ("torch", "compiled") else "cpu"
    graph = Graph(Clock("realtime"), name="avatar")
    mic = graph.add(PushAudioSource(max_buffer_ms=500, name="mic"), max_in_flight=8)
    encoder, sink = add_video_out(graph, v, audio_chunk=AUDIO_CHUNK)
    try:
        ag = build_avatar_graph(avatar, mic, sink=encoder, audio_sink=sink, graph=graph, device=device, steps=steps,
                                live=True, torch_threads=1 if device == "cpu" else None, video_policy="drop_oldest",
                                runtime=backend)
    except (ExportError, ValueError) as exc:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"avatar: backend {backend!r}: {exc}") from None
    ag.set_state(state)

    def configure(o: Options) -> dict:
        mode = o.choice("state", None, STATES)
        if mode is None:
            return {}
        ag.set_state(mode)
        return {"state": mode}

    return Pipeline(graph, sink, encoder=encoder, audio_in=mic, configure=configure,
                    format={"video": v.describe(), "audio_out": PCM16_FORMAT, "audio_in": PCM16_FORMAT,
                            "pose_in": False, "avatar": name, "kind": avatar.kind, "steps": steps, "state": state, "device": device,
                            "backend": backend,
                            "states": list(STATES)})


if not available_avatars():
    raise ImportError(f"no avatar bundle in {AVATARS_DIR!r} (train one with `framegraph avatar train --synth 24 "
                      f"--out {os.path.join(AVATARS_DIR, DEFAULT_AVATAR)}`)")

register("avatar", "talking portrait driven by the client's microphone (state: auto | speaking | listening | "
                   "idle; interrupt resets)")(build_avatar_pipeline)
