"""Face-region training data for the video VAE: synthetic talking clips cropped to the face.

A clip folder holds ``clip_NNNNN.mp4`` + ``clip_NNNNN.json`` pairs, as ``framegraph avatar synth`` writes
them. The JSON's ``portrait`` block gives the face and mouth boxes, in px of the full frame. Each entry of
``frames`` gives the jaw opening and head shift of that frame. Each frame's mouth box is derived from them
by :func:`mouth_box_for_frame`. Every clip of one folder is cropped with one square box, from
:func:`face_crop_box`. The ``Composite`` stage pastes the generated region back at the same box.

Boxes are ``(x, y, w, h)`` in pixels. Frames are ``uint8 [T, S, S, 3]`` at the region size ``S``.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from framegraph.models.synth import can_render_truth, render_truth
from framegraph.stream.media import read_video

Box = tuple[float, float, float, float]


def face_crop_box(image_hw: tuple[int, int], face_box: Box | None = None, mouth_box: Box | None = None, *,
                  scale: float = 1.35, shift_down: float = 0.1) -> tuple[int, int, int, int]:
    """The square region the model works on, in px of an ``image_hw = (H, W)`` frame.

    From the face box, the side is ``scale × max(face w, h)``. The box is centred below the face centre, by
    ``shift_down × face h``. So an open jaw stays inside. Without a face box it comes from the mouth box.
    Then the side is ``3 × mouth w``, centred a quarter side above the mouth centre. The box is moved, not
    shrunk, to lie inside the image. It is shrunk only when the image is smaller than it. Returns integer
    ``(x, y, s, s)``.
    """
    h_img, w_img = int(image_hw[0]), int(image_hw[1])
    if face_box is not None:
        fx, fy, fw, fh = (float(v) for v in face_box)
        side = scale * max(fw, fh)
        cx, cy = fx + fw / 2, fy + fh / 2 + shift_down * fh
    elif mouth_box is not None:
        mx, my, mw, mh = (float(v) for v in mouth_box)
        side = 3.0 * mw
        cx, cy = mx + mw / 2, my + mh / 2 - 0.25 * side
    else:
        raise ValueError("face_crop_box: give a face_box or a mouth_box (x, y, w, h in px)")
    side = int(min(round(side), h_img, w_img))
    if side < 16:
        raise ValueError(f"face_crop_box: the face region would be {side} px wide; the portrait is too small "
                         f"(image {w_img}x{h_img}, face {face_box}, mouth {mouth_box})")
    x = int(min(max(round(cx - side / 2), 0), w_img - side))
    y = int(min(max(round(cy - side / 2), 0), h_img - side))
    return x, y, side, side


def region_size(image_hw: tuple[int, int], face_box: Box, *, scale: float = 1.35) -> int:
    """Side in px of the square region to generate for a face.

    It is the side of the face's :func:`face_crop_box`, the box the composite pastes back at. It is rounded to
    a multiple of 16, the VAE's compression, within [64, 256]. So the region is drawn at about the face's own
    resolution. A 64-px region is not blown up over a 260-px face. The cap of 256² is the CPU real-time
    budget. Larger faces are generated at 256² and scaled up by the paste. The VAE works at 64² at least."""
    side = face_crop_box(image_hw, face_box, scale=scale)[2]
    return int(min(max(round(side / 16) * 16, 64), 256))


def mouth_box_for_frame(portrait: dict, frame: dict | None = None, *, margin: float = 3.0,
                        max_jaw_drop: float = 0.32) -> Box:
    """The mouth box of one synthetic frame, px of the full frame.

    ``portrait`` is a clip JSON's ``portrait`` block. ``frame`` is one entry of its ``frames``; None is the
    rest pose. The portrait's mouth box is moved by the head shift. It is grown downwards by the jaw drop, as the
    renderer draws it. The drop is ``jaw_open · max_jaw_drop · 2 · half mouth width``. It is grown by ``margin`` px
    on every side."""
    x, y, w, h = (float(v) for v in portrait["mouth_box"])
    dx = dy = drop = 0.0
    if frame is not None:
        head = frame.get("head", {})
        dx, dy = float(head.get("dx", 0.0)), float(head.get("dy", 0.0))
        drop = max(0.0, float(frame.get("jaw_open", 0.0))) * max_jaw_drop * w
    return (x + dx - margin, y + dy - margin, w + 2 * margin, h + drop + 2 * margin)


def box_to_region(box: Box, crop: tuple[int, int, int, int], size: int) -> Box:
    """A box in full-frame px → px of the ``size × size`` region cut at ``crop`` and resized."""
    s = size / crop[2]
    return ((box[0] - crop[0]) * s, (box[1] - crop[1]) * s, box[2] * s, box[3] * s)


def crop_frames(frames: Tensor, crop: tuple[int, int, int, int], size: int) -> Tensor:
    """``uint8 [T, H, W, 3]`` → the ``crop`` box resized to ``uint8 [T, size, size, 3]``.

    Resizing is bilinear, antialiased when shrinking."""
    x, y, w, h = crop
    if x < 0 or y < 0 or x + w > frames.shape[2] or y + h > frames.shape[1]:
        raise ValueError(f"crop box {crop} is outside the {frames.shape[2]}x{frames.shape[1]} frames")
    region = frames[:, y:y + h, x:x + w]
    if (h, w) == (size, size):
        return region.contiguous()
    f = region.permute(0, 3, 1, 2).float()
    f = F.interpolate(f, size=(size, size), mode="bilinear", align_corners=False, antialias=size < h)
    return f.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


@dataclass
class FaceClips:
    """Face-region clips to train or evaluate on.

    Attributes:
        frames: one ``uint8 [T_i, S, S, 3]`` tensor per clip.
        mouth_boxes: one ``float32 [T_i, 4]`` per clip: the mouth box of each frame in region px.
            None means no mouth weighting.
        crop_box: the ``(x, y, s, s)`` full-frame box the region was cut from. None if not known.
        names: a name per clip, the file stem.
        targets: what a decoder should give back for each clip, ``uint8 [T_i, S, S, 3]``. None means the
            frames themselves. Synthetic clips can have their frames redrawn here without the video codec.
            The model then learns the clean picture. Its encoder still reads the decoded video, as at run time.
    """

    frames: list[Tensor]
    mouth_boxes: list[Tensor] | None = None
    crop_box: tuple[int, int, int, int] | None = None
    names: list[str] = field(default_factory=list)
    targets: list[Tensor] | None = None

    def target(self, i: int) -> Tensor:
        """Clip ``i``'s reconstruction target: its redrawn frames, or else the frames."""
        return self.frames[i] if self.targets is None else self.targets[i]

    @property
    def size(self) -> int:
        return int(self.frames[0].shape[1])

    @property
    def n_frames(self) -> int:
        return sum(int(f.shape[0]) for f in self.frames)

    def split(self, holdout_fraction: float = 0.15) -> tuple[FaceClips, FaceClips]:
        """(train, held out).

        With several clips the last ``max(1, round(fraction · n))`` clips are held out. With one clip, its last
        ``fraction`` of frames is held out."""
        n = len(self.frames)
        if n >= 2:
            k = min(n - 1, max(1, round(holdout_fraction * n)))
            pick = lambda lst, sl: None if lst is None else lst[sl]  # noqa: E731 (per-clip lists)
            return tuple(FaceClips(self.frames[sl], pick(self.mouth_boxes, sl), self.crop_box, self.names[sl],
                                   pick(self.targets, sl)) for sl in (slice(None, -k), slice(-k, None)))
        t = int(self.frames[0].shape[0])
        if t < 2:
            raise ValueError("FaceClips.split: one clip of one frame cannot be split into train and held out")
        cut = max(1, min(t - 1, t - math.ceil(holdout_fraction * t)))
        pick = lambda lst, sl: None if lst is None else [lst[0][sl]]  # noqa: E731 (frames of the one clip)
        return tuple(FaceClips(pick(self.frames, sl), pick(self.mouth_boxes, sl), self.crop_box, self.names,
                               pick(self.targets, sl)) for sl in (slice(None, cut), slice(cut, None)))


