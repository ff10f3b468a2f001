"""Evaluate an avatar on a clip it was not trained on: ``evaluate_avatar(avatar, clip, truth)``.

**Mouth openness in a frame** comes from :func:`mouth_openness`. It looks inside the *search box*. That box starts from
the portrait's rest mouth box. The box comes from the ground truth or the bundle. It is widened by 15 % each side. It is
grown downwards by the largest jaw drop the renderer draws. That drop is 0.32 × mouth width. The head-motion margin is
added. Inside it, the *inner-mouth* pixels are counted. Their luminance is below ``dark_fraction`` (0.55) of a reference
level. That level is the median luminance of the same box in the reference portrait. Lips and skin are far brighter than
the open mouth's cavity. Openness = inner-mouth pixels / mouth width in px. That is the mean vertical extent of the dark
opening, in px. The mean is over the columns of the mouth. It needs no model. On the real clip itself,
:func:`estimator_check` shows how well it tracks the ground truth ``jaw_open``. That is the report's ``estimator_corr``.

**Metrics** go to JSON:

- ``openness_corr``: Pearson correlation of the generated frames' openness with the ground-truth ``jaw_open``.
- ``estimator_corr``: the same estimator on the real clip's frames vs the ground truth.
- ``silence``: openness on silent frames, generated vs real. Those frames' ground truth is not ``speaking``. Their jaw
  is shut, with ``jaw_open < 0.05``. ``lips_closed_fraction`` is the share of those generated frames whose lips count as
  closed. Their openness is ≤ the real clip's 95th percentile there + 0.5 px.

**Identity** comes from :class:`IdentityMeter`. It is SSIM and PSNR between a frame and the reference portrait. SSIM
uses a 7 px Gaussian window, on [-1, 1] RGB. The area is inside the face crop box, outside the *mouth motion region*.
That region comes from :func:`motion_region`. It is lips, jaw and chin: what speech is supposed to change. The portrait
is moved into the frame's head pose. An ECC fit on that same area finds the pose. The avatar's small head motion is not
an identity change. The frame itself is not resampled. For the avatar's own frames only the region it draws moves. That
is the Composite mask; the rest is the portrait. So the portrait is posed there and composited the same way, through
:class:`IdentityMeter`'s ``drawn``. A real clip is posed as a whole.

- ``identity_ssim`` / ``identity_psnr_db`` are averaged over the generated frames. They are measured as the frames leave
  the Composite stage. That is before the H.264 encoder. The encoder's own loss on this portrait is not the model's.
- ``identity_ssim_mp4`` is the same on the written MP4.
- ``identity_ssim_unaligned`` is the same without the registration.
- ``identity_ssim_real`` is the real clip, an MP4, under the same measure.

**Real data** is the ``real`` block, from :mod:`.real`. The same generated frames are measured with face landmarks
against the clip's real frames. The measures are landmark mouth-openness correlation and PSNR / SSIM of the face outside
the mouth. They add the sharpness of the mouth region. They add lips closed where the clip's audio is silent. They need
no ground truth beyond the real video. So a person's own held-out clip is judged by them.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from framegraph.models.synth import astronaut_portrait
from framegraph.models.vae import ssim_map, uint8_to_frames
from framegraph.stream import PortSpec, Stage
from framegraph.stream.media import AudioFileSource, decode_audio, iter_video_frames, open_media, read_video
from framegraph.stream.progress import run_with_progress
from framegraph.stream.quality import pearson, psnr

from ..base import RunSettings
from ..graph import build_avatar_graph
from ..portrait.bundle import PortraitAvatar
from .real import PSNR_CAP_DB, LandmarkMeter, real_summary, speech_per_frame

DARK_FRACTION = 0.55
MAX_JAW_DROP = 0.32


def _luma(frames: torch.Tensor) -> torch.Tensor:
    f = frames.float()
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def search_box(mouth_box, image_hw, margin: float = 4.0) -> tuple[int, int, int, int]:
    """Integer ``(x0, y0, x1, y1)`` where the mouth opening can be; see the module docstring."""
    x, y, w, h = (float(v) for v in mouth_box)
    x0 = math.floor(x - 0.15 * w - margin)
    x1 = math.ceil(x + 1.15 * w + margin)
    y0 = math.floor(y - margin)
    y1 = math.ceil(y + h + MAX_JAW_DROP * w + 2 * margin)
    H, W = image_hw
    return max(0, x0), max(0, y0), min(W, x1), min(H, y1)


def mouth_openness(frames: torch.Tensor, mouth_box, reference: torch.Tensor, *,
                   dark_fraction: float = DARK_FRACTION) -> np.ndarray:
    """Per-frame openness in px of ``frames uint8 [T, H, W, 3]``.

    ``mouth_box`` is the rest box (x, y, w, h) in px. ``reference uint8 [H, W, 3]`` is the portrait. It sets
    the darkness threshold."""
    x0, y0, x1, y1 = search_box(mouth_box, frames.shape[1:3])
    ref_l = _luma(reference[y0:y1, x0:x1])
    thr = dark_fraction * float(ref_l.median())
    dark = (_luma(frames[:, y0:y1, x0:x1]) < thr).float()
    return (dark.sum(dim=(1, 2)) / float(mouth_box[2])).numpy()


def motion_region(mouth_box, image_hw, margin: float = 2.0) -> tuple[int, int, int, int]:
    """Integer ``(x0, y0, x1, y1)`` of the lower face that speech moves: lips, jaw and chin.

    It comes from the rest mouth box ``(x, y, w, h)`` alone. So it works for any portrait. Let ``a = w / 2``,
    around the mouth's centre. The region spans 2.5 ``a`` to each side. It runs from 2.2 ``a`` above the lip
    line to 1.4 ``a`` below the chin. The chin lies 0.75 ``w`` under the lip line. This is the support of the
    synthetic renderer's jaw and lip warp, in :class:`framegraph.models.synth.render.PortraitRenderer`. It is
    also where a real jaw moves skin."""
    x, y, w, h = (float(v) for v in mouth_box)
    a, cx, cy = w / 2, x + w / 2, y + h / 2
    x0, x1 = math.floor(cx - 2.5 * a - margin), math.ceil(cx + 2.5 * a + margin)
    y0, y1 = math.floor(cy - 2.2 * a - margin), math.ceil(cy + 0.75 * w + 1.4 * a + margin)
    H, W = image_hw
    return max(0, x0), max(0, y0), min(W, x1), min(H, y1)


class IdentityMeter:
    """Identity of a frame against the reference portrait, head pose compensated.

    The face crop box minus the :func:`motion_region` is the *identity area*. It holds forehead, eyes, nose, cheeks and
    hair. The frame's head pose is fitted on that area. The fit is an affine ECC fit, OpenCV's ``findTransformECC``. The
    avatar's small head motion is not an identity change. The reference is moved into that pose, bilinearly. The
    untouched frame is then compared with it there. The scores are SSIM and PSNR in dB. SSIM uses a 7 px Gaussian window
    on [-1, 1] RGB. ECC is a local fit. The fitted pose may score lower than no motion at all. Then the unmoved
    reference's scores are taken. The reference is moved, not the frame. A sub-pixel bilinear resampling blurs fine
    texture. That would lower the frame's score.

    ``drawn`` is ``float [H, W]`` in [0, 1]. It says where the measured frames were generated. For the avatar it
    is the :class:`~framegraph.models.composite.Composite` mask, ``frame_alpha()``. The rest of its frames is
    the portrait itself, unmoved. None means the whole frame moves, as in a real video. With ``drawn``, the pose
    is fitted on the identity area inside the drawn region. It is a rigid in-plane motion: rotation + shift.
    That band is too narrow to pin down a full affine. The reference is moved there only, and composited like
    the frames. Moving the whole reference would compare the avatar's fixed background with a moved one.
    ``measure(frame)`` returns ``(ssim, psnr_db, ssim_unaligned)`` for one ``uint8 [H, W, 3]`` frame."""

    def __init__(self, reference: torch.Tensor, crop_box, mouth_box, *, drawn=None):
        import cv2

        self.ref = np.ascontiguousarray(np.asarray(reference, dtype=np.uint8))
        H, W = self.ref.shape[:2]
        x, y, s, _ = (int(v) for v in crop_box)
        self.crop = (max(0, x), max(0, y), min(W, x + s), min(H, y + s))
        mx0, my0, mx1, my1 = motion_region(mouth_box, (H, W))
        mask = np.zeros((H, W), np.uint8)
        cx0, cy0, cx1, cy1 = self.crop
        mask[cy0:cy1, cx0:cx1] = 1
        mask[my0:my1, mx0:mx1] = 0
        if mask.sum() < 256:
            raise ValueError(f"IdentityMeter: the face crop {tuple(crop_box)} minus the mouth motion region leaves "
                             f"{int(mask.sum())} px to compare; is the mouth box {tuple(mouth_box)} right?")
        self.mask = mask
        self.ref_gray = cv2.cvtColor(self.ref, cv2.COLOR_RGB2GRAY).astype(np.float32)
        win = 7
        m = torch.from_numpy(mask[cy0:cy1, cx0:cx1]).float()
        self.ssim_mask = m[win // 2:m.shape[0] - win // 2, win // 2:m.shape[1] - win // 2]  # valid centres

        self.ref_crop = uint8_to_frames(torch.from_numpy(self.ref[cy0:cy1, cx0:cx1]))[None]
        self._warp = np.eye(2, 3, dtype=np.float32)
        self.drawn = None if drawn is None else np.asarray(drawn, dtype=np.float32)
        self.fit_mask, self.motion = mask, cv2.MOTION_AFFINE
        if self.drawn is not None:
            self.motion = cv2.MOTION_EUCLIDEAN  # rigid: the drawn band is too narrow to pin a full affine
            if self.drawn.shape != (H, W):
                raise ValueError(f"IdentityMeter: drawn is {self.drawn.shape}, expected the frame's {(H, W)}")
            moving = (mask * (self.drawn >= 0.5)).astype(np.uint8)  # the pose is the pose of what moves
            self.fit_mask = moving if moving.sum() >= 256 else mask

    def fit_pose(self, frame: np.ndarray) -> np.ndarray:
        """The affine ``float32 [2, 3]`` taking reference px to ``frame`` px. ECC fits it on the identity area."""
        import cv2

        gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY).astype(np.float32)
        warp = self._warp.copy()  # start from the last fit: the head moves smoothly
        try:
            _, warp = cv2.findTransformECC(self.ref_gray, gray, warp, self.motion,
                                           (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 60, 1e-5),
                                           self.fit_mask, 5)
        except cv2.error:
            warp = np.eye(2, 3, dtype=np.float32)  # no convergence: compare unaligned
        self._warp = warp
        return warp

    def posed_reference(self, frame: np.ndarray) -> np.ndarray:
        """The reference portrait moved into ``frame``'s head pose, as ``uint8 [H, W, 3]``.

        With ``drawn`` it is moved only there. It is composited into the unmoved portrait, as the avatar's
        frames are."""
        import cv2

        H, W = self.ref.shape[:2]
        posed = cv2.warpAffine(self.ref, self.fit_pose(frame), (W, H), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_REPLICATE)
        if self.drawn is None:
            return posed
        a = self.drawn[..., None]
        return np.round(a * posed + (1.0 - a) * self.ref).astype(np.uint8)

    def _scores(self, frame: np.ndarray, reference: np.ndarray | None = None) -> tuple[float, float]:

        x0, y0, x1, y1 = self.crop
        a = uint8_to_frames(torch.from_numpy(np.ascontiguousarray(frame[y0:y1, x0:x1])))[None]
        ref = self.ref_crop if reference is None else \
            uint8_to_frames(torch.from_numpy(np.ascontiguousarray(reference[y0:y1, x0:x1])))[None]
        m = ssim_map(a, ref).mean(dim=1)[0]
        ssim_v = float((m * self.ssim_mask).sum() / self.ssim_mask.sum())
        pix = torch.from_numpy(self.mask[y0:y1, x0:x1]).bool()
        mse = float((a[0] - ref[0]).pow(2).mean(dim=0)[pix].mean())
        return ssim_v, (99.0 if mse == 0 else 10 * math.log10(4.0 / mse))

    def measure(self, frame) -> tuple[float, float, float]:
        frame = np.ascontiguousarray(np.asarray(frame, dtype=np.uint8))
        raw = self._scores(frame)
        fitted = self._scores(frame, self.posed_reference(frame))
        # the pose that explains the frame best: the ECC fit, or no motion when the local fit did worse
        ssim_v, psnr_v = max(raw, fitted)
        return ssim_v, psnr_v, raw[0]


def identity_ssim(frames: torch.Tensor, reference: torch.Tensor, crop_box, mouth_box, *,
                  align: bool = True) -> np.ndarray:
    """Per-frame identity SSIM of ``frames uint8 [T, H, W, 3]``; see :class:`IdentityMeter`.

    ``align=False`` skips the head-pose registration."""
    meter = IdentityMeter(reference, crop_box, mouth_box)
    return np.array([meter.measure(f)[0 if align else 2] for f in np.asarray(frames)])


class FrameMeter(Stage):
    """Sink of the composited ``"video"``. It measures every frame as it arrives, before any video codec.

    With ``real``, it also measures the real frame of the same index. ``real`` iterates over the real clip's frames, in
    step. Each is ``uint8 [H, W, 3]``. It keeps nothing but numbers. So a stream of any length fits in memory.

    ``rows[k]`` holds the generated frame's ``open``, its openness in px. It holds ``ssim`` / ``psnr`` /
    ``ssim_raw`` from :class:`IdentityMeter`. With ``real`` it adds ``open_real``, ``ssim_real`` /
    ``psnr_real`` / ``ssim_real_raw``. It adds ``face_psnr`` / ``mouth_psnr``, generated vs real frame in dB.
    They cover the face crop and the mouth motion region. With ``landmarks``, a :class:`~.real.LandmarkMeter`,
    it also adds its landmark columns.
    """

    def __init__(self, avatar: PortraitAvatar, mouth_box, *, real=None, drawn=None,
                 landmarks: LandmarkMeter | None = None, name: str = "meter"):
        super().__init__(name)
        self.landmarks = landmarks
        self.inputs = {"video": PortSpec((avatar.height, avatar.width, 3), torch.uint8, "cpu")}
        self.portrait = avatar.portrait
        self.mouth_box = mouth_box
        self.meter = IdentityMeter(avatar.portrait, avatar.crop_box, mouth_box, drawn=drawn)
        self.real = iter(real) if real is not None else None
        self.real_meter = IdentityMeter(avatar.portrait, avatar.crop_box, mouth_box) if real is not None else None
        x, y, s, _ = (int(v) for v in avatar.crop_box)
        self.face = (slice(max(0, y), y + s), slice(max(0, x), x + s))
        mx0, my0, mx1, my1 = motion_region(mouth_box, avatar.portrait.shape[:2])
        self.mouth = (slice(my0, my1), slice(mx0, mx1))
        self.rows: list[dict] = []

    def process(self, inputs, out):
        f = inputs["video"].data.cpu()
        frame = f.numpy()
        ssim_v, psnr_v, raw = self.meter.measure(frame)
        row = {"open": float(mouth_openness(f[None], self.mouth_box, self.portrait)[0]), "ssim": ssim_v,
               "psnr": psnr_v, "ssim_raw": raw}
        real = next(self.real, None) if self.real is not None else None
        if real is not None and real.shape == frame.shape:
            rs, rp, rr = self.real_meter.measure(real)
            row.update(open_real=float(mouth_openness(torch.from_numpy(real)[None], self.mouth_box,
                                                      self.portrait)[0]),
                       ssim_real=rs, psnr_real=rp, ssim_real_raw=rr,
                       face_psnr=min(PSNR_CAP_DB, psnr(frame[self.face], real[self.face], 255.0)),
                       mouth_psnr=min(PSNR_CAP_DB, psnr(frame[self.mouth], real[self.mouth], 255.0)))
        if self.landmarks is not None:
            row.update(self.landmarks.measure(frame, real if real is not None and real.shape == frame.shape else None))
        self.rows.append(row)

    def column(self, key: str) -> np.ndarray:
        return _column(self.rows, key)


def _column(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r.get(key, np.nan) for r in rows], dtype=np.float64)


def generate_clip(avatar: PortraitAvatar, audio_path, out_mp4, settings: RunSettings | None = None, *,
                  progress: bool = False, meter: FrameMeter | None = None, total: int | None = None) -> dict:
    """Run the avatar graph on ``audio_path``, any file with audio, into ``out_mp4``.

    ``settings``: the run's :class:`~..base.RunSettings`, such as its runtime and steps. ``meter`` also receives
    every composited frame, before the codec. Returns the graph's report."""


    ag = build_avatar_graph(avatar, AudioFileSource(audio_path), out=os.fspath(out_mp4), settings=settings)
    if meter is not None:
        ag.graph.add(meter)
        ag.graph.connect(ag.video, meter, "video", "video", capacity=4)
    if progress:
        return run_with_progress(ag.graph, ag.sink, total, desc="generate")
    return ag.graph.run()


