"""The ``avatar`` pipeline: the client's microphone drives a talking portrait.

    mic (PushAudioSource) ─▶ AudioFeatures ─▶ StateOverride ─▶ Denoiser ─▶ VAEDecode ─▶ Composite ─▶ encode ─▶ send
        └──────────────────────────────── audio echoed back, same pts ─────────────────────────────────────▲

(a video avatar bundle, kind ``"video"``: MouthShape, VideoLoop → MouthRegion in place of the three
generating stages; ``models.avatar.build_avatar_graph`` picks by the bundle's kind.)

The picture is an avatar bundle (``models.avatar``) from the server's avatar folder, :func:`avatars_dir`
(``$FRAMEGRAPH_AVATARS``, default ``assets/avatars``) — option ``portrait``: a bundle's name, never a client path
(default ``astronaut``, else the first bundle there). Video size and fps are the bundle's (its portrait's size;
the client may only ask for exactly those). ``runtime`` (old name ``backend``): ``torch``, or ``onnx`` (the model
stages on ONNX Runtime from the bundle's ``onnx/`` export), or ``onnx-int8`` (the same, the models that export
keeps in int8 running int8); an avatar without a fitting export is refused, with the reason in the server's log.
Live ``config``: ``state`` ∈ ``auto`` (Silero VAD decides speaking / idle) | ``speaking`` | ``listening`` |
``idle`` (forced). ``interrupt`` (barge-in) is the session's ``graph.reset()``: the audio context, the denoiser's
stream state and the decoder cache start afresh and the next frame is flagged ``INTERRUPTED``.

Bundles are loaded once per process and shared by the sessions (:func:`load_bundle`); the server has the pipeline
only while its avatar folder holds a bundle (:func:`unavailable`).
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass

import torch

from framegraph import assets
from framegraph.apps.argtypes import AVATAR_RUNTIMES
from framegraph.stream import Clock, Graph
from framegraph.stream.media import PushAudioSource

from .base import AUDIO_CHUNK, PCM16_FORMAT, Pipeline, PipelineSpec, Unavailable, add_video_out
from .options import FPS_RANGE, Choice, Integer, Number, Size, VideoOptions, bad_option, option

log = logging.getLogger("framegraph.server")

DEFAULT_AVATAR = "astronaut"
STATES = ("auto", "speaking", "listening", "idle")

_cache: collections.OrderedDict[str, object] = collections.OrderedDict()  # path -> bundle, least recent first
_bundle_limit = 0  # 0: keep every bundle loaded
_load_s: dict[str, float] = {}  # path -> seconds its last load took
_lock = threading.Lock()


def avatars_dir() -> str:
    """The server's avatar folder: ``$FRAMEGRAPH_AVATARS``, else the shipped ``assets/avatars``."""
    return os.environ.get("FRAMEGRAPH_AVATARS") or str(assets.path("avatars"))


def available_avatars(root: str | None = None) -> list[str]:
    """Bundle names (folders with an ``avatar.json``) in the avatar folder, the default first."""
    root = root or avatars_dir()
    if not os.path.isdir(root):
        return []
    names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "avatar.json")))
    return sorted(names, key=lambda n: n != DEFAULT_AVATAR)


def default_avatar(root: str | None = None) -> str:
    """The bundle a session gets when it names no ``portrait``."""
    names = available_avatars(root)
    return names[0] if names else DEFAULT_AVATAR


def unavailable() -> Unavailable | None:
    if available_avatars():
        return None
    return Unavailable("it has no avatar bundle",
                       f"no avatar bundle in {avatars_dir()!r} ($FRAMEGRAPH_AVATARS); train one with `framegraph "
                       f"avatar train --synth 24 --out {os.path.join(avatars_dir(), DEFAULT_AVATAR)}`")


def load_bundle(name: str, root: str | None = None):
    """The loaded bundle ``name`` (cached: sessions share the weights, each has its own stream state),
    and the voice detector its sessions use (one onnxruntime session per process: importing onnxruntime and
    creating it takes ~0.2 s, which would otherwise delay the first session's first frame).
    With a limit (:func:`set_bundle_limit`) the least recently used bundles beyond it are dropped from
    the cache (sessions still running on one keep it alive until they end)."""
    from framegraph.models.audio.vad import SileroVAD  # heavy: the avatar's models, loaded on first use
    from framegraph.models.avatar import load_avatar

    path = os.path.join(root or avatars_dir(), name)
    with _lock:
        if path not in _cache:
            started = time.monotonic()
            avatar = load_avatar(path)
            if getattr(avatar, "kind", "portrait") == "portrait":
                avatar.reference_latent()  # computed once, here
            if avatar.vad:
                SileroVAD()
            _cache[path] = avatar
            _load_s[path] = time.monotonic() - started
        _cache.move_to_end(path)
        while _bundle_limit and len(_cache) > _bundle_limit:
            _cache.popitem(last=False)
        return _cache[path]


