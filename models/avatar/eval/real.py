"""Real-data evaluation with face landmarks: generated frames against a person's real frames.

Everything here is measured with MediaPipe's face mesh, from :mod:`framegraph.models.face`. So it needs no
ground truth beyond the real video itself:

- **Mouth openness** is inner-lip gap / mouth width, as in
  :meth:`~framegraph.models.face.FaceLandmarks.mouth_openness`. It is measured on the generated and on the
  real frame. ``landmark_openness_corr`` is their Pearson correlation over the clip. Give a held-out clip,
  whose audio was not used in training.
- **The face outside the mouth** is compared with the real frame. The scores are PSNR in dB and SSIM. SSIM uses a 7 px
  Gaussian window. The area is the real face's box minus its lower-face polygon. The polygon is grown by 4 px
  (:func:`~framegraph.models.face.outside_mouth_mask`). A video avatar's frames *are* the real frames there, up to the
  paste-back seam. The target is ≥ 30 dB.
- **Sharpness of the mouth region** is the variance of the Laplacian. It is taken inside the real lower-face polygon. It
    is given as generated / real. A ratio of 1 is as sharp as the video. A blurry region scores well below.
- **The jaw line** is the luminance edge across the real face's jaw line. The line is :meth:`FaceLandmarks.jaw_line`. It
  runs from one jaw angle over the chin to the other. Points lie 1 px apart along it. At each, the strongest gradient
  across the line counts. It is sought within ±``JAW_BAND`` of the face's width. That band is the landmarks' own error.
  The ratio is generated / real, per frame. ``jaw_edge_ratio`` covers the whole line. A chin that melts into the collar
  scores well below 1. The weakest quarter is scored too (:data:`JAW_SEGMENTS`). It may keep under :data:`JAW_BREAK` of
  the real edge. Then the jaw line breaks in that frame. ``jaw_breaks`` counts those frames, and the worst frame is
  named.
- **Lips closed in silence** looks at silent frames. Silero VAD decides. The speech probability must be < 0.2 there.
  That holds over the frame and the two frames either side. Lips move just before and after sound. The lips count as
  closed when the openness is below ``CLOSED_OPENNESS``. They also count as closed below a personal level. That is the
  real frames' median openness in silence + ``REST_MARGIN``. That covers someone whose mouth rests parted in a smile.
  The share is given for the generated and for the real frames.

:func:`track_clip` applies the same measures to a real clip alone. Does the landmark model follow this face?
Does its mouth openness follow the clip's own loudness?
"""
from __future__ import annotations

import numpy as np
import torch

from framegraph.models.audio.per_frame import loudness_db_per_frame, speech_per_frame
from framegraph.models.face import FaceLandmarker, FaceLandmarks, outside_mouth_mask, track_openness
from framegraph.models.vae import ssim_map, uint8_to_frames
from framegraph.stream.media import SAMPLE_RATE, decode_audio, iter_video_frames, open_media
from framegraph.stream.quality import pearson, pearson_by_lag, psnr

PSNR_CAP_DB = 99.0  # what identical pictures score in the JSON reports (JSON has no infinity)

# inner-lip gap / mouth width below which the lips count as closed (docs/real_people.md: how it was chosen)
CLOSED_OPENNESS = 0.08
REST_MARGIN = 0.03
SILENT_PROBABILITY = 0.2
# the jaw line's edge is looked for within ± this share of the face's width across it (landmark error: a few px)
JAW_BAND = 0.03
JAW_SEGMENTS = 4  # the line is cut into this many stretches; the weakest says whether it breaks somewhere
JAW_BREAK = 0.5  # a stretch whose edge keeps less than this share of the real one's: the jaw line breaks there
JAW_MIN_EDGE = 2.0  # grey levels / px: a real stretch weaker than this has no edge to keep (skipped)


def silent_frames(speech: np.ndarray, margin: int = 2) -> np.ndarray:
    """bool [T]: no speech in the frame nor ``margin`` frames either side. ``speech`` is per frame, 0..1."""
    loud = speech >= SILENT_PROBABILITY
    near = np.convolve(loud.astype(float), np.ones(2 * margin + 1), mode="same") > 0
    return ~near


