"""The ``scene`` pipeline: a scene viewer driven by the client's camera poses. Scenes are 3DGS, 4DGS or NeRF.

The graph::

    camera (CameraSource, newest pushed pose, at fps) → render (the scene's RenderStage) → encode → send

The client orbits the camera and sends ``pose`` messages.
On the web page, drag on the picture to orbit and use the wheel to zoom.
Each rendered frame uses the newest pose. Poses never queue.
``ready`` carries ``camera``: the orbit the initial pose was made from.
Its keys are ``target``, ``up``, ``distance``, ``azimuth_deg``, ``elevation_deg`` and ``fov_deg``.
``fov_deg`` is the vertical field of view.
So a client starts where the server does.

The options, :class:`SceneOptions`, name a scene in the server's scene folder, :func:`scene_dirs`.
That is ``$FRAMEGRAPH_SCENES``.
The default is the shipped ``assets/scenes``, ``assets/scenes4d`` and ``assets/nerf``.
A client never sends a path.
A scene is a ``.ply`` or ``.splat`` file, a 4DGS ``.pth`` checkpoint or a NeRF folder.
A 4DGS scene plays at t = stream time, looping.
It is opened by :func:`~framegraph.renderers.scene_file.open_scene`.
The options may instead ask for a random scene.
The renderers are imported when a session first starts this pipeline.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import torch

from framegraph import assets
from framegraph.models.runtime import default_device
from framegraph.stream import Clock, Graph

from .base import Pipeline, PipelineSpec, add_video_out
from .options import FPS_RANGE, FileName, Integer, Number, VideoOptions, bad_option, option

log = logging.getLogger("framegraph.server")


class CameraPoses:
    """What the session pushes ``pose`` messages into, with ``push`` and ``close``.

    It feeds a :class:`CameraSource`. Each push becomes the camera's live pose.
    """

    def __init__(self, camera):
        self.camera = camera
        self.received = 0
        self.last: torch.Tensor | None = None

    def push(self, matrix) -> None:
        m = torch.as_tensor(matrix, dtype=torch.float32)
        self.camera.push_pose(m)
        self.last = m
        self.received += 1

    def close(self) -> None:
        """Nothing to do: the session drains the graph, which ends the camera source."""


def orbit_eye(target, distance: float, azimuth_deg: float, elevation_deg: float) -> list[float]:
    """Camera position on the orbit around ``target``, z up, as the web page computes it.

    Azimuth 0 looks from +y, 90 from −x.
    """
    az, el = math.radians(azimuth_deg), math.radians(elevation_deg)
    a, b = (0.0, 1.0, 0.0), (-1.0, 0.0, 0.0)
    return [target[i] + distance * (math.cos(el) * (math.cos(az) * a[i] + math.sin(az) * b[i])
                                    + math.sin(el) * (1.0 if i == 2 else 0.0)) for i in range(3)]


def scene_dirs() -> list[str]:
    """Where the server looks up a scene by name.

    It is ``$FRAMEGRAPH_SCENES``, one folder. Else it is the shipped 3DGS, 4DGS and NeRF scenes.
    """
    if os.environ.get("FRAMEGRAPH_SCENES"):
        return [os.environ["FRAMEGRAPH_SCENES"]]
    return [str(assets.path(kind)) for kind in ("scenes", "scenes4d", "nerf")]


SCENE = "the server's scene folder (a .ply / .splat / 4DGS .pth file or a NeRF folder)"


@dataclass
class SceneOptions(VideoOptions):
    fps: float | None = option(15.0, "video frames a second", Number(*FPS_RANGE))
    scene: str | None = option(None, "the scene to show, by name (default: a random one)", FileName(SCENE), alias="ply")
    gaussians: int | None = option(None, "(random scene) Gaussians in it (default 400 on the CPU, 20 000 on CUDA)",
                                   Integer(1, 2_000_000))
    seed: int = option(0, "(random scene) its seed", Integer(0, 2**31 - 1))


def _scene(opts: SceneOptions, on_cuda: bool):
    """The scene the options name, opened, or a random one."""
    from framegraph.renderers.gaussians import SceneError, random_scene  # heavy: the renderers
    from framegraph.renderers.nerf import NerfLoadError
    from framegraph.renderers.scene_file import GaussianSceneFile, open_scene
    from framegraph.renderers.stages import framing_for_points

    if opts.scene is None:
        data = random_scene(opts.gaussians or (20_000 if on_cuda else 400), sh_degree=0, seed=opts.seed)
        return GaussianSceneFile("random", data, framing_for_points(data.means))
    path = next((os.path.join(d, opts.scene) for d in scene_dirs() if os.path.exists(os.path.join(d, opts.scene))),
                None)
    if path is None:
        raise bad_option("scene", opts.key("scene"), opts.scene, f"the name of a scene in {SCENE} that exists")
    try:
        return open_scene(path)
    except (SceneError, NerfLoadError, ValueError, OSError) as exc:
        log.warning("scene: %r refused: %s", opts.scene, exc)
        raise bad_option("scene", opts.key("scene"), opts.scene, "another of the server's scenes (this one cannot be "
                                                                 "opened; the server's log says why)") from None


def orbit_camera(framing, opts: VideoOptions):
    """The orbit round the scene's ``framing`` that the initial pose is made from, and its camera.

    The orbit is ``ready``'s ``camera``.
    The camera is a :class:`~framegraph.renderers.stages.CameraSource` that starts there.
    It runs at the options' size and fps.
    """
    from framegraph.renderers.cameras import intrinsics, look_at  # heavy: the renderers
    from framegraph.renderers.stages import CameraSource

    orbit = {"target": [round(float(x), 6) for x in framing.center], "up": [0.0, 0.0, 1.0],
             "distance": round(framing.distance, 6), "azimuth_deg": 0.0, "elevation_deg": framing.elevation_deg,
             "fov_deg": framing.fov_deg}
    eye = orbit_eye(orbit["target"], orbit["distance"], orbit["azimuth_deg"], orbit["elevation_deg"])
    camera = CameraSource(initial_pose=look_at(eye, orbit["target"], orbit["up"]), fps=opts.fps, width=opts.width,
                          height=opts.height, K=intrinsics(opts.width, opts.height, fov_deg=framing.fov_deg))
    return orbit, camera


def build(opts: SceneOptions) -> Pipeline:
    device = default_device()
    scene = _scene(opts, device == "cuda")
    orbit, camera = orbit_camera(scene.framing, opts)
    graph = Graph(Clock("realtime"), name="scene")
    camera = graph.add(camera, max_in_flight=1)
    render = graph.add(scene.render_stage(width=opts.width, height=opts.height, device=device,
                                          background=(0.08, 0.08, 0.1), budget_ms=1000.0 / opts.fps))
    encoder, sink = add_video_out(graph, opts)
    graph.connect(camera, render, "camera", policy="drop_oldest")
    graph.connect(render, encoder, "video", policy="drop_oldest")
    return Pipeline(graph, sink, encoder=encoder, pose_in=CameraPoses(camera),
                    format={"video": opts.video_format(), "audio_out": None, "audio_in": None, "pose_in": True,
                            "camera": orbit, "scene": scene.kind, "gaussians": scene.size, "device": device})


PIPELINE = PipelineSpec("scene", "Gaussian-splat scene viewer: drag on the picture to orbit the camera (poses in, "
                                 "frames out)", SceneOptions, build)
