"""A synthetic clip's frames without the video codec, re-rendered from its ground-truth JSON.

A clip's MP4 is H.264, crf 20 by default. The codec alone loses detail; docs/generate.md gives the figures.
Its JSON holds everything the frames were drawn from.
That is the portrait's geometry and every frame's :class:`~.render.FaceParams`.
``framegraph avatar synth`` keeps the exact portrait image it drew on as ``portrait.png`` next to the clips.
So the frames can be drawn again, losslessly, as training targets::

    frames = render_truth("data/synth/clip_00003.json")      # uint8 [T, H, W, 3], equal to what was encoded

Parameters are stored to 4 decimals, so a redraw differs from the original by rounding only.
Folders without ``portrait.png`` still work when their portrait is the shipped astronaut.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from framegraph.stream.files import written_whole

from .portrait import Portrait, astronaut_portrait
from .render import FaceParams, PortraitRenderer

PORTRAIT_PNG = "portrait.png"
MOUTH_KEYS = ("jaw_open", "lip_width", "lip_round", "teeth")  # what every frame entry must have


def face_params(frame: dict) -> FaceParams:
    """One entry of the JSON's ``frames`` list → :class:`FaceParams`."""
    head = frame.get("head") or {}
    return FaceParams(jaw_open=frame["jaw_open"], lip_width=frame["lip_width"], lip_round=frame["lip_round"],
                      teeth=frame["teeth"], blink=frame.get("blink", 0.0), head_dx=head.get("dx", 0.0),
                      head_dy=head.get("dy", 0.0), head_roll_deg=head.get("roll_deg", 0.0),
                      head_scale=head.get("scale", 1.0))


def save_portrait_image(folder, portrait: Portrait) -> None:
    """Write ``folder/portrait.png``, the image the clips are drawn on, unless it is already there."""
    from PIL import Image

    path = Path(folder) / PORTRAIT_PNG
    if path.exists():
        return
    with written_whole(path) as tmp:
        Image.fromarray(np.asarray(portrait.image, dtype=np.uint8)).save(tmp)


def clips_portrait(meta: dict | None, folder) -> np.ndarray | None:
    """The exact image a folder's synthetic clips were drawn on, ``uint8 [H, W, 3]``.

    It is the folder's ``portrait.png``.
    Or it is the shipped astronaut, when the clips' ``portrait`` block in ``meta`` names it.
    None when unknown, or when its size is not the clips'.
    """
    if not meta:
        return None
    size = [meta.get("width"), meta.get("height")]
    path = Path(folder) / PORTRAIT_PNG
    if path.is_file():
        from PIL import Image

        with Image.open(path) as im:
            image = np.asarray(im.convert("RGB"))
    elif meta.get("name") == "astronaut":
        image = astronaut_portrait().image
    else:
        return None
    return image if [image.shape[1], image.shape[0]] == size else None


def _has_parameters(meta, frames) -> bool:
    return isinstance(meta, dict) and "lip_line_y" in meta and "mouth_box" in meta and bool(frames) and \
        all(isinstance(f, dict) and all(k in f for k in MOUTH_KEYS) for f in frames)


def can_render_truth(json_path) -> bool:
    """True when the clip's JSON has per-frame face parameters and its portrait image can be found."""
    path = Path(json_path)
    try:
        truth = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    frames, meta = truth.get("frames"), truth.get("portrait")
    if not _has_parameters(meta, frames):
        return False
    return clips_portrait(meta, path.parent) is not None


def render_truth(json_path, *, max_frames: int | None = None) -> torch.Tensor:
    """The clip's frames drawn again from ``json_path``: ``uint8 [T, H, W, 3]``.

    T is its frame count, or ``max_frames``.
    Raises ``ValueError`` naming what is missing when the clip cannot be redrawn.
    """
    path = Path(json_path)
    truth = json.loads(path.read_text())
    meta, frames = truth.get("portrait"), truth.get("frames") or []
    if not _has_parameters(meta, frames):
        raise ValueError(f"{os.fspath(path)!r} is not a `framegraph avatar synth` ground truth (no portrait geometry "
                         "or per-frame face parameters), so its frames cannot be redrawn")
    image = clips_portrait(meta, path.parent)
    if image is None:
        raise ValueError(f"{os.fspath(path)!r}: the portrait image it was drawn on is not in the folder "
                         f"({PORTRAIT_PNG}, {meta.get('width')}x{meta.get('height')}); make the clips again with "
                         "`framegraph avatar synth`")
    portrait = Portrait(np.array(image, copy=True), tuple(meta["mouth_box"]), float(meta["lip_line_y"]),
                        [tuple(b) for b in meta.get("eye_boxes") or []],
                        tuple(meta["face_box"]) if meta.get("face_box") else None, float(meta.get("lip_curve", 0.0)),
                        str(meta.get("name", "portrait")), str(meta.get("source", "")))
    renderer = PortraitRenderer(portrait)
    frames = frames[:max_frames] if max_frames is not None else frames
    return torch.stack([renderer.render(face_params(f)) for f in frames])


__all__ = ["PORTRAIT_PNG", "can_render_truth", "clips_portrait", "face_params", "render_truth", "save_portrait_image"]
