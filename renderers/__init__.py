"""Neural renderers: 3D and 4D Gaussian splatting, NeRF, cameras, and the stages that put them in a graph.

The index, by module. Each is imported when used; the package itself imports nothing::

    from framegraph.renderers.scene_file import open_scene      # any scene file → its render stage
    from framegraph.renderers.gaussians import rasterize, load_scene

- :mod:`.gaussians`: 3DGS. ``rasterize``, ``GaussianScene``, ``load_scene``; PLY and .splat files.
- :mod:`.gaussians4d`: 4DGS. ``rasterize_4d``, ``Gaussian4DScene``, ``Gaussian4DRenderStage``.
- :mod:`.nerf`: a hash-grid NeRF. ``NerfModel``, ``load_nerf``, ``render_rays``, ``fit``.
- :mod:`.nerf_options`: the NeRF's options, without torch.
- :mod:`.fit`: fits a 3DGS scene to posed images. ``Fitter``, ``FitConfig``.
- :mod:`.posed_images`: the posed pictures it reads, from ``transforms.json``.
- :mod:`.cameras`: camera paths. ``look_at``, ``intrinsics``, ``orbit_path``, ``KeyframePath``.
- :mod:`.scene_file`: any scene file by its kind. ``open_scene``, the ``SceneFile`` protocol.
- :mod:`.stages`: ``CameraSource``, ``GaussianRenderStage``.
- :mod:`.billboard`: a picture placed in a scene, ``QuadInScene``.
- :mod:`.scenes`: procedural test scenes.
- :mod:`.capacity`: fixed-capacity work lists.
"""
