"""Training data from a person's own talking video: ``prepare_video(video, out_dir)``.

A user records a few minutes of themselves talking to the camera (as for LiveTalking, ER-NeRF or
MuseTalk: one person, frontal, steady framing, the microphone on). :func:`prepare_video` turns that file
into a clips folder :func:`framegraph.models.avatar.train.train_avatar` accepts::

    out_dir/clip_00000.mp4   H.264 + AAC (16 kHz mono), the video's frames at ``fps`` (25), scaled so the
    out_dir/clip_00000.json  longer side is at most ``max_side`` px; the JSON has the portrait block
    ...                      (width, height, face_box, mouth_box, name) and one entry per frame
                             (index, time_s) like ``framegraph avatar synth`` output, with
                             ``"truth": false``: there is no ground truth of the mouth (jaw_open...)
    out_dir/portrait.png     the background frame of the bundle: per-pixel median of the first 2 s
    out_dir/index.json       the source, the settings, the boxes found and the clips (also lets a rerun
                             with the same file and settings reuse the clips)

Steps: the file is checked (readable, a video stream, an **audio track** — the avatar learns its mouth
from the speech —, at least :data:`MIN_SECONDS` long, big enough for the region size); the face and mouth
are found with OpenCV's Haar cascades on ``sample_frames`` frames spread over the video
(:func:`framegraph.models.synth.portrait.detect_face_regions`, as for portraits) and **one** stable face /
mouth box is kept for the whole video (the median of the detections, outliers dropped); a box the user
gives (``face_box`` / ``mouth_box``, px of the video as it plays) wins. Frames are resampled by time
(nearest frame) to ``fps``, the audio to 16 kHz mono aligned to the first frame, and the result is cut
into segments of about ``segment_seconds`` (equal lengths, so no short tail shrinks training windows).

The video is decoded twice, frame by frame (never held in memory): once to sample frames for the face
search, once to write the clips. Phone videos with a rotation flag are turned upright.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

MIN_SECONDS = 10.0  # the shortest video accepted (a few minutes trains a much better avatar)
DEFAULT_FPS = 25
DEFAULT_SEGMENT_SECONDS = 10.0
DEFAULT_MAX_SIDE = 512
SAMPLE_RATE = 16_000
BACKGROUND_SECONDS = 2.0
DETECT_MAX_SIDE = 1024  # frames are searched for the face at most this large (speed)
MIN_FACE_FRACTION = 0.2  # a face must be found in at least this share of the sampled frames
SILENT_PEAK = 64  # int16 peak below which the audio track counts as silent (about -54 dBFS)
FORMAT_VERSION = 1

Box = tuple[float, float, float, float]


@dataclass
class PreparedVideo:
    """What :func:`prepare_video` wrote (also stored in ``out_dir/index.json``).

    Attributes:
        clips_dir: the folder to train on; clips: its ``clip_*.mp4`` files.
        portrait_path: the background frame (PNG) for the bundle; portrait: the clips' ``portrait`` block
            (width, height, face_box, mouth_box... in px of the clips' frames).
        fps, frames, seconds: of the clips together.
        source: the input video (path, size, fps, seconds, rotation) and the scale applied to it.
        detection: how the boxes were found (sampled frames, frames with a face, boxes in source px).
        reused: the clips were already there from an identical earlier call.
    """

    clips_dir: str
    clips: list[str]
    portrait_path: str
    portrait: dict
    fps: int
    frames: int
    seconds: float
    source: dict
    detection: dict
    reused: bool = False
    settings: dict = field(default_factory=dict)


def _error(path, problem: str):
    from framegraph.stream.media import MediaError

    return MediaError(path, problem)


# ---- reading ------------------------------------------------------------------------------------------
def _open(path):
    """The container, its first video stream and its first audio stream (None when there is none)."""
    from framegraph.stream.media import open_media

    container = open_media(path)
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["nothing"]
        container.close()
        raise _error(path, f"has no video stream (it holds {', '.join(kinds)}); expected a video of the person "
                           f"talking (MP4, MOV, MKV, WebM...)")
    vs = container.streams.video[0]
    try:
        vs.thread_type = "AUTO"
    except (AttributeError, ValueError):  # pragma: no cover - old PyAV
        pass
    return container, vs, (container.streams.audio[0] if container.streams.audio else None)


def _rotation_turns(frame) -> int:
    """Quarter turns (counterclockwise, as ``np.rot90``) that show the frame upright (phone videos)."""
    try:
        angle = float(frame.rotation or 0)
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - PyAV without frame.rotation
        return 0
    return int(round(angle / 90.0)) % 4


def _rgb(frame, turns: int, width: int, height: int) -> np.ndarray:
    """A decoded frame → ``uint8 [height, width, 3]`` RGB as displayed (scaled, turned upright)."""
    w, h = (height, width) if turns % 2 else (width, height)
    if (frame.width, frame.height) == (w, h):
        arr = frame.to_ndarray(format="rgb24")
    else:
        arr = frame.reformat(width=w, height=h, format="rgb24", interpolation="AREA").to_ndarray()
    if turns:
        arr = np.rot90(arr, turns)
    return np.ascontiguousarray(arr)


def _frame_time(frame, index: int, rate: float) -> float:
    t = frame.time
    return float(t) if t is not None else index / rate


def _probe(path) -> dict:
    """Streams, size, frame rate and duration from the header, without decoding."""
    container, vs, audio = _open(path)
    try:
        rate = vs.average_rate or vs.guessed_rate or vs.base_rate
        duration = None
        if vs.duration is not None and vs.time_base is not None:
            duration = float(vs.duration * vs.time_base)
        elif container.duration:
            duration = container.duration / 1e6
        return {"width": int(vs.codec_context.width), "height": int(vs.codec_context.height),
                "fps": float(rate) if rate else None, "seconds": duration, "frames": int(vs.frames or 0),
                "audio": None if audio is None else {"rate": int(audio.codec_context.sample_rate or 0)}}
    finally:
        container.close()


def _scan(path, sample_times: list[float], *, progress: bool, total: int | None) -> dict:
    """Decode every frame once: count them, find their times, keep the frames nearest ``sample_times``
    (as displayed, at most :data:`DETECT_MAX_SIDE` px)."""
    from tqdm import tqdm

    container, vs, _ = _open(path)
    samples: list[np.ndarray] = []
    sample_at: list[float] = []
    n, first, last, turns, size, rate = 0, None, None, 0, None, None
    try:
        rate = float(vs.average_rate or vs.guessed_rate or 25)
        want = list(sample_times)
        with tqdm(total=total or None, desc="scan video", unit="frame", disable=not progress,
                  dynamic_ncols=True) as bar:
            for frame in container.decode(vs):
                t = _frame_time(frame, n, rate)
                if first is None:
                    first, turns = t, _rotation_turns(frame)
                    fw, fh = (frame.height, frame.width) if turns % 2 else (frame.width, frame.height)
                    d = min(1.0, DETECT_MAX_SIDE / max(fw, fh))
                    size = (fw, fh, max(2, round(fw * d)), max(2, round(fh * d)))
                last = t
                n += 1
                bar.update(1)
                if want and t - first >= want[0] - 1e-6:
                    while want and t - first >= want[0] - 1e-6:
                        want.pop(0)
                    samples.append(_rgb(frame, turns, size[2], size[3]))
                    sample_at.append(t - first)
    except Exception as exc:  # noqa: BLE001 - a decoder failure becomes a message naming the file
        import av

        if isinstance(exc, av.error.FFmpegError):
            raise _error(path, f"is truncated or corrupt after {n} frames ({exc})") from exc
        raise
    finally:
        container.close()
    if n == 0:
        raise _error(path, "has a video stream but no frame could be decoded (empty or corrupt)")
    return {"frames": n, "first_s": first, "last_s": last, "turns": turns, "rate": rate,
            "width": size[0], "height": size[1], "detect_scale": size[2] / size[0], "samples": samples,
            "sample_times": sample_at}


def _read_audio(path) -> tuple[np.ndarray, float | None]:
    """The audio track as int16 mono 16 kHz, and the time of its first sample (s, None if unknown)."""
    import av

    container, _, stream = _open(path)
    try:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        blocks, start = [], None
        try:
            for frame in container.decode(stream):
                if start is None and frame.time is not None:
                    start = float(frame.time)
                for out in resampler.resample(frame):
                    blocks.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                blocks.append(out.to_ndarray().reshape(-1))
        except av.error.FFmpegError as exc:
            raise _error(path, f"its audio track is truncated or corrupt ({exc})") from exc
    finally:
        container.close()
    return (np.concatenate(blocks).astype(np.int16) if blocks else np.zeros(0, np.int16)), start


def _align(audio: np.ndarray, start: float | None, t0: float) -> np.ndarray:
    """``audio`` starting at ``start`` → sample 0 at the first video frame's time ``t0``."""
    shift = int(round(((start if start is not None else t0) - t0) * SAMPLE_RATE))
    if shift > 0:
        return np.concatenate([np.zeros(shift, np.int16), audio])
    return audio[-shift:] if shift < 0 else audio


# ---- the face -----------------------------------------------------------------------------------------
def _mouth_from_face(face: Box) -> Box:
    """The mouth box from a face box's proportions (as :func:`detect_face_regions` places it)."""
    fx, fy, fw, fh = face
    mw, mh = 0.45 * fw, 0.15 * fh
    return (fx + 0.5 * fw - mw / 2, fy + 0.84 * fh - mh / 2, mw, mh)


def _check_box(path, box: Box | None, what: str, width: int, height: int) -> Box | None:
    if box is None:
        return None
    x, y, w, h = (float(v) for v in box)
    if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > width + 0.5 or y + h > height + 0.5:
        raise ValueError(f"{os.fspath(path)}: {what} {x:g},{y:g},{w:g},{h:g} is not inside the {width}x{height} "
                         f"video (X,Y,W,H in px of the video as it plays)")
    return (x, y, w, h)


def locate_face(path, samples: list[np.ndarray], scale: float) -> dict:
    """One stable face box and mouth box (px of the source video) from Haar-cascade detections on
    ``samples`` (frames shrunk by ``scale``): the median of the detections that agree with the median.

    Raises :class:`~framegraph.stream.media.MediaError` when no face (or a face in too few frames) is found."""
    from framegraph.models.synth.portrait import PortraitError, _cascade, detect_face_regions

    for name in ("haarcascade_frontalface_default.xml", "haarcascade_smile.xml", "haarcascade_eye.xml"):
        _cascade(name)  # a missing OpenCV / cascade is its own error, not "no face"
    faces, mouths, found_at = [], [], []
    for i, img in enumerate(samples):
        try:
            r = detect_face_regions(img)
        except PortraitError:
            continue
        faces.append(r["face_box"])
        mouths.append(r["mouth_box"])
        found_at.append(i)
    n = len(samples)
    hint = ("use a video where the face is frontal and well lit and fills a good part of the frame, or give "
            "the boxes yourself (--face-box X,Y,W,H / --mouth-box X,Y,W,H, px of the video)")
    if not faces:
        raise _error(path, f"no face found in {n} sampled frames (OpenCV Haar cascade, frontal faces); {hint}")
    f, m = np.array(faces, np.float64), np.array(mouths, np.float64)
    med = np.median(f, axis=0)
    centre = f[:, :2] + f[:, 2:] / 2
    med_centre = med[:2] + med[2:] / 2
    keep = (np.linalg.norm(centre - med_centre, axis=1) <= 0.35 * med[2]) & \
           (f[:, 2] >= 0.67 * med[2]) & (f[:, 2] <= 1.5 * med[2])
    need = max(1, math.ceil(MIN_FACE_FRACTION * n))
    if int(keep.sum()) < need:
        raise _error(path, f"a face was found in only {int(keep.sum())} of {n} sampled frames (at least {need} "
                           f"needed: one person facing the camera throughout); {hint}")
    face = tuple(float(v) / scale for v in np.median(f[keep], axis=0))
    mouth = tuple(float(v) / scale for v in np.median(m[keep], axis=0))
    return {"face_box": face, "mouth_box": mouth, "sampled": n, "found": len(faces), "kept": int(keep.sum())}


# ---- writing ------------------------------------------------------------------------------------------
class _ClipWriter:
    """One ``clip_NNNNN.mp4``: H.264 yuv420p + AAC 16 kHz mono, written as ``.partial.mp4`` first."""

    def __init__(self, path: str, width: int, height: int, fps: int):
        import av

        from framegraph.stream.media import PRESETS

        self.path = path
        self.partial = path[:-4] + ".partial.mp4"
        self.fps = fps
        self.frames = 0
        self.samples = 0
        self.c = av.open(self.partial, mode="w", format="mp4")
        vs = self.c.add_stream("libx264", rate=fps)
        vs.width, vs.height, vs.pix_fmt = width, height, "yuv420p"
        vs.codec_context.time_base = Fraction(1, fps)
        vs.codec_context.options = dict(PRESETS["offline"], g=str(2 * fps))
        a = self.c.add_stream("aac", rate=SAMPLE_RATE)
        a.layout = "mono"
        a.codec_context.time_base = Fraction(1, SAMPLE_RATE)
        self.vs, self.a = vs, a

    def write(self, image: np.ndarray, audio: np.ndarray) -> None:
        import av

        if len(audio):
            af = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, np.int16).reshape(1, -1), format="s16",
                                            layout="mono")
            af.sample_rate, af.pts, af.time_base = SAMPLE_RATE, self.samples, Fraction(1, SAMPLE_RATE)
            self.c.mux(self.a.encode(af))
            self.samples += len(audio)
        vf = av.VideoFrame.from_ndarray(image, format="rgb24")
        vf.pts, vf.time_base = self.frames, Fraction(1, self.fps)
        self.c.mux(self.vs.encode(vf))
        self.frames += 1

    def close(self, ok: bool) -> None:
        if self.c is None:
            return
        try:
            if ok:
                self.c.mux(self.vs.encode(None))
                self.c.mux(self.a.encode(None))
        finally:
            self.c.close()
            self.c = None
        if ok:
            os.replace(self.partial, self.path)