def face_clips_from_frames(frames: Tensor, mouth_boxes: Tensor | None = None) -> FaceClips:
    """Frames already cut to the region, in region px.

    ``frames`` is ``uint8 [T, S, S, 3]`` for one clip, or ``[N, T, S, S, 3]``. ``mouth_boxes`` is ``[T, 4]``
    or ``[N, T, 4]``. It may be ``[4]``, one box for every frame."""
    if frames.dtype != torch.uint8 or frames.dim() not in (4, 5) or frames.shape[-1] != 3:
        raise ValueError(f"face_clips_from_frames: expected uint8 [T, S, S, 3] or [N, T, S, S, 3] frames, got "
                         f"{frames.dtype} {list(frames.shape)}")
    if frames.shape[-2] != frames.shape[-3]:
        raise ValueError(f"face_clips_from_frames: frames must be square regions, got {list(frames.shape)}")
    clips = [frames] if frames.dim() == 4 else list(frames)
    boxes = None
    if mouth_boxes is not None:
        mouth_boxes = torch.as_tensor(mouth_boxes, dtype=torch.float32)
        boxes = []
        for i, c in enumerate(clips):
            b = mouth_boxes if mouth_boxes.dim() == 1 else (mouth_boxes if mouth_boxes.dim() == 2 else mouth_boxes[i])
            boxes.append(b.expand(c.shape[0], 4).clone())
    return FaceClips(clips, boxes, None, [f"clip{i}" for i in range(len(clips))])


