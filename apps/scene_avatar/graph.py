"""The avatar in a scene, in one graph.

Audio drives the avatar branch. The camera drives the scene branch. The two meet in a compositing stage on the
audio clock.

    audio ──▶ [the avatar's stages] ──video, alpha (h × w: the bundle's own size)────────┐
      │                                                                                  ▼
      │   camera ──▶ scene render (3DGS / 4DGS / NeRF, layers) ──video, depth, opacity, camera──▶ QuadInScene ──▶ sink
      └──────────────────────────────────────── audio ──────────────────────────────────────────────────────────▲

Why an app: the joining stage is :class:`~framegraph.renderers.billboard.QuadInScene`. It lives with the camera
math in ``renderers/``. It takes any picture with a matte. The avatar, in ``models/``, gives one: its ``"alpha"``
port, :attr:`~framegraph.models.avatar.RunSettings.alpha`. ``models`` and ``renderers`` do not import each other.
So the graph that holds both is built here, in ``apps/``.

Clock, offline (``fast``): both branches make frame ``k`` at ``k / fps``, the avatar's fps. The audio stamps its
frames from sample counts. The camera stamps its frames from its frame index. The compositor takes one frame of
each in lock step. It keeps the avatar's pts, and the sound is muxed against those. Each stage runs on its own
thread. So the branches work in parallel, and the slower one sets the pace.

Clock, live: this is the server's ``scene_avatar`` pipeline. The scene frames set the pace. Each shows the newest
avatar frame. See :func:`build_scene_avatar_graph` with ``live``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from framegraph.models.avatar import AvatarBundle, RunSettings, build_avatar_graph, load_avatar
from framegraph.models.runtime import default_device
from framegraph.renderers.billboard import Placement, QuadInScene
from framegraph.renderers.cameras import CameraPath, load_nerfstudio_camera_path
from framegraph.renderers.scene_file import SceneFile, open_scene
from framegraph.renderers.stages import CameraSource
from framegraph.stream import Clock, Graph, Stage
from framegraph.stream.media import SAMPLE_RATE, AudioFileSource, MP4Sink, decode_audio

HEIGHT_SHARE = 0.25  # default avatar height: this share of the orbit's distance
BACKGROUND = (0.0, 0.0, 0.0)  # the scene's background colour (RGB in [0, 1]; a NeRF keeps its own)


def check_place(scene: SceneFile, anchor) -> None:
    """``ValueError`` naming the place and the scene's box when ``anchor`` (x, y, z) lies outside it."""
    lo, hi = scene.bounds()
    if all(a - 1e-9 <= v <= b + 1e-9 for v, a, b in zip(anchor, lo, hi)):
        return
    box = ", ".join(f"{n} {a:.2f}..{b:.2f}" for n, a, b in zip("xyz", lo, hi))
    place = ",".join(f"{v:g}" for v in anchor)
    raise ValueError(f"--place {place}: the point ({place}) lies outside the scene {scene.path!r}, whose box is {box} "
                     f"(scene units, z up); place the avatar inside it")


def placement_from(place, scene: SceneFile) -> Placement:
    """``--place X,Y,Z[,YAW,HEIGHT]``, 3 or 5 numbers, as a :class:`Placement` in ``scene``.

    It is checked by :func:`check_place`. The height defaults to :data:`HEIGHT_SHARE` of the scene's orbit
    distance."""
    anchor = tuple(float(v) for v in place[:3])
    check_place(scene, anchor)
    if len(place) == 5:
        return Placement(anchor, float(place[4]), float(place[3]))
    return Placement(anchor, HEIGHT_SHARE * scene.framing.distance)


def open_scene_checked(path: str, time_duration=None) -> SceneFile:
    """:func:`~framegraph.renderers.scene_file.open_scene`, with any failure a ``ValueError`` naming the scene."""
    try:
        return open_scene(path, time_duration=time_duration)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - a scene that does not load is the user's input, said in one sentence
        if isinstance(exc, ValueError) and str(path) in str(exc):
            raise
        raise ValueError(f"scene {str(path)!r} does not load: {exc}") from None


def camera_path(scene: SceneFile, camera_path_file: str | None, n_frames: int, width: int, height: int,
                fps: float) -> CameraPath:
    """The cameras: the scene's orbit over ``n_frames``, or a nerfstudio camera path at ``width × height``.

    A path keeps its field of view. A shorter path loops."""
    if camera_path_file is None:
        return scene.framing.orbit(n_frames, width, height, fps)
    path = load_nerfstudio_camera_path(camera_path_file)
    if (path.width, path.height) != (width, height):
        path.Ks[:, 0] *= width / path.width
        path.Ks[:, 1] *= height / path.height
        path.width, path.height = width, height
    return path


@dataclass
class SceneAvatarGraph:
    """What :func:`build_scene_avatar_graph` made.

    That is the graph, the avatar's source and picture stage, and the camera source. It also holds the scene's
    render stage, the compositor and the sink. The sink is None when the caller connects ``quad``."""

    graph: Graph
    audio: Stage
    avatar: Stage
    camera: CameraSource
    render: Stage
    quad: QuadInScene
    sink: Stage | None
    avatar_graph: object