def _even(v: float) -> int:
    return max(2, int(v) // 2 * 2)


def _fingerprint(path) -> dict:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _reuse(out: Path, video: dict, settings: dict) -> PreparedVideo | None:
    index = out / "index.json"
    if not index.is_file():
        return None
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError):
        return None
    if data.get("video") != video or data.get("settings") != settings or data.get("complete") is not True:
        return None
    clips = [str(out / c["video"]) for c in data.get("clips", [])]
    portrait_path = out / data.get("background", "portrait.png")
    if not clips or not all(os.path.isfile(c) and os.path.isfile(c[:-4] + ".json") for c in clips) or \
            not portrait_path.is_file():
        return None
    return PreparedVideo(str(out), clips, str(portrait_path), data["portrait"], data["fps"], data["frames"],
                         data["seconds"], data["source"], data["detection"], True, settings)


def _clear(out: Path) -> None:
    """Remove what an earlier call wrote here (only these names)."""
    for p in list(out.glob("clip_*.mp4")) + list(out.glob("clip_*.json")):
        p.unlink()
    for name in ("index.json", "portrait.png"):
        if (out / name).is_file():
            (out / name).unlink()


def prepare_video(video_path, out_dir, *, face_box: Box | None = None, mouth_box: Box | None = None,
                  segment_seconds: float = DEFAULT_SEGMENT_SECONDS, fps: int | None = None,
                  region_size: int = 64, max_side: int = DEFAULT_MAX_SIDE, sample_frames: int = 24,
                  min_seconds: float = MIN_SECONDS, reuse: bool = True, progress: bool = True) -> PreparedVideo:
    """Turn a talking video into a clips folder for ``train_avatar`` (see the module docstring).

    Args:
        video_path: any video FFmpeg decodes, with its audio track (MP4, MOV, MKV, WebM...).
        out_dir: the clips folder to write (created; earlier ``clip_*`` files there are replaced).
        face_box / mouth_box: ``(x, y, w, h)`` px of the video as it plays; given, they replace the
            detection (a mouth box alone: the face box is still searched for, and not needed if absent).
        segment_seconds: about this long each clip (the video is cut into equal parts).
        fps: frame rate of the clips; must divide 16000 (default :data:`DEFAULT_FPS`, 25).
        region_size: the avatar's face region (px): the face must be big enough for it.
        max_side: frames are scaled down to this longer side (kept larger when the face would be
            smaller than ``region_size`` otherwise, never scaled up).
        sample_frames: frames searched for the face, spread over the video.
        min_seconds: the shortest video accepted (:data:`MIN_SECONDS`).
        reuse: keep the clips of an earlier call with the same file and settings.
        progress: tqdm bars.
    Raises:
        :class:`~framegraph.stream.media.MediaError` (a ``ValueError`` naming the file) for a missing,
        unreadable or too short file, one without a video or audio track, a silent audio track, no face
        or a face too small; ``ValueError`` for bad arguments.
    """
    from tqdm import tqdm

    path = os.fspath(video_path)
    fps = DEFAULT_FPS if fps is None else fps
    if int(fps) != fps or fps <= 0 or SAMPLE_RATE % int(fps):
        raise ValueError(f"prepare_video: fps={fps} must be a whole number dividing 16000 (20, 25, 32, 40, 50...)")
    fps = int(fps)
    if not segment_seconds >= 1:
        raise ValueError(f"prepare_video: segment_seconds={segment_seconds} must be at least 1")
    if region_size < 16:
        raise ValueError(f"prepare_video: region_size={region_size} must be at least 16")
    out = Path(out_dir)
    settings = {"face_box": None if face_box is None else [float(v) for v in face_box],
                "mouth_box": None if mouth_box is None else [float(v) for v in mouth_box],
                "segment_seconds": float(segment_seconds), "fps": fps, "region_size": int(region_size),
                "max_side": int(max_side), "sample_frames": int(sample_frames), "min_seconds": float(min_seconds)}

    # ---- the file: readable, a video and an audio track, long enough, big enough ----------------------
    info = _probe(path)  # MediaError: missing, empty, not media, no video stream
    if info["audio"] is None:
        raise _error(path, "has no audio track; the avatar learns to move its mouth from the speech, so it needs "
                           "the video's sound (record with the microphone on, or put the audio back in, e.g. "
                           "`ffmpeg -i video.mp4 -i speech.wav -c:v copy -c:a aac -shortest out.mp4`)")
    need_s = f"at least {min_seconds:g} s of the person talking (a few minutes trains a much better avatar)"
    if info["seconds"] is not None and info["seconds"] < min_seconds - 0.05:
        raise _error(path, f"is {info['seconds']:.1f} s long; the avatar needs {need_s}")
    video_fp = _fingerprint(path)
    if reuse:
        done = _reuse(out, video_fp, settings)
        if done is not None:
            return done
    w0, h0 = info["width"], info["height"]
    if min(w0, h0) < region_size:
        raise _error(path, f"is {w0}x{h0} px: too small for a face region of {region_size} px (the face must be "
                           f"at least about {math.ceil(region_size / 1.35)} px wide, so the video at least "
                           f"{region_size} px on each side); use a higher-resolution video or a smaller --region")

    # ---- the audio: there, and not silent -------------------------------------------------------------
    audio, audio_start = _read_audio(path)
    if len(audio) == 0 or int(np.abs(audio.astype(np.int32)).max()) < SILENT_PEAK:
        raise _error(path, "its audio track is silent; the avatar learns to move its mouth from the speech, so "
                           "the video must have the person's voice")

    # ---- pass 1: frame times, and sampled frames for the face search ---------------------------------
    est = info["seconds"] or 0.0  # unknown duration (rare): one sample a second from the start
    times = [est * (i + 0.5) / sample_frames if est else float(i) for i in range(sample_frames)]
    need_detect = face_box is None
    scan = _scan(path, times if need_detect else [0.0], progress=progress, total=info["frames"])
    W, H = scan["width"], scan["height"]
    video_s = scan["last_s"] - scan["first_s"] + 1.0 / scan["rate"]
    if video_s < min_seconds - 0.05:
        raise _error(path, f"is {video_s:.1f} s long; the avatar needs {need_s}")
    face_box = _check_box(path, face_box, "--face-box", W, H)
    mouth_box = _check_box(path, mouth_box, "--mouth-box", W, H)
    detection = {"sampled": 0, "found": 0, "kept": 0, "face_box_given": face_box is not None,
                 "mouth_box_given": mouth_box is not None}
    if need_detect:
        try:
            found = locate_face(path, scan["samples"], scan["detect_scale"])
        except ValueError:  # MediaError: no face; PortraitError: no OpenCV / cascades
            if mouth_box is None:
                raise
            found = None  # a mouth box given: the crop can come from it alone
        if found is not None:
            detection.update(sampled=found["sampled"], found=found["found"], kept=found["kept"])
            face_box = found["face_box"]
            mouth_box = mouth_box or found["mouth_box"]
        else:
            detection.update(sampled=len(scan["samples"]))
    if mouth_box is None:
        mouth_box = _mouth_from_face(face_box)
    detection.update(face_box_source=None if face_box is None else [round(v, 2) for v in face_box],
                     mouth_box_source=[round(v, 2) for v in mouth_box])
    scan["samples"] = None

    # ---- the face must be big enough for the region; the output scale --------------------------------
    from framegraph.models.vae import face_crop_box

    crop_src = face_crop_box((H, W), face_box, mouth_box)[2]
    what = (f"face {face_box[2]:.0f}x{face_box[3]:.0f} px" if face_box is not None else
            f"mouth {mouth_box[2]:.0f} px wide")
    if crop_src < region_size:
        raise _error(path, f"the face is too small: the face region would be {crop_src} px ({what} in the "
                           f"{W}x{H} video), the avatar's region is {region_size} px, so it needs a face at least "
                           f"about {math.ceil(region_size / 1.35)} px wide; film closer or at a higher resolution, "
                           f"or train with a smaller --region (a multiple of 16)")
    s = min(1.0, max_side / max(W, H))
    while True:
        ow, oh = _even(W * s), _even(H * s)
        sx, sy = ow / W, oh / H
        sc = lambda b: None if b is None else (b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy)  # noqa: E731
        out_face, out_mouth = sc(face_box), sc(mouth_box)
        crop = face_crop_box((oh, ow), out_face, out_mouth)
        if crop[2] >= region_size or s >= 1.0:
            break
        s = min(1.0, max(s * 1.02, region_size / crop_src))
    if crop[2] < region_size:  # odd sizes made even at full scale: at most a pixel short
        raise _error(path, f"the face region would be {crop[2]} px in the {ow}x{oh} frames; the avatar's region "
                           f"is {region_size} px; use a smaller --region")

    # ---- the audio, aligned to the first frame -------------------------------------------------------
    audio = _align(audio, audio_start, scan["first_s"])
    audio_s = len(audio) / SAMPLE_RATE
    usable_s = min(video_s, audio_s)
    if usable_s < min_seconds - 0.05:
        raise _error(path, f"has {audio_s:.1f} s of audio for {video_s:.1f} s of video; the avatar needs {need_s} "
                           f"with sound")
    n_out = int(math.floor(usable_s * fps + 1e-6))
    spf = SAMPLE_RATE // fps
    audio = np.concatenate([audio, np.zeros(max(0, n_out * spf - len(audio)), np.int16)])[:n_out * spf]
    n_seg = max(1, int(round(n_out / (segment_seconds * fps))))
    bounds = [round(i * n_out / n_seg) for i in range(n_seg + 1)]

    # ---- pass 2: resample to fps, scale, cut into clips ----------------------------------------------
    out.mkdir(parents=True, exist_ok=True)
    _clear(out)
    name = Path(path).stem
    portrait = {"name": name if name != "astronaut" else "astronaut (video)", "source": os.path.abspath(path),
                "kind": "video", "width": ow, "height": oh,
                "face_box": None if out_face is None else [round(v, 2) for v in out_face],
                "mouth_box": [round(v, 2) for v in out_mouth],
                "lip_line_y": round(out_mouth[1] + out_mouth[3] / 2, 2), "lip_curve": 0.0, "eye_boxes": []}
    n_background = max(1, min(n_out, int(round(BACKGROUND_SECONDS * fps))))
    background: list[np.ndarray] = []
    clips: list[dict] = []
    writer: _ClipWriter | None = None
    seg = -1
    k = 0
    turns = scan["turns"]
    container, vs, _ = _open(path)
    bar = tqdm(total=n_out, desc="prepare clips", unit="frame", disable=not progress, dynamic_ncols=True)
    ok = False

    def emit(frame):
        nonlocal k, seg, writer
        image = _rgb(frame, turns, ow, oh)
        if seg < 0 or k == bounds[seg + 1]:
            if writer is not None:
                writer.close(True)
                finish(seg, writer)
            seg += 1
            writer = _ClipWriter(str(out / f"clip_{seg:05d}.mp4"), ow, oh, fps)
        writer.write(image, audio[k * spf:(k + 1) * spf])
        if len(background) < n_background:
            background.append(image)
        k += 1
        bar.update(1)

    def finish(i, w):
        start = bounds[i]
        n = bounds[i + 1] - start
        clip = {"format_version": FORMAT_VERSION, "clip": i, "video": os.path.basename(w.path), "truth": False,
                "source": {"video": os.path.abspath(path), "start_s": round(start / fps, 4),
                           "end_s": round((start + n) / fps, 4)},
                "portrait": portrait, "width": ow, "height": oh, "fps": fps, "sample_rate": SAMPLE_RATE,
                "n_frames": n, "audio_samples": n * spf,
                "frames": [{"index": j, "time_s": round(j / fps, 4)} for j in range(n)]}
        tmp = w.path[:-4] + ".json.partial"
        with open(tmp, "w") as f:
            json.dump(clip, f, indent=1)
        os.replace(tmp, w.path[:-4] + ".json")
        clips.append({"video": os.path.basename(w.path), "json": os.path.basename(w.path)[:-4] + ".json",
                      "frames": n, "clip": i, "start_s": round(start / fps, 4)})

    try:
        import av

        first, rate = scan["first_s"], scan["rate"]
        prev, prev_t, i = None, None, 0
        try:
            for frame in container.decode(vs):
                t = _frame_time(frame, i, rate) - first
                i += 1
                if prev is not None:
                    mid = (prev_t + t) / 2
                    while k < n_out and k / fps < mid:
                        emit(prev)
                if k >= n_out:
                    break
                prev, prev_t = frame, t
        except av.error.FFmpegError as exc:
            raise _error(path, f"is truncated or corrupt after {i} frames ({exc})") from exc
        while k < n_out and prev is not None:  # the last frame holds to the end
            emit(prev)
        writer.close(True)
        finish(seg, writer)
        writer = None
        ok = True
    finally:
        bar.close()
        container.close()
        if writer is not None:
            writer.close(False)

    from PIL import Image

    portrait_path = out / "portrait.png"
    median = np.median(np.stack(background), axis=0).round().astype(np.uint8)
    Image.fromarray(median).save(str(portrait_path) + ".partial.png")
    os.replace(str(portrait_path) + ".partial.png", portrait_path)
    source = {"video": os.path.abspath(path), "width": W, "height": H, "fps": round(scan["rate"], 3),
              "frames": scan["frames"], "seconds": round(video_s, 3), "audio_seconds": round(audio_s, 3),
              "rotation_turns": turns, "scale": [round(ow / W, 5), round(oh / H, 5)]}
    result = PreparedVideo(str(out), [str(out / c["video"]) for c in clips], str(portrait_path), portrait, fps,
                           n_out, round(n_out / fps, 3), source, detection, False, settings)
    index = {"format_version": FORMAT_VERSION, "complete": ok, "truth": False, "video": video_fp,
             "settings": settings, "fps": fps, "frames": n_out, "seconds": result.seconds,
             "segment_seconds": float(segment_seconds), "portrait": portrait, "background": "portrait.png",
             "source": source, "detection": detection, "crop_box": list(crop), "clips": clips}
    tmp = out / "index.json.partial"
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out / "index.json")
    return result


__all__ = ["MIN_SECONDS", "DEFAULT_FPS", "DEFAULT_SEGMENT_SECONDS", "DEFAULT_MAX_SIDE", "PreparedVideo",
           "locate_face", "prepare_video"]
