"""Posed images for NeRF fitting: the shared ``transforms.json`` loader with NeRF's defaults.

The format (instant-ngp / nerfstudio / Blender: camera-to-world OpenGL ``transform_matrix``,
``camera_angle_x`` or ``fl_x``/``fl_y``, images relative to the JSON, extension-less Blender paths) and
every check live in :mod:`framegraph.renderers.posed_images`, which ``framegraph fit`` uses too;
:class:`PosedImages` and :class:`DatasetError` are re-exported from there. The only difference here is
the default ``background``: white, the Blender synthetic scenes' convention for their RGBA images.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from ..posed_images import DatasetError, PosedImages
from ..posed_images import load_transforms as _load_transforms


def load_transforms(path: str | os.PathLike, *, downscale: int = 1,
                    background: Sequence[float] = (1.0, 1.0, 1.0), limit: int | None = None,
                    min_images: int = 1) -> PosedImages:
    """Read ``transforms.json`` and its images (relative to the JSON's folder), every ``downscale``-th
    pixel box-averaged, RGBA composited over ``background`` (default white), the first ``limit`` frames;
    frames without their image are skipped (fewer than ``min_images`` left is an error), lens distortion
    is undone.

    Raises :class:`DatasetError` naming the file and the problem.
    """
    return _load_transforms(path, downscale=downscale, background=background, limit=limit, min_images=min_images)


__all__ = ["load_transforms", "PosedImages", "DatasetError"]