def _summary(rows: list[dict], jaw: np.ndarray | None, states: list) -> dict:
    """The metrics of :class:`FrameMeter` rows against the ground truth; see the module docstring.

    ``jaw`` None means the clip has no mouth ground truth. A person's own video has none. Then there are no
    openness metrics."""
    r = lambda v: None if v is None or not np.isfinite(v) else round(float(v), 4)  # noqa: E731
    n = len(rows)
    o_gen, o_real = _column(rows, "open"), _column(rows, "open_real")
    if jaw is None:
        jaw = np.full(n, np.nan)
        states = [None] * n
    silent = np.array([s is not None and s != "speaking" and j < 0.05 for s, j in zip(states, jaw)])
    sil = None
    if silent.any() and np.isfinite(o_real[silent]).all():
        limit = float(np.percentile(o_real[silent], 95)) + 0.5
        sil = {"frames": int(silent.sum()), "openness_generated_mean": round(float(o_gen[silent].mean()), 3),
               "openness_real_mean": round(float(o_real[silent].mean()), 3), "closed_limit_px": round(limit, 3),
               "lips_closed_fraction": round(float((o_gen[silent] <= limit).mean()), 4)}
    speaking = ~silent
    nanmean = lambda a: np.nanmean(a) if np.isfinite(a).any() else np.nan  # noqa: E731  (no real frames: None)
    mean = lambda key: r(nanmean(_column(rows, key)))  # noqa: E731
    return {
        "frames": int(n),
        "openness_corr": r(pearson(o_gen, jaw)), "estimator_corr": r(pearson(o_real, jaw)),
        "openness_corr_vs_real_estimate": r(pearson(o_gen, o_real)),
        "openness_generated_speaking_mean": r(o_gen[speaking].mean()) if speaking.any() else None,
        "openness_real_speaking_mean": r(nanmean(o_real[speaking])) if speaking.any() else None,
        "silence": sil,
        "identity_ssim": mean("ssim"), "identity_ssim_min": r(np.nanmin(_column(rows, "ssim"))),
        "identity_psnr_db": mean("psnr"), "identity_ssim_unaligned": mean("ssim_raw"),
        "identity_ssim_real": mean("ssim_real"), "identity_psnr_db_real": mean("psnr_real"),
        "identity_ssim_real_unaligned": mean("ssim_real_raw"),
        "face_psnr_db": mean("face_psnr"), "mouth_region_psnr_db": mean("mouth_psnr"),
    }


