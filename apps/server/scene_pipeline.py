"""The ``scene`` pipeline: a Gaussian-splat scene viewer driven by the client's camera poses.

    camera (CameraSource, newest pushed pose, at fps) → gaussians (GaussianRenderStage) → encode → send

The client orbits the camera (the web page: drag on the picture, wheel to zoom) and sends ``pose``
messages; each rendered frame uses the newest pose (poses never queue). ``ready`` carries ``camera``:
the orbit the initial pose was made from (``target``, ``up``, ``distance``, ``azimuth_deg``,
``elevation_deg``, ``fov_deg``, the vertical field of view), so a client starts where the server does.

Options (besides the common video ones): ``gaussians`` (random scene size, default 400 on the CPU,
20 000 on CUDA), ``seed`` (0), ``ply``: a ``.ply`` / ``.splat`` file by name in the server's scene
folder (:data:`SCENES_DIR`: ``$FRAMEGRAPH_SCENES``, default ``assets/scenes``; never a client path).
Loaded lazily (see ``pipelines.LAZY``), so the renderers are imported on first use only.
"""
from __future__ import annotations

import math
import os

import torch

from framegraph.renderers.cameras import intrinsics, look_at
from framegraph.renderers.gaussians import SceneError, load_scene, random_scene
from framegraph.renderers.stages import CameraSource, GaussianRenderStage
from framegraph.stream import Clock, Graph

from .pipelines import Options, Pipeline, add_video_out, register, video_options
from .protocol import ErrorCode, ProtocolError

SCENES_DIR = os.environ.get("FRAMEGRAPH_SCENES") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets", "scenes")
FOV_DEG = 50.0


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


def _load(opts: Options, on_cuda: bool):
    n = opts.integer("gaussians", 20_000 if on_cuda else 400, 1, 2_000_000)
    seed = opts.integer("seed", 0, 0, 2**31 - 1)
    name = opts._get("ply")
    if name is None:
        return random_scene(n, sh_degree=0, seed=seed)
    if not isinstance(name, str) or os.path.basename(name) != name or name.startswith(".") \
            or not name.lower().endswith((".ply", ".splat")):
        raise opts._bad("ply", name, "the name of a .ply or .splat file in the server's scene folder")
    path = os.path.join(SCENES_DIR, name)
    if not os.path.isfile(path):
        raise opts._bad("ply", name, f"a scene file that exists in the server's scene folder")
    try:
        return load_scene(path)
    except (SceneError, OSError) as exc:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"scene: option 'ply' = {name!r}: {exc}") from None


@register("scene", "Gaussian-splat scene viewer: drag on the picture to orbit the camera (poses in, frames out)")
def build_scene(opts: Options) -> Pipeline:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    v = video_options(opts, size=(320, 240), fps=15.0)
    scene = _load(opts, device == "cuda")
    opts.done()
    means = scene.means.detach().to("cpu", torch.float64)
    target = means.median(dim=0).values
    radius = float(torch.quantile((means - target).norm(dim=1), 0.9)) if scene.n > 1 else 1.0
    orbit = {"target": [round(float(x), 6) for x in target], "up": [0.0, 0.0, 1.0],
             "distance": round(2.2 * max(radius, 1e-3), 6), "azimuth_deg": 0.0, "elevation_deg": 20.0,
             "fov_deg": FOV_DEG}
    eye = orbit_eye(orbit["target"], orbit["distance"], orbit["azimuth_deg"], orbit["elevation_deg"])
    graph = Graph(Clock("realtime"), name="scene")
    camera = graph.add(CameraSource(initial_pose=look_at(eye, orbit["target"], orbit["up"]), fps=v.fps,
                                    width=v.width, height=v.height,
                                    K=intrinsics(v.width, v.height, fov_deg=FOV_DEG)), max_in_flight=1)
    render = graph.add(GaussianRenderStage(scene, width=v.width, height=v.height, device=device,
                                           background=(0.08, 0.08, 0.1), budget_ms=1000.0 / v.fps))
    encoder, sink = add_video_out(graph, v)
    graph.connect(camera, render, "camera", policy="drop_oldest")
    graph.connect(render, encoder, "video", policy="drop_oldest")
    return Pipeline(graph, sink, encoder=encoder, pose_in=CameraPoses(camera),
                    format={"video": v.describe(), "audio_out": None, "audio_in": None, "pose_in": True,
                            "camera": orbit, "gaussians": scene.n, "device": device})
