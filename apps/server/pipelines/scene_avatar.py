"""The ``scene_avatar`` pipeline: the talking avatar standing in a 3D scene.

The client's microphone drives the avatar. Its camera poses drive the scene. One video comes back.

    mic (PushAudioSource) ─▶ [the avatar's stages, with its matte] ──video, alpha (latest)────┐
    │                                                                                      ▼
    │ camera (CameraSource, newest pushed pose, at the avatar's fps) ─▶ render (layers) ─▶ QuadInScene ─▶ encode ─▶ send
    └──────────────────────────────── audio echoed back, same clock ───────────────────────────────────▲

It is :func:`framegraph.apps.scene_avatar.build_scene_avatar_graph` with ``live``.
The scene frames set the pace. Each shows the avatar's newest frame.
So the page can orbit while the avatar talks.
It keeps orbiting between utterances, and the last frame stays.
Video starts with the avatar's first frame, i.e. with the client's first audio.

``ready`` carries ``camera`` and ``place``.
``camera`` is the orbit the initial pose was made from, as in the ``scene`` pipeline.
``place`` is where the avatar stands.

Options name the scene and the avatar by name:

- ``scene``: in the server's scene folder, as for the ``scene`` pipeline.
- ``avatar``, old name ``portrait``: in the server's avatar folder, as for the ``avatar`` pipeline.
  A bundle without a person matte is refused.
- ``place``: ``"x,y,z"`` or ``"x,y,z,yaw,height"`` in scene units, inside the scene's box.
  The default is the orbit's centre.
"""
from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass

from framegraph.apps.argtypes import AVATAR_RUNTIMES, placement
from framegraph.apps.bundles import available_avatars, default_avatar, load_bundle
from framegraph.models.avatar.base import STATE_MODES
from framegraph.models.runtime import default_device
from framegraph.stream import Clock, Graph
from framegraph.stream.media import PushAudioSource

from .base import AUDIO_CHUNK, PCM16_FORMAT, Pipeline, PipelineSpec, add_video_out
from .options import FPS_RANGE, Choice, FileName, Number, Size, Text, VideoOptions, bad_option, option
from .scene import SCENE, CameraPoses, orbit_camera, scene_dirs

log = logging.getLogger("framegraph.server")


class EndingCameraPoses(CameraPoses):
    """As the scene viewer's poses, but the client's end also ends the camera.

    Nothing else would: the poses are pushed, and the camera source has no end of its own.
    So the session drains once the audio has played.
    """

    def close(self) -> None:
        self.camera.n_frames = self.camera.index


@dataclass
class SceneAvatarOptions(VideoOptions):
    size: tuple[int, int] | None = option((320, 180), "the scene's (and the video's) width and height", Size())
    fps: float | None = option(None, "the avatar's own frame rate (the only one it streams at)", Number(*FPS_RANGE))
    scene: str = option("toy.ply", "the scene, by name", FileName(SCENE))
    avatar: str | None = option(None, "the avatar bundle (default: astronaut, else the first); it needs a person "
                                      "matte", Choice(available_avatars, "one of the server's avatars"),
                                alias="portrait")
    place: str | None = option(None, 'where the avatar stands: "x,y,z" or "x,y,z,yaw,height" in scene units (default: '
                                     "the orbit's centre; yaw in degrees, none: facing the camera)", Text(80))
    state: str = option("auto", "speaking state: auto, or forced speaking / listening / idle", Choice(STATE_MODES),
                        live=True)
    runtime: str = option("torch", "where the avatar's models compute", Choice(AVATAR_RUNTIMES))


def _place(opts: SceneAvatarOptions, scene) -> tuple:
    from framegraph.apps.scene_avatar.graph import placement_from  # heavy: the renderers

    try:
        place = placement(opts.place) if opts.place is not None else tuple(scene.framing.center)
        return placement_from(place, scene)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise bad_option("scene_avatar", "place", opts.place, f"x,y,z or x,y,z,yaw,height inside the scene's box "
                                                              f"({str(exc).split('; ')[0]})") from None


def _open(name: str):
    """The scene ``name`` in the server's scene folder, opened.

    Raises ``bad_option`` when it is not there or does not load. The cause goes to the server's log.
    """
    from framegraph.renderers.scene_file import open_scene  # heavy: the renderers

    path = next((os.path.join(d, name) for d in scene_dirs() if os.path.exists(os.path.join(d, name))), None)
    if path is None:
        raise bad_option("scene_avatar", "scene", name, f"the name of a scene in {SCENE} that exists")
    try:
        return open_scene(path)
    except (ValueError, OSError) as exc:  # SceneError, NerfLoadError: ValueErrors naming the file
        log.warning("scene_avatar: scene %r refused: %s", name, exc)
        raise bad_option("scene_avatar", "scene", name, "another of the server's scenes (this one cannot be opened; "
                                                        "the server's log says why)") from None


def build(opts: SceneAvatarOptions) -> Pipeline:
    from framegraph.apps.scene_avatar.graph import build_scene_avatar_graph  # heavy: the models and renderers

    name = opts.avatar or default_avatar()
    try:
        avatar = load_bundle(name)
    except (ValueError, OSError) as exc:
        log.warning("scene_avatar: avatar %r refused: %s", name, exc)
        raise bad_option("scene_avatar", opts.key("avatar"), name, "another of the server's avatars (this one "
                                                                   "cannot be loaded; the server's log says why)") \
            from None
    if avatar.matte is None:
        raise bad_option("scene_avatar", opts.key("avatar"), name, "an avatar with a person matte (this one was "
                                                                   "made before avatars had one)")
    if opts.fps is not None and abs(opts.fps - avatar.fps) > 1e-6:
        raise bad_option("scene_avatar", "fps", opts.fps, f"the avatar's frame rate {avatar.fps:g}")
    opts.fps = avatar.fps
    device = default_device()
    scene = _open(opts.scene)
    where = _place(opts, scene)
    orbit, camera = orbit_camera(scene.framing, opts)
    graph = Graph(Clock("realtime"), name="scene_avatar")
    mic = graph.add(PushAudioSource(max_buffer_ms=500, name="mic"), max_in_flight=8)
    encoder, sink = add_video_out(graph, opts, audio_chunk=AUDIO_CHUNK)
    sg = build_scene_avatar_graph(scene, avatar, mic, where, width=opts.width, height=opts.height, path=None,
                                  n_frames=None, camera=camera, sink=encoder, graph=graph, device=device, live=True,
                                  runtime=opts.runtime, torch_threads=1 if device == "cpu" else None)
    graph.connect(mic, sink, "audio", "audio", capacity=8)
    sg.avatar_graph.set_state(opts.state)

    def configure(changes: dict) -> dict:
        sg.avatar_graph.set_state(changes["state"])
        return {"state": changes["state"]}

    return Pipeline(graph, sink, encoder=encoder, audio_in=mic, pose_in=EndingCameraPoses(sg.camera),
                    configure=configure,
                    format={"video": opts.video_format(), "audio_out": PCM16_FORMAT, "audio_in": PCM16_FORMAT,
                            "pose_in": True, "camera": orbit, "scene": scene.kind, "gaussians": scene.size,
                            "avatar": name, "kind": avatar.kind, "state": opts.state, "states": list(STATE_MODES),
                            "place": {"anchor": list(where.anchor), "height": where.height, "yaw_deg": where.yaw_deg},
                            "device": device})


PIPELINE = PipelineSpec("scene_avatar", "the talking avatar standing in a 3D scene: microphone and camera poses in, "
                                        "one video out (drag to orbit while it talks)", SceneAvatarOptions, build)
