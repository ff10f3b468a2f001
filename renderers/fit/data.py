"""Posed images to fit: a folder of images and a camera file, or a procedural scene's renders.

The camera file, ``--cameras FILE.json``, is a nerfstudio, instant-ngp or Blender ``transforms.json``. The
shared loader :func:`framegraph.renderers.posed_images.load_transforms` reads it and describes the format.
:class:`PosedImages` and :class:`DatasetError` come from the same module and are re-exported here. This module
adds :func:`synthetic_dataset`, the procedural scene's posed renders.
"""
from __future__ import annotations

from ..posed_images import DatasetError, PosedImages, load_transforms
from ..scenes import procedural_scene


def synthetic_dataset(name: str, n_views: int, width: int, height: int, *, seed: int = 0,
                      held_out: bool = False, supersample: int = 2) -> PosedImages:
    """Render ``n_views`` posed images of the procedural scene ``name``.

    ``held_out`` picks views between the training ones."""

    scene = procedural_scene(name)
    views = scene.views(n_views, width, height, seed=seed + (1 if held_out else 0),
                        offset=0.5 if held_out else 0.0)
    images, _ = scene.render(views.viewmats, views.Ks, width, height, supersample=supersample)
    kind = "held-out" if held_out else "train"
    return PosedImages(images, views.viewmats, views.Ks, [f"{kind}_{i:03d}" for i in range(n_views)],
                       source=f"synthetic:{name}")


__all__ = ["PosedImages", "DatasetError", "synthetic_dataset", "load_transforms"]
