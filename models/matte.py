"""The person matte: how much of each pixel is the person, as alpha. It is for avatars shown over another picture.

    raw = SelfieSegmenter().segment(frame)          # float32 [H, W]: MediaPipe's person probability
    alpha = person_matte(portrait)                  # uint8 [H, W]: 255 on the person, 0 on the background
    alphas = person_mattes(frames)                  # uint8 [T, H, W]: a video's, smoothed over time

The segmentation model is MediaPipe's selfie segmentation, ``selfie_segmentation.tflite``, with 256×256 input.
It ships in the ``mediapipe==0.10.21`` wheel, as the face mesh does.
So nothing is downloaded.
Its raw mask is coarse: it is computed at 256² and upsampled.
It also flickers by a few percent from frame to frame.
So :func:`person_mattes` does four things:

1. It smooths the probabilities over time.
   The kernel is a Gaussian of :data:`TIME_SIGMA_FRAMES` frames, with the ends reflected.
   A video avatar's loop plays back and forth.
   So a frame's neighbours are those on both sides.
2. It refines them against the frame with :func:`guided_filter`, after He et al. 2010.
   The matte's edges then follow the picture's own edges, within :data:`REFINE_RADIUS` of the model's.
   Hair and the shoulder line are such edges.
3. It maps them to alpha with a smooth ramp, :data:`RAMP`.
   Under 0.25 is background, 0. Over 0.75 is person, 1.
4. It fills the face with 1. The face is the hull of its face-mesh landmarks.
   So the part of the picture that talks is never see-through.
   That holds whatever the model says about a beard, glasses or a microphone.

The mattes are uint8, 0..255.
They are stored with the bundle, in ``models.avatar``.
They travel on ``"alpha"`` ports.
"""
from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from framegraph.models.face import FaceLandmarker
from framegraph.models.face.landmarker import MediaPipeGraph, mediapipe_solution, started

TIME_SIGMA_FRAMES = 1.0  # temporal smoothing of the raw probabilities (σ in frames)
REFINE_RADIUS = 0.02  # the guided filter's window radius, as a share of the picture's shorter side
REFINE_EPS = 1e-3  # the guided filter's regulariser (image values in [0, 1]): smaller follows edges more
RAMP = (0.25, 0.75)  # refined probability → alpha: 0 below the first, 1 above the second, smoothstep between


class SelfieSegmenter(MediaPipeGraph):
    """MediaPipe's selfie segmentation, the general 256×256 model of the wheel. It is a context manager.

    Its :meth:`segment` maps ``uint8 [H, W, 3]`` RGB → ``float32 [H, W]``.
    That is the probability that each pixel is a person.
    """

    def __init__(self):
        needs = "the person matte needs MediaPipe's selfie segmentation"
        selfie = mediapipe_solution("selfie_segmentation", needs)
        self._graph = started(lambda: selfie.SelfieSegmentation(model_selection=0))

    def segment(self, frame_rgb: np.ndarray) -> np.ndarray:
        mask = self._process(frame_rgb, "segment").segmentation_mask
        return np.clip(np.asarray(mask, np.float32), 0.0, 1.0)


def _box_mean(x: torch.Tensor, r: int) -> torch.Tensor:
    """Mean of ``x [..., H, W]`` over the ``(2r + 1)²`` window around each pixel. Edges are replicated.

    It is a mean along the rows of a mean along the columns.
    That costs 2 · (2r + 1) additions per pixel instead of (2r + 1)².
    """
    shape = x.shape
    y = F.pad(x.reshape(-1, 1, *shape[-2:]), (r, r, r, r), mode="replicate")
    y = F.avg_pool2d(y, (1, 2 * r + 1), stride=1)
    return F.avg_pool2d(y, (2 * r + 1, 1), stride=1).reshape(shape)


def guided_filter(p: torch.Tensor, guide: torch.Tensor, radius: int, eps: float) -> torch.Tensor:
    """He et al.'s guided filter with a grey guide.

    ``p [..., H, W]`` is smoothed so that its edges follow ``guide [..., H, W]``. Both are float in [0, 1].
    In each window the output is a linear function of the guide, ``a · guide + b``.
It is fitted to ``p``.
    The fit is least squares, with ``eps`` penalising ``a``.
    The fits of the windows over a pixel are averaged.
    """
    mean_i, mean_p = _box_mean(guide, radius), _box_mean(p, radius)
    cov_ip = _box_mean(guide * p, radius) - mean_i * mean_p
    var_i = _box_mean(guide * guide, radius) - mean_i * mean_i
    a = cov_ip / (var_i + eps)
    b = mean_p - a * mean_i
    return _box_mean(a, radius) * guide + _box_mean(b, radius)