def evaluate_avatar(avatar: PortraitAvatar, clip, truth=None, settings: RunSettings | None = None, *,
                    out_video=None, progress: bool = False, minute_s: float = 60.0,
                    codec_check_max_frames: int = 3000, real_measures: bool = True) -> dict:
    """Generate from ``clip``'s audio and measure it against ``truth``; see the module docstring.

    ``truth`` None means a real clip without a JSON. Then only the measures against its real frames run, with
    no mouth ground truth. Streams of more than two ``minute_s`` get a ``per_minute`` table and a ``drift``
    block. The drift is minute ``n`` minus minute 1. ``identity_ssim_mp4`` is the same measure on the written
    H.264 file. It is computed for clips up to ``codec_check_max_frames`` frames. ``settings``: the run's
    :class:`~..base.RunSettings`, such as where the models compute. Use runtime ``"onnx-int8"`` to measure the
    int8 export.

    ``real_measures`` False measures only the generated frames against the ground truth and the portrait. That is
    openness correlation, silence and identity. It skips the measures against the clip's real frames. Those are the
    ``real`` block, ``identity_ssim_real`` and the like. It skips the written MP4 too. It takes about a tenth of the
    time."""

    settings = settings if settings is not None else RunSettings()
    if truth is None:  # a person's own clip: no ground truth, one entry per frame of the video
        truth = {"truth": False, "frames": [{"index": i} for i, _ in enumerate(iter_video_frames(clip))]}
    truth = json.loads(Path(truth).read_text()) if not isinstance(truth, dict) else truth
    frames_gt = truth.get("frames") or []
    if not frames_gt:
        raise ValueError("evaluate_avatar: the ground truth has no per-frame entries ('frames')")
    portrait = avatar.portrait
    mouth_box = avatar.mouth_box or (truth.get("portrait") or {}).get("mouth_box")
    if mouth_box is None:
        raise ValueError("evaluate_avatar: no mouth box in the bundle or the ground truth")
    first = next(iter_video_frames(clip), None)
    if first is None or tuple(first.shape[:2]) != tuple(portrait.shape[:2]):
        got = "no frames" if first is None else f"{first.shape[1]}x{first.shape[0]}"
        raise ValueError(f"evaluate_avatar: the clip is {got} but the avatar's portrait is "
                         f"{portrait.shape[1]}x{portrait.shape[0]}")

    drawn = avatar.composite().frame_alpha().numpy()  # where the avatar's frames move
    landmarks = LandmarkMeter() if real_measures else None
    meter = FrameMeter(avatar, mouth_box, real=iter_video_frames(clip) if real_measures else None, drawn=drawn,
                       landmarks=landmarks)
    with tempfile.TemporaryDirectory() as tmp:
        target = os.fspath(out_video) if out_video else os.path.join(tmp, "generated.mp4")
        t0 = time.monotonic()
        try:
            generate_clip(avatar, clip, target, settings, progress=progress, meter=meter, total=len(frames_gt))
        finally:
            if landmarks is not None:
                landmarks.close()
        seconds = time.monotonic() - t0
        n = min(len(frames_gt), len(meter.rows))

        container = open_media(target)
        has_audio = bool(container.streams.audio)
        container.close()
        ssim_mp4 = None
        if real_measures and n <= codec_check_max_frames:
            mp4_meter = IdentityMeter(portrait, avatar.crop_box, mouth_box, drawn=drawn)
            vals = [mp4_meter.measure(f)[0] for _, f in zip(range(n), iter_video_frames(target))]
            ssim_mp4 = round(float(np.mean(vals)), 4) if vals else None
    has_truth = truth.get("truth", True) is not False and all("jaw_open" in f for f in frames_gt[:n])
    jaw = np.array([float(f["jaw_open"]) for f in frames_gt[:n]]) if has_truth else None
    states = [f.get("state") for f in frames_gt[:n]]
    out = {"mouth_ground_truth": has_truth, "clip": os.fspath(clip), "frames_generated": int(len(meter.rows)),
           "audio_in_output": has_audio, "steps": settings.steps or avatar.steps,
           "runtime": settings.runtime,
           "openness_estimator": "inner-mouth (dark) pixels / mouth width, px; see models/avatar/evaluate.py",
           "identity": "SSIM / PSNR vs the portrait in the face crop outside the mouth motion region, head pose "
                       "registered (affine ECC); generated frames measured before the video codec",
           "real_measures": "face landmarks on generated and real frames (models/avatar/evaluate_real.py)",
           **_summary(meter.rows[:n], jaw, states), "identity_ssim_mp4": ssim_mp4,
           "real": None if landmarks is None else real_summary(meter.rows[:n], speech_per_frame(decode_audio(clip), n,
                                                                                              avatar.fps)),
           "generate_and_measure_seconds": round(seconds, 1)}
    per = int(round(minute_s * avatar.fps))
    if n >= 2 * per:
        table = []
        for m in range(n // per):
            cut = slice(m * per, (m + 1) * per)
            s = _summary(meter.rows[cut], None if jaw is None else jaw[cut], states[cut])
            table.append({"minute": m + 1, **{k: s[k] for k in ("openness_corr", "identity_ssim", "identity_psnr_db",
                                                                  "face_psnr_db", "mouth_region_psnr_db")}})
        out["per_minute"] = table
        first_m, last_m = table[0], table[-1]
        diff = lambda k: (None if first_m[k] is None or last_m[k] is None  # noqa: E731
                          else round(last_m[k] - first_m[k], 3))
        out["drift"] = {"minutes": len(table), "identity_psnr_db_change": diff("identity_psnr_db"),
                        "face_psnr_db_change": diff("face_psnr_db"),
                        "mouth_region_psnr_db_change": diff("mouth_region_psnr_db"),
                        "openness_corr_change": diff("openness_corr")}
    return out


def estimator_check(clip, truth) -> dict:
    """The openness estimator on a real clip vs its ground truth. No model is involved."""

    truth = json.loads(Path(truth).read_text()) if not isinstance(truth, dict) else truth
    frames = torch.from_numpy(read_video(clip)["frames"])
    p = truth["portrait"]
    reference = frames[0] if p.get("name") != "astronaut" else None
    if reference is None:
        reference = torch.from_numpy(np.array(astronaut_portrait().image, copy=True))
    n = min(len(truth["frames"]), frames.shape[0])
    if not all("jaw_open" in f for f in truth["frames"][:n]):
        raise ValueError("estimator_check: the clip's JSON has no ground-truth jaw_open per frame (a person's own "
                         "video has none); it needs a synthetic clip")
    jaw = [float(f["jaw_open"]) for f in truth["frames"][:n]]
    o = mouth_openness(frames[:n], p["mouth_box"], reference)
    return {"frames": n, "corr": pearson(o, jaw), "openness": o.tolist(), "jaw_open": jaw}


__all__ = ["DARK_FRACTION", "mouth_openness", "search_box", "motion_region", "pearson", "IdentityMeter",
           "identity_ssim", "FrameMeter", "generate_clip", "evaluate_avatar", "estimator_check"]