def load_face_clips(clips_dir, *, size: int = 128, crop_box: tuple[int, int, int, int] | None = None,
                    max_clips: int | None = None, crop_scale: float = 1.35,
                    redraw_targets: bool = False) -> FaceClips:
    """Read ``clip_*.mp4`` + ``clip_*.json`` from ``clips_dir`` and cut every frame to the face region.

    The crop box is the same for all clips. It is ``crop_box``, or :func:`face_crop_box` of the first clip's
    portrait. ``redraw_targets``: also redraw each synthetic clip's frames from its JSON, without the codec.
    They become :attr:`FaceClips.targets`, drawn by :func:`framegraph.models.synth.render_truth`. Check first
    with :func:`redrawable`. Raises ``FileNotFoundError`` or ``ValueError`` naming the folder or file. That
    happens when there are no clips, a clip has no JSON, or frame counts disagree."""

    folder = Path(clips_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"clips folder {str(folder)!r} does not exist; make clips with "
                                f"`framegraph avatar synth --out {folder}`")
    videos = sorted(folder.glob("clip_*.mp4"))[:max_clips]
    if not videos:
        raise FileNotFoundError(f"no clip_*.mp4 in {str(folder)!r}; make clips with "
                                f"`framegraph avatar synth --out {folder}`")
    frames, boxes, names, targets = [], [], [], []
    for video in videos:
        truth_path = video.with_suffix(".json")
        if not truth_path.exists():
            raise FileNotFoundError(f"{os.fspath(video)!r} has no ground truth {truth_path.name!r} next to it")
        truth = json.loads(truth_path.read_text())
        pixels = torch.from_numpy(read_video(video)["frames"])
        if pixels.shape[0] == 0:
            raise ValueError(f"{os.fspath(video)!r} has no frames")
        portrait = truth["portrait"]
        if crop_box is None:
            crop_box = face_crop_box(pixels.shape[1:3], portrait.get("face_box"), portrait.get("mouth_box"),
                                     scale=crop_scale)
        per_frame = truth.get("frames", [])
        n = min(len(per_frame), pixels.shape[0]) if per_frame else pixels.shape[0]
        frames.append(crop_frames(pixels[:n], crop_box, size))
        if redraw_targets:
            clean = render_truth(truth_path, max_frames=n)
            if clean.shape != pixels[:n].shape:
                raise ValueError(f"{os.fspath(truth_path)!r}: the redrawn frames {list(clean.shape)} do not match the "
                                 f"video's {list(pixels[:n].shape)}")
            targets.append(crop_frames(clean, crop_box, size))
        boxes.append(torch.tensor([box_to_region(mouth_box_for_frame(portrait, per_frame[i] if per_frame else None),
                                                 crop_box, size) for i in range(n)], dtype=torch.float32))
        names.append(video.stem)
    return FaceClips(frames, boxes, crop_box, names, targets if redraw_targets else None)


def redrawable(clips_dir, max_clips: int | None = None) -> bool:
    """True when every clip of the folder can be redrawn from its JSON.

    Then ``load_face_clips(..., redraw_targets=True)`` will work. That needs synthetic clips whose portrait
    image is known."""

    videos = sorted(Path(clips_dir).glob("clip_*.mp4"))[:max_clips]
    return bool(videos) and all(can_render_truth(v.with_suffix(".json")) for v in videos)
