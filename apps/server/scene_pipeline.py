"""The ``scene`` pipeline: a scene viewer (3DGS, 4DGS or NeRF) driven by the client's camera poses.

    camera (CameraSource, newest pushed pose, at fps) → render (the scene's RenderStage) → encode → send

The client orbits the camera (the web page: drag on the picture, wheel to zoom) and sends ``pose``
messages; each rendered frame uses the newest pose (poses never queue). ``ready`` carries ``camera``:
the orbit the initial pose was made from (``target``, ``up``, ``distance``, ``azimuth_deg``,
``elevation_deg``, ``fov_deg``, the vertical field of view), so a client starts where the server does.

Options (besides the common video ones): ``gaussians`` (random scene size, default 400 on the CPU,
20 000 on CUDA), ``seed`` (0), ``scene`` (or its first name ``ply``): a scene by name in the server's
scene folder (:func:`scene_dirs`: ``$FRAMEGRAPH_SCENES``, default the shipped ``assets/scenes``,
``assets/scenes4d`` and ``assets/nerf``; never a client path) — a ``.ply`` / ``.splat`` file, a 4DGS
``.pth`` checkpoint (played at t = stream time, looping) or a NeRF folder; opened by
:func:`~framegraph.renderers.scene_file.open_scene`.
Loaded lazily (see ``pipelines.LAZY``), so the renderers are imported on first use only.
"""
from __future__ import annotations

import math
import os

import torch

from framegraph import assets
from framegraph.renderers.cameras import intrinsics, look_at
from framegraph.renderers.gaussians import SceneError, random_scene
from framegraph.renderers.nerf import NerfLoadError
from framegraph.renderers.scene_file import SceneFile, open_scene
from framegraph.renderers.stages import CameraSource, framing_for_points
from framegraph.stream import Clock, Graph

from .pipelines import Options, Pipeline, add_video_out, register, video_options
from .protocol import ErrorCode, ProtocolError


class CameraPoses:
    """What the session pushes ``pose`` messages into (``push`` / ``close``), for a
    :class:`CameraSource`: each push becomes the camera's live pose."""

    def __init__(self, camera: CameraSource):
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
    """Camera position on the orbit around ``target`` (z up), as the web page computes it:
    azimuth 0 looks from +y, 90 from −x."""
    az, el = math.radians(azimuth_deg), math.radians(elevation_deg)
    a, b = (0.0, 1.0, 0.0), (-1.0, 0.0, 0.0)
    return [target[i] + distance * (math.cos(el) * (math.cos(az) * a[i] + math.sin(az) * b[i])
                                    + math.sin(el) * (1.0 if i == 2 else 0.0)) for i in range(3)]


def scene_dirs() -> list[str]:
    """Where the server looks up a scene by name: ``$FRAMEGRAPH_SCENES`` (one folder), else the shipped
    3DGS, 4DGS and NeRF scenes."""
    if os.environ.get("FRAMEGRAPH_SCENES"):
        return [os.environ["FRAMEGRAPH_SCENES"]]
    return [str(assets.path(kind)) for kind in ("scenes", "scenes4d", "nerf")]


def _load(opts: Options, on_cuda: bool) -> SceneFile:
    n = opts.integer("gaussians", 20_000 if on_cuda else 400, 1, 2_000_000)
    seed = opts.integer("seed", 0, 0, 2**31 - 1)
    key = "scene" if opts._get("scene") is not None else "ply"  # "ply": its first name, still accepted
    name = opts._get(key)
    if name is None:
        data = random_scene(n, sh_degree=0, seed=seed)
        return SceneFile("random", "3dgs", data, framing_for_points(data.means))
    expected = "the name of a scene in the server's scene folder (a .ply / .splat / 4DGS .pth file or a NeRF folder)"
    if not isinstance(name, str) or os.path.basename(name) != name or name.startswith("."):
        raise opts._bad(key, name, expected)
    path = next((os.path.join(d, name) for d in scene_dirs() if os.path.exists(os.path.join(d, name))), None)
    if path is None:
        raise opts._bad(key, name, expected + " that exists")
    try:
        return open_scene(path)
    except (SceneError, NerfLoadError, ValueError, OSError) as exc:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"scene: option {key!r} = {name!r}: {exc}") from None


@register("scene", "Gaussian-splat scene viewer: drag on the picture to orbit the camera (poses in, frames out)")
def build_scene(opts: Options) -> Pipeline:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    v = video_options(opts, size=(320, 240), fps=15.0)
    scene = _load(opts, device == "cuda")
    opts.done()
    framing = scene.framing
    orbit = {"target": [round(float(x), 6) for x in framing.center], "up": [0.0, 0.0, 1.0],
             "distance": round(framing.distance, 6), "azimuth_deg": 0.0, "elevation_deg": framing.elevation_deg,
             "fov_deg": framing.fov_deg}
    eye = orbit_eye(orbit["target"], orbit["distance"], orbit["azimuth_deg"], orbit["elevation_deg"])
    graph = Graph(Clock("realtime"), name="scene")
    camera = graph.add(CameraSource(initial_pose=look_at(eye, orbit["target"], orbit["up"]), fps=v.fps,
                                    width=v.width, height=v.height,
                                    K=intrinsics(v.width, v.height, fov_deg=framing.fov_deg)), max_in_flight=1)
    render = graph.add(scene.render_stage(width=v.width, height=v.height, device=device,
                                          background=(0.08, 0.08, 0.1), budget_ms=1000.0 / v.fps))
    encoder, sink = add_video_out(graph, v)
    graph.connect(camera, render, "camera", policy="drop_oldest")
    graph.connect(render, encoder, "video", policy="drop_oldest")
    return Pipeline(graph, sink, encoder=encoder, pose_in=CameraPoses(camera),
                    format={"video": v.describe(), "audio_out": None, "audio_in": None, "pose_in": True,
                            "camera": orbit, "scene": scene.kind, "gaussians": scene.size, "device": device})