def build_scene_avatar_graph(scene: SceneFile, avatar: AvatarBundle, audio_source: Stage, placement: Placement, *,
                             width: int, height: int, path: CameraPath | None, n_frames: int | None,
                             sink: Stage | None = None, graph: Graph | None = None, device: str = "cpu",
                             live: bool = False, camera: CameraSource | None = None, shadow: float = 0.5,
                             time_scale: float = 1.0, runtime: str = "torch", onnx_dir: str | None = None,
                             torch_threads: int | None = None) -> SceneAvatarGraph:
    """Both branches and the compositor in one graph. See the module docstring.

    Args:
        scene / avatar / audio_source: the scene, the bundle with a matte, and its audio, an ``"audio"`` source.
        placement: where the avatar stands.
        width: the width of the scene and the video.
        height: their height.
        path: the cameras' path, played at the avatar's fps, looping.
        n_frames: how many cameras of it.
        camera: a ready camera source instead of a path, such as live pushed poses.
        sink: where the composite goes, to its ``"video"``. With an ``"audio"`` input it also gets the audio.
        live: realtime. Each scene frame shows the avatar's newest frame; its edges are ``latest``. Frames late
            behind a newer one are dropped.
    """
    fps = avatar.fps
    g = graph if graph is not None else Graph(Clock("realtime" if live else "fast"), name="scene-avatar")
    src = audio_source if audio_source in g.stages else g.add(audio_source, max_in_flight=8)
    audio_sink = sink if sink is not None and "audio" in sink.inputs else None
    settings = RunSettings(runtime=runtime, device=device if runtime == "torch" else "cpu", live=live,
                           torch_threads=torch_threads, onnx_dir=onnx_dir, alpha=True)
    ag = build_avatar_graph(avatar, src, audio_sink=audio_sink, graph=g, settings=settings,
                            video_policy="latest" if live else "block")
    if camera is None:
        camera = CameraSource(path, fps=fps, n_frames=n_frames)
    cams, render = add_scene_branch(g, scene, camera, width=width, height=height, device=device, live=live,
                                    time_scale=time_scale)
    quad = place_picture(g, ag.video, render, placement, image_size=(avatar.height, avatar.width),
                         scene=scene, shadow=shadow, live=live)
    if sink is not None:
        if sink not in g.stages:
            g.add(sink)
        g.connect(quad, sink, "video", "video", capacity=4, policy="drop_oldest" if live else "block")
    return SceneAvatarGraph(g, src, ag.video, cams, render, quad, sink, ag)


def add_scene_branch(graph: Graph, scene: SceneFile, camera: CameraSource, *, width: int, height: int,
                     device: str = "cpu", live: bool = False, time_scale: float = 1.0) -> tuple[CameraSource, Stage]:
    """The scene branch: ``camera`` → the scene's render stage, on :data:`BACKGROUND`. Returns both.

    ``camera`` is added when new. The render stage makes its layers: depth, opacity, camera."""
    cams = camera if camera in graph.stages else graph.add(camera, max_in_flight=2 if live else None)
    render = graph.add(scene.render_stage(width=width, height=height, device=device, background=BACKGROUND,
                                          time_scale=time_scale, layers=True))
    graph.connect(cams, render, "camera", policy="drop_oldest" if live else "block")
    return cams, render


def place_picture(graph: Graph, picture: Stage, render: Stage, placement: Placement, *, image_size: tuple[int, int],
                  scene: SceneFile, shadow: float = 0.5, matte: bool = True, live: bool = False) -> QuadInScene:
    """The compositor joining ``picture``'s ``"video"`` to ``render``'s layers.

    With ``matte`` it joins ``"alpha"`` too. Offline it runs in lock step. Live, the picture's edges are
    ``latest``, so each scene frame shows the newest picture."""
    device = picture.outputs["video"].device  # the blend runs where the picture arrives
    quad = graph.add(QuadInScene(placement, image_size=image_size, frame_size=(render.height, render.width),
                                 background=scene.background(BACKGROUND), shadow=shadow, matte=matte, device=device))
    policy = "drop_oldest" if live else "block"
    for port in ("video", "depth", "opacity", "camera"):
        graph.connect(render, quad, port, port, capacity=2, policy=policy)
    picture_policy = "latest" if live else "block"
    graph.connect(picture, quad, "video", "image", capacity=4, policy=picture_policy)
    if matte:
        graph.connect(picture, quad, "alpha", "alpha", capacity=4, policy=picture_policy)
    return quad


def render_scene_avatar(scene_path: str, avatar_dir: str, audio_path: str, out: str, *, width: int, height: int,
                        place, camera_path_file: str | None = None, device: str | None = None,
                        preset: str = "offline", time_duration=None, time_scale: float = 1.0, runtime: str = "torch",
                        onnx_dir: str | None = None) -> tuple[Graph, MP4Sink, int]:
    """``framegraph render --scene SCENE --avatar BUNDLE --audio SPEECH --place ...``: the offline graph.

    Returns the graph, its sink and the frames it will write. The graph writes an MP4 with the speech. The video lasts
    as long as the speech, at the avatar's fps. ``place`` is ``(x, y, z[, yaw, height])``."""
    device = device or default_device()
    scene = open_scene_checked(scene_path, time_duration)
    placement = placement_from(place, scene)
    avatar = load_avatar(avatar_dir)
    avatar.required_matte()  # say it before anything heavy is built
    total = math.ceil(len(decode_audio(audio_path)) * avatar.fps / SAMPLE_RATE)
    path = camera_path(scene, camera_path_file, total, width, height, avatar.fps)
    sink = MP4Sink(out, width=width, height=height, fps=avatar.fps, audio_rate=SAMPLE_RATE, preset=preset)
    sg = build_scene_avatar_graph(scene, avatar, AudioFileSource(audio_path), placement, width=width, height=height,
                                  path=path, n_frames=total, sink=sink, device=device, time_scale=time_scale,
                                  runtime=runtime, onnx_dir=onnx_dir)
    return sg.graph, sink, total


__all__ = ["HEIGHT_SHARE", "BACKGROUND", "check_place", "placement_from", "open_scene_checked", "camera_path",
           "SceneAvatarGraph", "build_scene_avatar_graph", "add_scene_branch", "place_picture", "render_scene_avatar"]