class LandmarkMeter:
    """Per-frame landmark measures of generated frames against the real ones; see the module docstring.

    It runs two face meshes in video mode, one per stream. ``measure(generated, real)`` → a dict row."""

    def __init__(self):
        self.generated = FaceLandmarker(max_faces=1, video=True)
        self.real = FaceLandmarker(max_faces=1, video=True)

    def close(self) -> None:
        self.generated.close()
        self.real.close()

    def measure(self, generated: np.ndarray, real: np.ndarray | None = None) -> dict:
        gen_faces = self.generated.detect(generated)
        row = {"lm_open": gen_faces[0].mouth_openness() if gen_faces else np.nan}
        if real is None:
            return row
        real_faces = self.real.detect(real)
        if not real_faces:
            return {**row, "lm_open_real": np.nan}
        face = real_faces[0]
        lower_face, lips = sharpness_ratios(generated, real, [face.lower_face_polygon(), face.lip_outer()])
        return {**row, "lm_open_real": face.mouth_openness(), **outside_mouth_scores(generated, real, face),
                "mouth_sharpness": lower_face, "lips_sharpness": lips, **jaw_edge_ratios(generated, real, face)}


def outside_mouth_scores(generated: np.ndarray, real: np.ndarray, face: FaceLandmarks) -> dict:
    """``outside_psnr`` and ``outside_ssim`` of ``generated`` vs ``real``, both uint8 [H, W, 3].

    PSNR is in dB for 8 bits. Both cover the real ``face``'s box minus its lower face (:func:`outside_mouth_mask`)."""
    mask = outside_mouth_mask(face)
    if mask.sum() < 64:
        return {"outside_psnr": np.nan, "outside_ssim": np.nan}
    x, y, w, h = face.face_box()
    a = uint8_to_frames(torch.from_numpy(np.ascontiguousarray(generated[y:y + h, x:x + w])))[None]
    b = uint8_to_frames(torch.from_numpy(np.ascontiguousarray(real[y:y + h, x:x + w])))[None]
    m = ssim_map(a, b).mean(dim=1)[0].numpy()  # valid centres: 3 px in from each side (7 px window)
    inner = mask[y:y + h, x:x + w][3:3 + m.shape[0], 3:3 + m.shape[1]]
    return {"outside_psnr": min(PSNR_CAP_DB, psnr(generated[mask], real[mask], 255.0)),
            "outside_ssim": float(m[inner].mean()) if inner.any() else np.nan}


def sharpness_ratios(generated: np.ndarray, real: np.ndarray, polygons) -> list[float]:
    """The variance of the Laplacian of the luminance inside each polygon, generated / real.

    The polygons are the real lower face and the outer lip contour. They are in px of the frame. Each image's
    Laplacian is computed once."""
    import cv2

    def laplacian(img):
        grey = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY).astype(np.float32)
        return cv2.Laplacian(grey, cv2.CV_32F)

    gen, ref = laplacian(generated), laplacian(real)
    ratios = []
    for polygon in polygons:
        mask = np.zeros(real.shape[:2], np.uint8)
        cv2.fillPoly(mask, [np.round(polygon).astype(np.int32)], 1)
        inside = mask > 0
        r = float(ref[inside].var()) if inside.sum() >= 64 else 0.0
        ratios.append(float(gen[inside].var()) / r if r > 0 else np.nan)
    return ratios


