"""The ``avatar`` pipeline: the client's microphone drives a talking avatar, a bundle of any kind.

    mic (PushAudioSource) ─▶ the bundle's stages ─▶ [the person over a background] ─▶ encode ─▶ send
        └──────────────── audio echoed back, same pts ────────────────────▲

``models.avatar.build_avatar_graph`` adds the stages the bundle's kind defines. This module knows no kind.
A portrait runs AudioFeatures → StateOverride → Denoiser → VAEDecode → Composite.
A video avatar runs MouthShape, VideoLoop → MouthRegion.

The avatar is a bundle from the server's avatar folder, :func:`~framegraph.apps.bundles.avatars_dir`.
That is ``$FRAMEGRAPH_AVATARS``, default ``assets/avatars``.

- ``avatar``, old name ``portrait``: a bundle's name, never a client path.
  The default is ``astronaut``, else the first bundle there.
- Video size and fps are the bundle's. The client may only ask for exactly those.
- ``runtime``, old name ``backend``: ``torch``, ``onnx`` or ``onnx-int8``.
  ``onnx`` runs the model stages on ONNX Runtime from the bundle's ``onnx/`` export.
  ``onnx-int8`` is the same, with the models that export keeps in int8 running int8.
  An avatar without a fitting export is refused. The reason goes to the server's log.
- Live ``config``: ``state`` is ``auto``, ``speaking``, ``listening`` or ``idle``.
  With ``auto`` Silero VAD decides speaking or idle. The others are forced.
- ``interrupt``, barge-in, is the session's ``graph.reset()``.
  The audio context, the denoiser's stream state and the decoder cache start afresh.
  The next frame is flagged ``INTERRUPTED``.

``background`` is one of these. Old bundles without a person matte refuse all but the first.

- ``portrait``: the bundle's own picture. The default.
- A colour, such as ``green``, ``#00ff00`` or ``0,255,0``. The person goes over it.
- A picture's file name in the server's backgrounds folder, :func:`~.options.backgrounds_dir`.
  That is ``$FRAMEGRAPH_BACKGROUNDS``, default ``assets/backgrounds``.
  The name is such as ``toy_scene.jpg``, never a client path.
  The person goes over the picture, scaled to cover the frame.
- ``transparent``, with ``codec`` ``png`` or ``webp``. The pictures are RGBA, with the person's matte as alpha.
  This is for consumers that keep alpha: OBS, a game engine, a web page over its own background.

Bundles are loaded once per process and shared by the sessions: :func:`load_bundle`.
The server has the pipeline only while its avatar folder holds a bundle: :func:`unavailable`.
On a server with ``batching`` on, ``framegraph serve --batching on``, sessions of one video avatar bundle
share a model service.
That holds for runtime ``torch`` or ``onnx``, on the CPU.
They run its generator in the server's :func:`~.base.model_service`, their frames' calls in one batch.
A session that would push the model past its measured capacity is refused.
That is when one more session's batch no longer fits in a frame.
The refusal is ``full`` with ``retry_after_s``. The sessions there keep their frame rate.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from framegraph.apps.argtypes import AVATAR_RUNTIMES
from framegraph.apps.bundles import DEFAULT_AVATAR, available_avatars, avatars_dir, default_avatar, load_bundle
from framegraph.models import runtime as models_runtime
from framegraph.models.avatar.base import STATE_MODES
from framegraph.models.composite import OverBackground
from framegraph.models.runtime import default_device
from framegraph.stream import Clock, Graph
from framegraph.stream.batching import Full
from framegraph.stream.media import JoinAlpha, PushAudioSource

from ..protocol import ErrorCode, ProtocolError
from .base import (
    AUDIO_CHUNK,
    FULL_RETRY_S,
    PCM16_FORMAT,
    Pipeline,
    PipelineSpec,
    Unavailable,
    add_video_out,
    model_service,
)
from .options import (
    FPS_RANGE,
    Background,
    Choice,
    Integer,
    Number,
    Size,
    VideoOptions,
    backgrounds_dir,
    bad_option,
    option,
)

log = logging.getLogger("framegraph.server")

def unavailable() -> Unavailable | None:
    if available_avatars():
        return None
    return Unavailable("it has no avatar bundle",
                       f"no avatar bundle in {avatars_dir()!r} ($FRAMEGRAPH_AVATARS); train one with `framegraph "
                       f"avatar train --synth 24 --out {os.path.join(avatars_dir(), DEFAULT_AVATAR)}`")


@dataclass
class AvatarOptions(VideoOptions):
    size: tuple[int, int] | None = option(None, "the bundle's own size (the only one it streams at; the shipped "
                                                "astronaut: 256x256)", Size())
    fps: float | None = option(None, "the bundle's own frame rate (the only one it streams at)", Number(*FPS_RANGE))
    avatar: str | None = option(None, "the avatar bundle to run, of any kind (default: astronaut, else the first)",
                                Choice(available_avatars, "one of the server's avatars"), alias="portrait")
    steps: int | None = option(None, "sampler steps (default: the bundle's)", Integer(1, 4))
    state: str = option("auto", "speaking state: auto (voice activity decides), or forced speaking / listening / idle",
                        Choice(STATE_MODES), live=True)
    runtime: str | None = option(None, "where the models compute: compiled (Inductor, and CUDA graphs: the default "
                                       "on a GPU), torch (the default on a CPU), or ONNX Runtime on the CPU from the "
                                       "bundle's export (onnx; onnx-int8: the models it keeps in int8 run int8)",
                                 Choice(AVATAR_RUNTIMES), alias="backend")
    codec: str = option("jpeg", "how video frames are sent: JPEG pictures, an H.264 stream, or PNG / WebP pictures "
                                "with alpha (background transparent)", Choice(("jpeg", "h264", "png", "webp")))
    background: str | tuple = option("portrait", "behind the person: the portrait's own picture, a colour, a "
                                                 "picture of the server's (by name), or transparent (codec png or "
                                                 "webp: the person's matte as alpha)", Background())

    def check(self, pipeline: str) -> None:
        alpha_codec = self.codec in ("png", "webp")
        if (self.background == "transparent") != alpha_codec:
            if alpha_codec:
                raise bad_option(pipeline, "codec", self.codec, 'jpeg or h264 (png and webp carry the alpha of '
                                 'background "transparent")')
            raise bad_option(pipeline, "background", "transparent", f"a colour, a picture or portrait with codec "
                             f"{self.codec} (a transparent background needs codec png or webp)")


def _refused(key: str, value, expected: str, exc: Exception, why: str):
    """A refusal whose cause is the server's own: a bundle or export it cannot use.

    The client hears what it may send instead. The server's log gets the cause.
    """
    log.warning("avatar: %s %r refused: %s", key, value, exc)
    return bad_option("avatar", key, value, f"{expected} ({why}; the server's log says why)")


def _matte_out(graph: Graph, video, encoder, background, size: tuple[int, int]) -> None:
    """The avatar's picture and matte → the encoder.

    With ``transparent`` they are joined as RGBA.
    Otherwise the picture goes over a colour ``(r, g, b)`` or over a picture.
    The picture is named by its file name in :func:`~.options.backgrounds_dir`.
    """
    w, h = size
    if background == "transparent":
        stage = graph.add(JoinAlpha(width=w, height=h))
    else:
        picture = backgrounds_dir() / background if isinstance(background, str) else tuple(background)
        try:
            stage = graph.add(OverBackground(picture, width=w, height=h))
        except (OSError, ValueError) as exc:  # a picture that is gone, or does not decode
            raise _refused("background", background, "another background", exc,
                           "this picture cannot be read") from None
    graph.connect(video, stage, "video", "video", capacity=2, policy="drop_oldest")
    graph.connect(video, stage, "alpha", "alpha", capacity=2, policy="drop_oldest")
    port = "rgba" if background == "transparent" else "video"
    graph.connect(stage, encoder, port, port if port == "rgba" else "video", policy="drop_oldest")


def build(opts: AvatarOptions) -> Pipeline:
    from framegraph.models.avatar import RunSettings, build_avatar_graph  # heavy: the avatar's models

    name = opts.avatar or default_avatar()
    try:
        avatar = load_bundle(name)
    except (ValueError, OSError) as exc:  # AvatarError, a file that does not load
        raise _refused(opts.key("avatar"), name, "another of the server's avatars", exc,
                       "this one cannot be loaded") from None
    size, fps = (avatar.width, avatar.height), avatar.fps
    if opts.size not in (None, size):
        raise bad_option("avatar", "size", f"{opts.width}x{opts.height}", f"the avatar's size {size[0]}x{size[1]}")
    if opts.fps is not None and abs(opts.fps - fps) > 1e-6:
        raise bad_option("avatar", "fps", opts.fps, f"the avatar's frame rate {fps:g}")
    runtime = opts.runtime or models_runtime.default_runtime(default_device())
    try:
        models_runtime.check(f"avatar-{avatar.kind}", runtime)
    except ValueError:
        raise bad_option("avatar", opts.key("runtime"), runtime,
                         f"one of {', '.join(models_runtime.runtimes(f'avatar-{avatar.kind}'))} (avatar {name!r} is "
                         f"a {avatar.kind} avatar)") from None
    opts.size, opts.fps = size, fps
    device = default_device(runtime)
    matted = opts.background != "portrait"
    if matted and avatar.matte is None:
        raise bad_option("avatar", "background", opts.background if isinstance(opts.background, str) else
                         ",".join(map(str, opts.background)), f"portrait (avatar {name!r} has no person matte: it was "
                         f"made before avatars had one)")
    # a kind with a batched engine on this runtime and device shares the server's model service
    batching = model_service(opts) if models_runtime.batches(f"avatar-{avatar.kind}-batch", runtime, device) else None
    graph = Graph(Clock("realtime"), name="avatar")
    mic = graph.add(PushAudioSource(max_buffer_ms=500, name="mic"), max_in_flight=8)
    encoder, sink = add_video_out(graph, opts, audio_chunk=AUDIO_CHUNK)
    try:
        settings = RunSettings(runtime=runtime, device=device, steps=opts.steps, live=True, alpha=matted,
                               torch_threads=1 if device == "cpu" else None, batching=batching)
        ag = build_avatar_graph(avatar, mic, sink=None if matted else encoder, audio_sink=sink, graph=graph,
                                settings=settings, video_policy="drop_oldest")
    except ValueError as exc:  # ExportError: no up-to-date export
        raise _refused(opts.key("runtime"), runtime, "'torch'", exc,
                       f"avatar {name!r} has no up-to-date {runtime} export on this server") from None
    except Full as exc:  # the model service's measured capacity: the sessions there keep their frame rate
        raise ProtocolError(ErrorCode.FULL, f"avatar {name!r} is full on this server: {exc}; try again later or "
                                            f"another server", retry_after_s=FULL_RETRY_S) from None
    if matted:
        _matte_out(graph, ag.video, encoder, opts.background, size)
    ag.set_state(opts.state)

    def configure(changes: dict) -> dict:
        ag.set_state(changes["state"])
        return {"state": changes["state"]}

    return Pipeline(graph, sink, encoder=encoder, audio_in=mic, configure=configure,
                    format={"video": opts.video_format(), "audio_out": PCM16_FORMAT, "audio_in": PCM16_FORMAT,
                            "pose_in": False, "avatar": name, "kind": avatar.kind, "steps": opts.steps,
                            "state": opts.state, "device": device,
                            "background": opts.background if isinstance(opts.background, str) else
                            list(opts.background),
                            "runtime": runtime, "backend": runtime, "states": list(STATE_MODES),
                            "batched": ag.batched})


PIPELINE = PipelineSpec("avatar", "talking avatar driven by the client's microphone (state: auto | speaking | "
                                  "listening | idle; interrupt resets)", AvatarOptions, build, unavailable)
