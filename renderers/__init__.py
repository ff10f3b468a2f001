"""Neural renderers: 3D and 4D Gaussian splatting, NeRF, cameras, and the stages that put them in a graph.

The index (each name is imported from its module when first used, so importing the package costs nothing)::

    from framegraph.renderers import rasterize, load_scene, orbit_path, open_scene

- :mod:`.gaussians`: 3DGS (``rasterize``, ``GaussianScene``, ``load_scene``; PLY and .splat files);
- :mod:`.gaussians4d`: 4DGS (``rasterize_4d``, ``Gaussian4DScene``, ``Gaussian4DRenderStage``);
- :mod:`.nerf`: a hash-grid NeRF (``NerfModel``, ``load_nerf``, ``render_rays``, ``fit``);
- :mod:`.fit`: fitting a 3DGS scene to posed images (``Fitter``, ``FitConfig``);
- :mod:`.cameras`: camera paths (``look_at``, ``intrinsics``, ``orbit_path``, ``KeyframePath``);
- :mod:`.scene_file`: any scene file by its kind (``open_scene``, ``scene_kind``);
- :mod:`.stages`: ``CameraSource``, ``GaussianRenderStage``; :mod:`.billboard`: a picture placed in a scene
  (``QuadInScene``); :mod:`.scenes`: procedural test scenes; :mod:`.capacity`: per-device work limits.
"""
from __future__ import annotations

from framegraph.stream.lazy import lazy_index

_INDEX = {
    **dict.fromkeys(("rasterize", "GaussianScene", "SceneError", "load_scene", "load_ply", "save_ply", "load_splat",
                     "random_scene"), ".gaussians"),
    **dict.fromkeys(("rasterize_4d", "Gaussian4DScene", "Gaussian4DRenderStage", "random_scene_4d"), ".gaussians4d"),
    **dict.fromkeys(("NerfModel", "NerfConfig", "load_nerf", "render_rays", "NerfLoadError"), ".nerf"),
    **dict.fromkeys(("Fitter", "FitConfig"), ".fit"),
    **dict.fromkeys(("look_at", "intrinsics", "orbit_path", "CameraPath", "KeyframePath",
                     "load_nerfstudio_camera_path"), ".cameras"),
    **dict.fromkeys(("SceneFile", "open_scene", "scene_kind"), ".scene_file"),
    **dict.fromkeys(("CameraSource", "RenderStage", "GaussianRenderStage"), ".stages"),
    **dict.fromkeys(("Placement", "QuadInScene"), ".billboard"),
    **dict.fromkeys(("ProceduralScene", "procedural_scene"), ".scenes"),
}
__all__ = sorted(_INDEX)
__getattr__, __dir__ = lazy_index(__name__, _INDEX)