def set_bundle_limit(n: int) -> None:
    """Keep at most ``n`` bundles loaded (0: no limit); a cluster replica sets it."""
    global _bundle_limit
    _bundle_limit = n


def loaded_bundles() -> list[dict]:
    """The bundles loaded now, least recently used first: ``{"name", "load_s"}``."""
    with _lock:
        return [{"name": os.path.basename(p), "load_s": round(_load_s[p], 3)} for p in _cache]


@dataclass
class AvatarOptions(VideoOptions):
    size: tuple[int, int] | None = option(None, "the bundle's own size (the only one it streams at; the shipped "
                                                "astronaut: 256x256)", Size())
    fps: float | None = option(None, "the bundle's own frame rate (the only one it streams at)", Number(*FPS_RANGE))
    portrait: str | None = option(None, "the avatar bundle to run (default: astronaut, else the first)",
                                  Choice(available_avatars, "one of the server's avatars"))
    steps: int | None = option(None, "sampler steps (default: the bundle's)", Integer(1, 4))
    state: str = option("auto", "speaking state: auto (voice activity decides), or forced speaking / listening / idle",
                        Choice(STATES), live=True)
    runtime: str = option("torch", "where the models compute: torch, or ONNX Runtime on the CPU from the bundle's "
                                   "export (onnx; onnx-int8: the models it keeps in int8 run int8)",
                          Choice(AVATAR_RUNTIMES), alias="backend")


def _refused(key: str, value, expected: str, exc: Exception, why: str):
    """A refusal whose cause is the server's own (a bundle or export it cannot use): the client hears what it may
    send instead, the server's log gets the cause."""
    log.warning("avatar: %s %r refused: %s", key, value, exc)
    return bad_option("avatar", key, value, f"{expected} ({why}; the server's log says why)")


def build(opts: AvatarOptions) -> Pipeline:
    from framegraph.models.avatar import build_avatar_graph  # heavy: the avatar's models
    from framegraph.models.avatar.graph import LIVE_MAX_LAG_MS
    from framegraph.models.onnx import ExportError

    name = opts.portrait or default_avatar()
    try:
        avatar = load_bundle(name)
    except (ValueError, OSError) as exc:  # AvatarError, a file that does not load
        raise _refused("portrait", name, "another of the server's avatars", exc, "this one cannot be loaded") from None
    size, fps = (avatar.width, avatar.height), avatar.fps
    if opts.size not in (None, size):
        raise bad_option("avatar", "size", f"{opts.width}x{opts.height}", f"the avatar's size {size[0]}x{size[1]}")
    if opts.fps is not None and abs(opts.fps - fps) > 1e-6:
        raise bad_option("avatar", "fps", opts.fps, f"the avatar's frame rate {fps:g}")
    if getattr(avatar, "kind", "portrait") == "video" and opts.runtime != "torch":
        raise bad_option("avatar", opts.key("runtime"), opts.runtime, f"'torch' (portrait {name!r} is a video avatar: "
                                                                      f"its small models run on torch only)")
    opts.size, opts.fps = size, fps
    steps = opts.steps or avatar.steps
    device = "cuda" if torch.cuda.is_available() and opts.runtime == "torch" else "cpu"
    graph = Graph(Clock("realtime"), name="avatar")
    mic = graph.add(PushAudioSource(max_buffer_ms=500, name="mic"), max_in_flight=8)
    encoder, sink = add_video_out(graph, opts, audio_chunk=AUDIO_CHUNK)
    try:  # the models' keyword is still `backend` (to become `runtime`): the one place the server passes it
        ag = build_avatar_graph(avatar, mic, sink=encoder, audio_sink=sink, graph=graph, device=device, steps=steps,
                                budget_ms=1000.0 * avatar.chunk_frames / avatar.fps,
                                torch_threads=1 if device == "cpu" else None, video_policy="drop_oldest",
                                max_lag_ms=LIVE_MAX_LAG_MS, backend=opts.runtime)
    except ExportError as exc:
        raise _refused(opts.key("runtime"), opts.runtime, "'torch'", exc,
                       f"portrait {name!r} has no up-to-date {opts.runtime} export on this server") from None
    ag.set_state(opts.state)

    def configure(changes: dict) -> dict:
        ag.set_state(changes["state"])
        return {"state": changes["state"]}

    return Pipeline(graph, sink, encoder=encoder, audio_in=mic, configure=configure,
                    format={"video": opts.video_format(), "audio_out": PCM16_FORMAT, "audio_in": PCM16_FORMAT,
                            "pose_in": False, "avatar": name, "steps": steps, "state": opts.state, "device": device,
                            "runtime": opts.runtime, "backend": opts.runtime, "states": list(STATES)})


PIPELINE = PipelineSpec("avatar", "talking portrait driven by the client's microphone (state: auto | speaking | "
                                  "listening | idle; interrupt resets)", AvatarOptions, build, unavailable)