def edge_across(image: np.ndarray, line: np.ndarray, band_px: float) -> np.ndarray:
    """How sharp the edge along the polyline ``line [M, 2]`` is: float [K].

    ``line`` is in px of ``image``, a uint8 [H, W, 3]. The points lie 1 px apart along it. At each, the value is the
    strongest luminance gradient across the line. It is taken along the normal. It is in grey levels / px, within
    ±``band_px`` of the line. So it finds the edge wherever within the band it lies."""
    import cv2

    grey = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY).astype(np.float32)
    gx = cv2.Sobel(grey, cv2.CV_32F, 1, 0, ksize=3) / 8.0  # the 3x3 Sobel sums 8 px steps: per px
    gy = cv2.Sobel(grey, cv2.CV_32F, 0, 1, ksize=3) / 8.0
    p = np.asarray(line, np.float64)
    seg = np.diff(p, axis=0)
    length = np.linalg.norm(seg, axis=1)
    pts, normals = [], []
    for a, d, n in zip(p[:-1], seg, length):
        if n < 1e-6:
            continue
        t = np.arange(0.0, n, 1.0)[:, None] / n
        pts.append(a + t * d)
        normals.append(np.repeat([[-d[1] / n, d[0] / n]], len(t), 0))
    if not pts:
        return np.zeros(0)
    pts, normals = np.concatenate(pts), np.concatenate(normals)
    offsets = np.arange(-np.ceil(band_px), np.ceil(band_px) + 1)
    at = pts[:, None, :] + offsets[None, :, None] * normals[:, None, :]  # [K, O, 2]
    mx, my = at[..., 0].astype(np.float32), at[..., 1].astype(np.float32)
    sx = cv2.remap(gx, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    sy = cv2.remap(gy, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return np.abs(sx * normals[:, None, 0] + sy * normals[:, None, 1]).max(1)


def jaw_edge_ratios(generated: np.ndarray, real: np.ndarray, face: FaceLandmarks) -> dict:
    """The jaw line's edge ratios, generated / real.

    ``jaw_edge`` covers the whole line. It is the edge across the real ``face``'s jaw line (:func:`edge_across`).
    ``jaw_edge_weakest`` is the same over the weakest of its :data:`JAW_SEGMENTS` stretches. Only stretches
    with a real edge of at least :data:`JAW_MIN_EDGE` count. NaN where the real frame has no edge there."""
    line, band = face.jaw_line(), max(2.0, JAW_BAND * face.size_px())
    gen, ref = edge_across(generated, line, band), edge_across(real, line, band)
    if len(ref) < JAW_SEGMENTS or ref.mean() < JAW_MIN_EDGE:
        return {"jaw_edge": np.nan, "jaw_edge_weakest": np.nan}
    parts = [(g.mean() / r.mean()) for g, r in zip(np.array_split(gen, JAW_SEGMENTS),
                                                    np.array_split(ref, JAW_SEGMENTS)) if r.mean() >= JAW_MIN_EDGE]
    return {"jaw_edge": float(gen.mean() / ref.mean()), "jaw_edge_weakest": float(min(parts))}


def jaw_summary(edge: np.ndarray, weakest: np.ndarray) -> dict | None:
    """The jaw line over a clip, from the per-frame ``jaw_edge`` / ``jaw_edge_weakest`` ratios.

    NaN ratios mean no edge was measured. Returns their mean and the worst frame. The worst frame comes with its index
    in the clip and its ratio. Returns the frames where the line breaks: the weakest stretch under :data:`JAW_BREAK`."""
    ok = np.isfinite(edge)
    if not ok.any():
        return None
    idx = np.nonzero(ok)[0]
    worst = int(idx[np.argmin(edge[ok])])
    weak = np.where(np.isfinite(weakest), weakest, np.inf)
    breaks = np.nonzero(weak < JAW_BREAK)[0]
    return {"frames": int(ok.sum()), "edge_ratio": round(float(edge[ok].mean()), 4),
            "edge_ratio_p5": round(float(np.percentile(edge[ok], 5)), 4),
            "worst_frame": worst, "worst_frame_ratio": round(float(edge[worst]), 4),
            "weakest_stretch_min": round(float(np.min(weak)), 4) if np.isfinite(weak).any() else None,
            "breaks": int(len(breaks)), "break_frames": [int(v) for v in breaks[:20]], "break_below": JAW_BREAK}


def _swing(generated: np.ndarray, real: np.ndarray) -> float | None:
    """How widely the generated mouth opens and shuts against the real one.

    It is the std of the generated openness / the real's. The frames are those where both have a face. A ratio of 1
    means as wide. A regression's ~0.6 means less."""
    ok = np.isfinite(generated) & np.isfinite(real)
    if ok.sum() < 3 or real[ok].std() < 1e-9:
        return None
    return float(generated[ok].std() / real[ok].std())


def real_summary(rows: list[dict], speech: np.ndarray | None) -> dict:
    """The landmark metrics of :class:`LandmarkMeter` rows. ``speech`` is a per-frame probability, or None."""
    col = lambda key: np.array([r.get(key, np.nan) for r in rows], dtype=np.float64)  # noqa: E731
    r4 = lambda v: None if v is None or not np.isfinite(v) else round(float(v), 4)  # noqa: E731
    mean = lambda key: r4(np.nanmean(col(key))) if np.isfinite(col(key)).any() else None  # noqa: E731
    gen, real = col("lm_open"), col("lm_open_real")
    out = {"frames": len(rows), "faces_found_generated": r4(np.isfinite(gen).mean()) if rows else None,
           "faces_found_real": r4(np.isfinite(real).mean()) if rows else None,
           "landmark_openness_corr": pearson(gen, real, digits=4),
           "landmark_openness_generated_mean": mean("lm_open"), "landmark_openness_real_mean": mean("lm_open_real"),
           "landmark_openness_swing": r4(_swing(gen, real)),
           "outside_mouth_psnr_db": mean("outside_psnr"), "outside_mouth_ssim": mean("outside_ssim"),
           "mouth_sharpness_ratio": mean("mouth_sharpness"), "lips_sharpness_ratio": mean("lips_sharpness"),
           "silence": None}
    jaw = jaw_summary(col("jaw_edge"), col("jaw_edge_weakest"))
    out.update(jaw_edge_ratio=jaw and jaw["edge_ratio"], jaw=jaw)
    if speech is not None:
        quiet = silent_frames(np.asarray(speech[:len(rows)], np.float64))
        rest = float(np.nanmedian(real[quiet])) if np.isfinite(real[quiet]).any() else np.nan
        # closed: below CLOSED_OPENNESS, or no more open than this person's own mouth at rest (a smile
        # over the teeth) + REST_MARGIN
        limit = max(CLOSED_OPENNESS, rest + REST_MARGIN) if np.isfinite(rest) else CLOSED_OPENNESS
        closed = lambda o: r4(np.mean(o[quiet & np.isfinite(o)] < limit)) \
            if (quiet & np.isfinite(o)).any() else None  # noqa: E731
        out["silence"] = {"frames": int(quiet.sum()), "rest_openness_real": r4(rest), "closed_below": r4(limit),
                          "lips_closed_fraction_generated": closed(gen), "lips_closed_fraction_real": closed(real)}
    return out


def track_clip(clip, *, audio=None, max_lag: int = 5) -> dict:
    """The landmark model on a real clip alone.

    It gives the share of frames with a face. It compares mouth openness over time with the loudness of the audio. The
    audio is the clip's own, or ``audio``, any file with sound. That gives the Pearson correlation at lag 0. It also
    gives the best within ±``max_lag`` frames. A positive lag means the mouth comes after the sound. It gives openness
    in silence and in speech. It counts blinks: eye openness dipping below 60 % of its median."""
    container = open_media(clip)
    try:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or 25)
    finally:
        container.close()
    track = track_openness(iter_video_frames(clip))
    n = len(track.mouth_openness)
    samples = decode_audio(audio if audio is not None else clip)
    level, speech = loudness_db_per_frame(samples, n, fps), speech_per_frame(samples, n, fps)
    o = track.mouth_openness
    lags = pearson_by_lag(o, level, max_lag)
    best = max((k for k in lags if lags[k] is not None), key=lambda k: lags[k], default=0)
    quiet = silent_frames(speech)
    eyes = track.eyes_openness
    shut = eyes < 0.6 * np.nanmedian(eyes) if np.isfinite(eyes).any() else np.zeros(n, bool)
    med = lambda m: round(float(np.nanmedian(o[m])), 4) if (m & track.found).any() else None  # noqa: E731
    return {"clip": str(clip), "frames": n, "fps": fps, "audio_seconds": round(len(samples) / SAMPLE_RATE, 2),
            "faces_found": round(float(track.found.mean()), 4) if n else 0.0,
            "openness_vs_loudness_corr": None if lags[0] is None else round(lags[0], 4),
            "best_lag_frames": best, "openness_vs_loudness_corr_best": None if lags.get(best) is None
            else round(lags[best], 4),
            "openness_p5_p50_p95": [round(float(v), 4) for v in np.nanpercentile(o, [5, 50, 95])]
            if track.found.any() else None,
            "silent_frames": int(quiet.sum()), "openness_silent_median": med(quiet),
            "openness_speech_median": med(~quiet),
            "lips_closed_fraction_in_silence": round(float(np.mean(o[quiet & track.found] < CLOSED_OPENNESS)), 4)
            if (quiet & track.found).any() else None,
            "blinks": int(np.sum(np.diff(shut.astype(int)) == 1))}
