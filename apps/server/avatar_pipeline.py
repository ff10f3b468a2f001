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
bundle's), ``state`` (initial state), ``backend`` (``torch`` | ``onnx``: the model stages on ONNX Runtime
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

import os

import torch

from framegraph import assets
from framegraph.apps.bundles import load_bundle_at, loaded_bundles, set_bundle_limit  # noqa: F401 - re-exported
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
    """The loaded bundle ``name`` in the avatar folder (``root``, default :data:`AVATARS_DIR`), from the process's
    shared cache (:func:`framegraph.apps.bundles.load_bundle_at`: sessions share the weights, each has its own
    stream state; with a limit, :func:`set_bundle_limit`, the least recently used bundles beyond it are dropped)."""
    return load_bundle_at(os.path.join(root or AVATARS_DIR, name))


def build_avatar_pipeline(opts: Options, root: str | None = None) -> Pipeline:
    from framegraph.models.avatar import AvatarError, build_avatar_graph
    from framegraph.models.onnx import ExportError
    from framegraph.models.runtime import RUNTIMES

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
    backend = opts.choice("backend", "torch", RUNTIMES)
    opts.done()
    device = "cuda" if torch.cuda.is_available() and backend == "torch" else "cpu"
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
