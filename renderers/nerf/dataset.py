"""Posed images for NeRF fitting: the shared ``transforms.json`` loader with NeRF's defaults.

The format and every check live in :mod:`framegraph.renderers.posed_images`. ``framegraph fit`` uses it too.
The format is instant-ngp's, nerfstudio's and Blender's. It has a camera-to-world OpenGL ``transform_matrix``
and ``camera_angle_x`` or ``fl_x``/``fl_y``. Images are relative to the JSON. Blender paths may lack an
extension. :class:`PosedImages` and :class:`DatasetError` are re-exported from there. The only difference here
is the default ``background``. It is white, the Blender synthetic scenes' convention for their RGBA images.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from ..posed_images import DatasetError, PosedImages
from ..posed_images import load_transforms as _load_transforms


def load_transforms(path: str | os.PathLike, *, downscale: int = 1,
                    background: Sequence[float] = (1.0, 1.0, 1.0), limit: int | None = None,
                    min_images: int = 1) -> PosedImages:
    """Read ``transforms.json`` and its images, relative to the JSON's folder.

    Every ``downscale``-th pixel is box-averaged. RGBA is composited over ``background``, default white. Only
    the first ``limit`` frames are read. Frames without their image are skipped. Fewer than ``min_images`` left
    is an error. Lens distortion is undone.

    Raises :class:`DatasetError` naming the file and the problem.
    """
    return _load_transforms(path, downscale=downscale, background=background, limit=limit, min_images=min_images)


__all__ = ["load_transforms", "PosedImages", "DatasetError"]
