"""``framegraph render --scene``'s graph: a 3DGS / 4DGS / NeRF scene rendered along an orbit or a camera path."""
from __future__ import annotations

from framegraph.models.runtime import default_device
from framegraph.renderers.cameras import load_nerfstudio_camera_path
from framegraph.renderers.scene_file import open_scene
from framegraph.renderers.stages import CameraSource
from framegraph.stream import Clock, Graph
from framegraph.stream.media import MP4Sink


def build_scene_graph(scene_path: str, out: str, width: int, height: int, fps: float, seconds: float,
                      camera_path: str | None = None, device: str | None = None,
                      preset: str = "offline", time_duration: tuple[float, float] | None = None,
                      time_scale: float = 1.0) -> tuple[Graph, MP4Sink, int]:
    """CameraSource → renderer → MP4Sink, video only.

    The source is an orbit or a nerfstudio path. The renderer is 3DGS, 4DGS at t = frame time, or NeRF."""
    device = device or default_device()
    scene = open_scene(scene_path, time_duration=time_duration)
    if camera_path:
        path = load_nerfstudio_camera_path(camera_path)
        if (path.width, path.height) != (width, height):  # render at the requested size, same fov
            sx, sy = width / path.width, height / path.height
            path.Ks[:, 0] *= sx
            path.Ks[:, 1] *= sy
            path.width, path.height = width, height
        n_frames = len(path)
    else:
        n_frames = max(1, round(seconds * fps))
        path = scene.framing.orbit(n_frames, width, height, fps)
    graph = Graph(Clock("fast"), name="render-scene")
    cams = graph.add(CameraSource(path, fps=fps, n_frames=n_frames))
    render = graph.add(scene.render_stage(width=width, height=height, device=device, time_scale=time_scale))
    sink = graph.add(MP4Sink(out, width=width, height=height, fps=fps, audio_rate=None, preset=preset))
    graph.connect(cams, render)
    graph.connect(render, sink)
    return graph, sink, n_frames