def smooth_over_time(probs: torch.Tensor, sigma_frames: float = TIME_SIGMA_FRAMES) -> torch.Tensor:
    """``float32 [T, H, W]`` averaged over neighbouring frames with a Gaussian of ``sigma_frames``.

    The ends are reflected.
    It is unchanged for a single frame or ``sigma_frames <= 0``.
    """
    T = probs.shape[0]
    if T < 2 or sigma_frames <= 0:
        return probs
    r = min(int(np.ceil(3 * sigma_frames)), T - 1)
    w = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=torch.float32) / sigma_frames) ** 2)
    w = w / w.sum()
    flat = probs.reshape(T, -1).t()[:, None]  # [H·W, 1, T]
    padded = F.pad(flat, (r, r), mode="reflect")
    return F.conv1d(padded, w[None, None]).reshape(-1, T).t().reshape(probs.shape)


def _smoothstep(e0: float, e1: float, x: torch.Tensor) -> torch.Tensor:
    t = ((x - e0) / (e1 - e0)).clamp(0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def face_fill(landmarks_xy: np.ndarray | None, height: int, width: int) -> np.ndarray:
    """``float32 [H, W]``: 1 inside the convex hull of a face's landmarks, 0 elsewhere.

    The landmarks are ``[P, 2]`` in px.
    None means no face, and gives all 0.
    """
    out = np.zeros((height, width), np.float32)
    if landmarks_xy is not None:
        hull = cv2.convexHull(np.round(np.asarray(landmarks_xy, np.float32)).astype(np.int32))
        cv2.fillConvexPoly(out, hull, 1.0)
    return out


def refine(probs: torch.Tensor, frames: torch.Tensor, faces: Sequence[np.ndarray | None]) -> torch.Tensor:
    """Raw probabilities ``float32 [T, H, W]`` of ``frames uint8 [T, H, W, 3]`` → the mattes ``uint8 [T, H, W]``.

    These are steps 1–4 of the module docstring.
    ``faces`` holds each frame's landmarks ``[P, 2]`` in px, or None.
    """
    T, H, W = probs.shape
    p = smooth_over_time(probs)
    grey = frames.float().mean(-1) / 255.0
    radius = max(1, int(round(REFINE_RADIUS * min(H, W))))
    alpha = _smoothstep(*RAMP, guided_filter(p, grey, radius, REFINE_EPS))
    fill = torch.from_numpy(np.stack([face_fill(f, H, W) for f in faces]))
    alpha = torch.maximum(alpha, fill)
    return (alpha * 255.0).round_().clamp_(0, 255).to(torch.uint8)


def person_mattes(frames, *, video: bool = True, progress: bool = False) -> torch.Tensor:
    """The person mattes ``uint8 [T, H, W]`` of ``frames``.

    ``frames`` is ``uint8 [T, H, W, 3]`` RGB, numpy or torch.
    The selfie segmentation and the face mesh run on each frame, then :func:`refine`.
    With ``video`` the frames are one video's, in order. The face is then tracked.
    With ``progress`` a bar shows its ETA.
    """
    from tqdm import tqdm

    frames = torch.as_tensor(np.asarray(frames))
    if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[3] != 3:
        raise ValueError(f"person_mattes wants uint8 [T, H, W, 3] RGB frames; got {frames.dtype} "
                         f"{list(frames.shape)}")
    probs, faces = [], []
    with SelfieSegmenter() as seg, FaceLandmarker(max_faces=1, video=video) as marker:
        for f in tqdm(frames.numpy(), desc="person matte", unit="frame", disable=not progress, dynamic_ncols=True):
            probs.append(seg.segment(f))
            found = marker.detect(f)
            faces.append(found[0].points if found else None)
    return refine(torch.from_numpy(np.stack(probs)), frames, faces)


def person_matte(image) -> torch.Tensor:
    """The person matte ``uint8 [H, W]`` of one picture ``uint8 [H, W, 3]``, e.g. a portrait."""
    return person_mattes(np.asarray(image)[None], video=False)[0]


__all__ = ["SelfieSegmenter", "guided_filter", "smooth_over_time", "face_fill", "refine", "person_mattes",
           "person_matte", "TIME_SIGMA_FRAMES", "REFINE_RADIUS", "REFINE_EPS", "RAMP"]
