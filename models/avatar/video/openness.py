"""How open the generator draws the mouth the shape head asks for, and the head made to ask for the right level.

The generator's openness is measured on the avatar's own loop frames. The head is then made to ask for more or less. On
average the drawn mouth then lands on the person's openness.

The generator learns each training frame's lower face from that frame's measured shape. Yet it need not draw the mouth
as open as the person's. The head's shapes are smoother than the person's. They are drawn less open again. At the end of
training, :func:`drawn_openness` redraws loop frames. It uses the shapes the head asks for. The head hears the training
frames' sound. This is as the avatar plays. A loop frame meets the shape the voice asks for. The face landmarks measure
the drawn frames.

:func:`openness_offset` compares the drawn openness with the person's own in those frames. It says how far it falls
short. It is in standard deviations of the asked openness. The drawn openness rises by the slope of a least-squares line
per asked std. The result is the shift that closes the gap. It is added by :func:`calibrate_openness`, to the head's
openness and to the rest shape. The head stays one linear map. So the runtimes and the ONNX export are unchanged.

Training then has the other shape numbers follow the new openness along the person's lines
(:func:`~.lipsync.follow_openness`). So the generator opens the mouth with the matching width and roundness. A wider
openness asked alone is drawn far less wide. Only the level is moved. The swing is not stretched by the line's slope.
That overshot the person's swing on held-out speech (benchmarks/README.md). Where the generator draws what it is asked,
the shift is 0.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from framegraph.models.face import FaceLandmarker

from .jaw import kept_share
from .lipsync import ShapeHead
from .stages import MouthRegion

OPENNESS_FRAMES = 160  # loop frames redrawn and measured at the end of training
MIN_FRAMES = 24  # the fewest measured for a shift
MIN_RESPONSE = 0.25  # the drawn openness must follow at least this share of the person's own swing
MAX_OFFSET = 1.0  # the most the asked openness is moved, in standard deviations of the person's


def drawn_openness(avatar, frames: np.ndarray, boxes: np.ndarray, shapes: torch.Tensor,
                   jaws: np.ndarray | None = None, progress: bool = False) -> np.ndarray:
    """Landmark openness of each frame redrawn for a shape: inner-lip gap / mouth width.

    ``frames uint8 [K, H, W, 3]`` are loop frames at the avatar's size. ``boxes [K, 4]`` are their regions, as
    x, y, side, side px. ``shapes [K, P]`` is the standardised shape each is redrawn for. ``jaws [K, M, 2]`` are
    their jaw lines. None means the whole hidden area is redrawn. Returns ``float64 [K]``. It is NaN where no
    face was found in the drawn frame. ``progress``: a bar with its ETA."""
    from tqdm import tqdm

    mouth_region = MouthRegion.for_avatar(avatar)
    out = np.full(len(frames), np.nan)
    with FaceLandmarker(max_faces=1) as marker, torch.no_grad():
        for k, frame in enumerate(tqdm(frames, desc="openness calibration", unit="frame", disable=not progress,
                                       dynamic_ncols=True)):
            box = [int(round(float(v))) for v in boxes[k]]
            kept = kept_share(jaws[k], box) if jaws is not None and avatar.jaws is not None else None
            drawn = mouth_region.picture(torch.from_numpy(np.ascontiguousarray(frame)), box,
                                   torch.as_tensor(shapes[k], dtype=torch.float32), kept_share=kept).numpy()
            faces = marker.detect(drawn)
            if faces:
                out[k] = faces[0].mouth_openness()
    return out


def openness_offset(asked: np.ndarray, drawn: np.ndarray, person: np.ndarray, std: float) -> tuple[float, dict]:
    """The shift to add to the openness asked of the generator. With it, on average, it draws the person's.

    The shift is in standard deviations of the person's openness. ``asked [K]`` is the standardised openness the frames
    were drawn for. ``drawn [K]`` is what the landmarks measured on them; NaN is skipped. ``person [K]`` is the person's
    own openness in the frames the shapes were asked for. ``std`` is the person's openness per standardised unit. The
    shift is the gap between the two means, over a slope. That is the slope of the drawn openness per asked unit. That
    slope is a least-squares line. A report comes with it.

    It is 0 when it cannot be trusted. That is when fewer than :data:`MIN_FRAMES` were measured. It is also when
    the drawn openness follows less than :data:`MIN_RESPONSE` of the person's swing. It is held within
    ``±``:data:`MAX_OFFSET`."""
    ok = np.isfinite(drawn) & np.isfinite(asked) & np.isfinite(person)
    report = {"frames": int(ok.sum())}
    if ok.sum() < MIN_FRAMES:
        return 0.0, {**report, "used": False, "why": f"fewer than {MIN_FRAMES} redrawn frames measured"}
    slope = np.polyfit(asked[ok], drawn[ok], 1)[0]  # drawn openness per asked unit
    drawn_mean, real_mean = drawn[ok].mean(), person[ok].mean()
    report.update({k: round(float(v), 5) for k, v in (("drawn_mean", drawn_mean), ("real_mean", real_mean),
                                                      ("drawn_slope", slope), ("real_slope", std))})
    if not slope >= MIN_RESPONSE * std:
        return 0.0, {**report, "used": False, "why": "the drawn openness hardly follows the asked one"}
    offset = float(np.clip((real_mean - drawn_mean) / slope, -MAX_OFFSET, MAX_OFFSET))
    return offset, {**report, "used": True, "offset": round(offset, 4)}


def calibrate_openness(head: ShapeHead, rest, offset: float) -> tuple[ShapeHead, torch.Tensor]:
    """A copy of ``head`` whose openness, the first shape number, is ``offset`` higher.

    Also returns ``rest [P]`` with its openness moved the same. The other numbers are unchanged. It is still one
    linear map."""
    out = copy.deepcopy(head)
    with torch.no_grad():
        out.linear.bias[0] += offset
    rest = torch.as_tensor(rest, dtype=torch.float32).clone()
    rest[0] += offset
    return out.eval(), rest


__all__ = ["drawn_openness", "openness_offset", "calibrate_openness", "OPENNESS_FRAMES", "MIN_FRAMES", "MAX_OFFSET"]
