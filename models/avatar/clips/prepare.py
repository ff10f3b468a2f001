"""Training data from a person's own talking video: ``prepare_video(video, out_dir)``.

A user records a few minutes of themselves talking to the camera. It is as for LiveTalking, ER-NeRF or MuseTalk. There
is one person, frontal, with steady framing and the microphone on. :func:`prepare_video` turns that file into a clips
folder. The trainer, :func:`framegraph.models.avatar.train.train_avatar`, accepts it::

    out_dir/clip_00000.mp4   H.264 + AAC (16 kHz mono), the video's frames at ``fps`` (25), scaled so the
    out_dir/clip_00000.json  longer side is at most ``max_side`` px; the JSON has the portrait block
    ...                      (width, height, face_box, mouth_box, name) and one entry per frame
                             (index, time_s) like ``framegraph avatar synth`` output, with
                             ``"truth": false``: there is no ground truth of the mouth (jaw_open...)
    out_dir/portrait.png     the background frame of the bundle: per-pixel median of the first 2 s
    out_dir/index.json       the source, the settings, the boxes found and the clips (also lets a rerun
                             with the same file and settings reuse the clips)

Steps:

1. The file is checked. It must be readable, with a video stream. It must have an **audio track**. The
   avatar learns its mouth from the speech. It must be at least :data:`MIN_SECONDS` long. It must be big
   enough for the region size.
2. The face and mouth are found with the face landmarks. They are searched on ``sample_frames`` frames spread
   over the video. This uses :func:`framegraph.models.synth.portrait.detect_face_regions`, as for portraits.
   **One** stable face and mouth box is kept for the whole video. It is the median of the detections, with
   outliers dropped. A box the user gives wins. It is ``face_box`` / ``mouth_box`` in px of the video as it plays.
3. Frames are resampled by time to ``fps``, taking the nearest frame. The audio is resampled to 16 kHz mono,
   aligned to the first frame. The result is cut into segments of about ``segment_seconds``. They have equal
   lengths, so no short tail shrinks training windows.

The video is decoded twice, frame by frame, by :mod:`.io`. It is never held in memory. The first pass samples
frames for the face search. The second writes the clips. Phone videos with a rotation flag are turned upright.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from framegraph.models.synth.portrait import PortraitError, detect_face_regions
from framegraph.models.vae import face_crop_box
from framegraph.stream.files import write_json, written_whole

from .io import (
    SAMPLE_RATE,
    ClipWriter,
    align_audio,
    frame_time,
    media_error,
    open_video,
    probe,
    read_audio,
    rgb_frame,
    scan,
)

MIN_SECONDS = 10.0  # the shortest video accepted (a few minutes trains a much better avatar)
DEFAULT_FPS = 25
DEFAULT_SEGMENT_SECONDS = 10.0
DEFAULT_MAX_SIDE = 512
BACKGROUND_SECONDS = 2.0
MIN_FACE_FRACTION = 0.2  # a face must be found in at least this share of the sampled frames
SILENT_PEAK = 64  # int16 peak below which the audio track counts as silent (about -54 dBFS)
FORMAT_VERSION = 1

Box = tuple[float, float, float, float]


@dataclass
class PreparedVideo:
    """What :func:`prepare_video` wrote. It is also stored in ``out_dir/index.json``.

    Attributes:
        clips_dir: the folder to train on.
        clips: its ``clip_*.mp4`` files.
        portrait_path: the background frame PNG for the bundle.
        portrait: the clips' ``portrait`` block. It holds width, height, face_box, mouth_box... in px of the
            clips' frames.
        fps, frames, seconds: of the clips together.
        source: the input video and the scale applied to it. The video has path, size, fps, seconds, rotation.
        detection: how the boxes were found. It holds the sampled frames, frames with a face and boxes in
            source px.
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


# ---- the face -----------------------------------------------------------------------------------------
def _mouth_from_face(face: Box) -> Box:
    """The mouth box from a face box's proportions, placed as :func:`detect_face_regions` does."""
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
    """One stable face box and mouth box, in px of the source video.

    They come from the face landmarks of
    :func:`~framegraph.models.synth.portrait.detect_face_regions` on ``samples``. The samples are frames shrunk
    by ``scale``. Each box is the median of the detections that agree with the median.

    Raises :class:`~framegraph.stream.media.MediaError` when no face is found. It is raised for two faces in
    every sample. It is raised for a face found in too few frames."""
    faces, mouths, found_at, two = [], [], [], 0
    for i, img in enumerate(samples):
        try:
            r = detect_face_regions(img)
        except PortraitError as exc:
            two += "two faces" in str(exc)
            continue
        faces.append(r["face_box"])
        mouths.append(r["mouth_box"])
        found_at.append(i)
    n = len(samples)
    hint = ("use a video where the face is frontal and well lit and fills a good part of the frame, or give "
            "the boxes yourself (--face-box X,Y,W,H / --mouth-box X,Y,W,H, px of the video)")
    if not faces and two:
        raise media_error(path, f"two faces found in {two} of {n} sampled frames: an avatar is of one person facing "
                                f"the camera; {hint}")
    if not faces:
        raise media_error(path, f"no face found in {n} sampled frames (face landmarks); {hint}")
    f, m = np.array(faces, np.float64), np.array(mouths, np.float64)
    med = np.median(f, axis=0)
    centre = f[:, :2] + f[:, 2:] / 2
    med_centre = med[:2] + med[2:] / 2
    keep = (np.linalg.norm(centre - med_centre, axis=1) <= 0.35 * med[2]) & \
           (f[:, 2] >= 0.67 * med[2]) & (f[:, 2] <= 1.5 * med[2])
    need = max(1, math.ceil(MIN_FACE_FRACTION * n))
    if int(keep.sum()) < need:
        raise media_error(path, f"a face was found in only {int(keep.sum())} of {n} sampled frames (at least {need} "
                           f"needed: one person facing the camera throughout); {hint}")
    face = tuple(float(v) / scale for v in np.median(f[keep], axis=0))
    mouth = tuple(float(v) / scale for v in np.median(m[keep], axis=0))
    return {"face_box": face, "mouth_box": mouth, "sampled": n, "found": len(faces), "kept": int(keep.sum())}


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
    """Remove what an earlier call wrote here, and only these names."""
    for p in list(out.glob("clip_*.mp4")) + list(out.glob("clip_*.json")):
        p.unlink()
    for name in ("index.json", "portrait.png"):
        if (out / name).is_file():
            (out / name).unlink()


def _need(min_seconds: float) -> str:
    return f"at least {min_seconds:g} s of the person talking (a few minutes trains a much better avatar)"


def _check_arguments(fps: int | None, segment_seconds: float, region_size: int) -> int:
    """The clips' frame rate, once the arguments are known to be good. ``fps`` defaults to :data:`DEFAULT_FPS`."""
    fps = DEFAULT_FPS if fps is None else fps
    if int(fps) != fps or fps <= 0 or SAMPLE_RATE % int(fps):
        raise ValueError(f"prepare_video: fps={fps} must be a whole number dividing 16000 (20, 25, 32, 40, 50...)")
    if not segment_seconds >= 1:
        raise ValueError(f"prepare_video: segment_seconds={segment_seconds} must be at least 1")
    if region_size < 16:
        raise ValueError(f"prepare_video: region_size={region_size} must be at least 16")
    return int(fps)


def _check_file(path: str, min_seconds: float, region_size: int) -> dict:
    """The video's header (:func:`~.io.probe`), once the file is known to be good.

    It must be readable, with a video and an audio track. It must be long enough and big enough for the face
    region."""
    info = probe(path)  # MediaError: missing, empty, not media, no video stream
    if info["audio"] is None:
        raise media_error(path, "has no audio track; the avatar learns to move its mouth from the speech, so it "
                                "needs the video's sound (record with the microphone on, or put the audio back in, "
                                "e.g. `ffmpeg -i video.mp4 -i speech.wav -c:v copy -c:a aac -shortest out.mp4`)")
    if info["seconds"] is not None and info["seconds"] < min_seconds - 0.05:
        raise media_error(path, f"is {info['seconds']:.1f} s long; the avatar needs {_need(min_seconds)}")
    w0, h0 = info["width"], info["height"]
    if min(w0, h0) < region_size:
        raise media_error(path, f"is {w0}x{h0} px: too small for a face region of {region_size} px (the face must "
                                f"be at least about {math.ceil(region_size / 1.35)} px wide, so the video at least "
                                f"{region_size} px on each side); use a higher-resolution video or a smaller --region")
    return info


def _read_speech(path: str) -> tuple[np.ndarray, float | None]:
    """The audio track (:func:`~.io.read_audio`), once it is known not to be silent."""
    audio, start = read_audio(path)
    if len(audio) == 0 or int(np.abs(audio.astype(np.int32)).max()) < SILENT_PEAK:
        raise media_error(path, "its audio track is silent; the avatar learns to move its mouth from the speech, "
                                "so the video must have the person's voice")
    return audio, start


def _find_boxes(path: str, info: dict, face_box: Box | None, mouth_box: Box | None, *, sample_frames: int,
                min_seconds: float, progress: bool) -> tuple[dict, Box | None, Box, dict]:
    """Pass 1 and the face.

    Returns the :func:`~.io.scan`, given ``seconds``, the video's length. Returns the face box. It is None when none was
    found but a mouth box was given. Returns the mouth box, in px of the video as it plays. The user's boxes win over
    the detection. Returns how they were found."""
    est = info["seconds"] or 0.0  # unknown duration (rare): one sample a second from the start
    times = [est * (i + 0.5) / sample_frames if est else float(i) for i in range(sample_frames)]
    need_detect = face_box is None
    found = scan(path, times if need_detect else [0.0], progress=progress, total=info["frames"])
    W, H = found["width"], found["height"]
    found["seconds"] = found["last_s"] - found["first_s"] + 1.0 / found["rate"]
    if found["seconds"] < min_seconds - 0.05:
        raise media_error(path, f"is {found['seconds']:.1f} s long; the avatar needs {_need(min_seconds)}")
    face_box = _check_box(path, face_box, "--face-box", W, H)
    mouth_box = _check_box(path, mouth_box, "--mouth-box", W, H)
    detection = {"sampled": 0, "found": 0, "kept": 0, "face_box_given": face_box is not None,
                 "mouth_box_given": mouth_box is not None}
    if need_detect:
        try:
            located = locate_face(path, found["samples"], found["detect_scale"])
        except ValueError:  # MediaError: no face; PortraitError: no OpenCV / cascades
            if mouth_box is None:
                raise
            located = None  # a mouth box given: the crop can come from it alone
        if located is not None:
            detection.update(sampled=located["sampled"], found=located["found"], kept=located["kept"])
            face_box = located["face_box"]
            mouth_box = mouth_box or located["mouth_box"]
        else:
            detection.update(sampled=len(found["samples"]))
    if mouth_box is None:
        mouth_box = _mouth_from_face(face_box)
    detection.update(face_box_source=None if face_box is None else [round(v, 2) for v in face_box],
                     mouth_box_source=[round(v, 2) for v in mouth_box])
    found["samples"] = None
    return found, face_box, mouth_box, detection


def _output_frame(path: str, W: int, H: int, face_box: Box | None, mouth_box: Box, *, region_size: int,
                  max_side: int) -> tuple[int, int, Box | None, Box, tuple[int, int, int]]:
    """The clips' frame, the boxes in it and the face crop box.

    The frame is ``(width, height)`` in even px. It is the ``W x H`` video, scaled. Its longer side is at most
    ``max_side``. It is kept larger where the face region would be smaller than ``region_size``. It is never scaled up.
    The face and mouth boxes are in its px. The crop box is ``(x, y, size)``. Raises when the face is too small for the
    region."""

    crop_src = face_crop_box((H, W), face_box, mouth_box)[2]
    what = (f"face {face_box[2]:.0f}x{face_box[3]:.0f} px" if face_box is not None else
            f"mouth {mouth_box[2]:.0f} px wide")
    if crop_src < region_size:
        raise media_error(path, f"the face is too small: the face region would be {crop_src} px ({what} in the "
                                f"{W}x{H} video), the avatar's region is {region_size} px, so it needs a face at "
                                f"least about {math.ceil(region_size / 1.35)} px wide; film closer or at a higher "
                                f"resolution, or train with a smaller --region (a multiple of 16)")
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
        raise media_error(path, f"the face region would be {crop[2]} px in the {ow}x{oh} frames; the avatar's "
                                f"region is {region_size} px; use a smaller --region")
    return ow, oh, out_face, out_mouth, crop


def _timeline(path: str, audio: np.ndarray, audio_start: float | None, found: dict, *, fps: int,
              segment_seconds: float, min_seconds: float) -> tuple[np.ndarray, list[int], float]:
    """The clips' audio and bounds.

    Returns three things. The first is the audio, aligned to the first frame. It is cut or padded to the clips'
    ``n`` frames of ``SAMPLE_RATE // fps`` samples. The second is the clips' bounds ``[0, ..., n]`` in frames.
    They are equal lengths of about ``segment_seconds``. The third is the audio's seconds before cutting."""
    audio = align_audio(audio, audio_start, found["first_s"])
    audio_s = len(audio) / SAMPLE_RATE
    if min(found["seconds"], audio_s) < min_seconds - 0.05:
        raise media_error(path, f"has {audio_s:.1f} s of audio for {found['seconds']:.1f} s of video; the avatar "
                                f"needs {_need(min_seconds)} with sound")
    n_out = int(math.floor(min(found["seconds"], audio_s) * fps + 1e-6))
    spf = SAMPLE_RATE // fps
    audio = np.concatenate([audio, np.zeros(max(0, n_out * spf - len(audio)), np.int16)])[:n_out * spf]
    n_seg = max(1, int(round(n_out / (segment_seconds * fps))))
    return audio, [round(i * n_out / n_seg) for i in range(n_seg + 1)], audio_s


def _portrait_block(path: str, width: int, height: int, face: Box | None, mouth: Box) -> dict:
    """The clips' ``portrait`` block, as ``framegraph avatar synth`` writes. Boxes are in px of the clips' frames."""
    name = Path(path).stem
    return {"name": name if name != "astronaut" else "astronaut (video)", "source": os.path.abspath(path),
            "kind": "video", "width": width, "height": height,
            "face_box": None if face is None else [round(v, 2) for v in face],
            "mouth_box": [round(v, 2) for v in mouth],
            "lip_line_y": round(mouth[1] + mouth[3] / 2, 2), "lip_curve": 0.0, "eye_boxes": []}


def _write_clip_json(path: str, video: str, i: int, bounds: list[int], fps: int, portrait: dict) -> dict:
    """Write clip ``i``'s JSON next to its MP4 ``video``; returns the clip's entry of ``index.json``.

    The clip holds frames ``bounds[i]`` to ``bounds[i + 1]`` of the source."""
    start, n = bounds[i], bounds[i + 1] - bounds[i]
    clip = {"format_version": FORMAT_VERSION, "clip": i, "video": os.path.basename(video), "truth": False,
            "source": {"video": os.path.abspath(path), "start_s": round(start / fps, 4),
                       "end_s": round((start + n) / fps, 4)},
            "portrait": portrait, "width": portrait["width"], "height": portrait["height"], "fps": fps,
            "sample_rate": SAMPLE_RATE, "n_frames": n, "audio_samples": n * (SAMPLE_RATE // fps),
            "frames": [{"index": j, "time_s": round(j / fps, 4)} for j in range(n)]}
    write_json(video[:-4] + ".json", clip)
    return {"video": os.path.basename(video), "json": os.path.basename(video)[:-4] + ".json", "frames": n,
            "clip": i, "start_s": round(start / fps, 4)}


def _write_clips(path: str, out: Path, found: dict, audio: np.ndarray, bounds: list[int], portrait: dict, *,
                 fps: int, progress: bool) -> tuple[list[dict], list[np.ndarray]]:
    """Pass 2: write the clips. Returns their ``index.json`` entries and the first frames.

    The video is resampled by time to ``fps``, taking the nearest frame. The last frame holds to the end. It is
    scaled to the portrait block's size. It is cut at ``bounds`` into ``out/clip_NNNNN.mp4`` + ``.json``, with
    their audio. The first frames returned cover :data:`BACKGROUND_SECONDS`."""
    import av
    from tqdm import tqdm

    ow, oh, n_out, spf = portrait["width"], portrait["height"], bounds[-1], SAMPLE_RATE // fps
    n_background = max(1, min(n_out, int(round(BACKGROUND_SECONDS * fps))))
    background: list[np.ndarray] = []
    clips: list[dict] = []
    writer: ClipWriter | None = None
    seg = k = 0

    def emit(frame):
        nonlocal k, seg, writer
        image = rgb_frame(frame, found["turns"], ow, oh)
        if writer is None or k == bounds[seg + 1]:
            if writer is not None:
                writer.close(True)
                clips.append(_write_clip_json(path, writer.path, seg, bounds, fps, portrait))
                seg += 1
            writer = ClipWriter(str(out / f"clip_{seg:05d}.mp4"), ow, oh, fps)
        writer.write(image, audio[k * spf:(k + 1) * spf])
        if len(background) < n_background:
            background.append(image)
        k += 1
        bar.update(1)

    container, vs, _ = open_video(path)
    bar = tqdm(total=n_out, desc="prepare clips", unit="frame", disable=not progress, dynamic_ncols=True)
    try:
        prev, prev_t, i = None, None, 0
        try:
            for frame in container.decode(vs):
                t = frame_time(frame, i, found["rate"]) - found["first_s"]
                i += 1
                if prev is not None:
                    mid = (prev_t + t) / 2
                    while k < n_out and k / fps < mid:
                        emit(prev)
                if k >= n_out:
                    break
                prev, prev_t = frame, t
        except av.error.FFmpegError as exc:
            raise media_error(path, f"is truncated or corrupt after {i} frames ({exc})") from exc
        while k < n_out and prev is not None:  # the last frame holds to the end
            emit(prev)
        writer.close(True)
        clips.append(_write_clip_json(path, writer.path, seg, bounds, fps, portrait))
        writer = None
    finally:
        bar.close()
        container.close()
        if writer is not None:
            writer.close(False)
    return clips, background


def prepare_video(video_path, out_dir, *, face_box: Box | None = None, mouth_box: Box | None = None,
                  segment_seconds: float = DEFAULT_SEGMENT_SECONDS, fps: int | None = None,
                  region_size: int = 64, max_side: int = DEFAULT_MAX_SIDE, sample_frames: int = 24,
                  min_seconds: float = MIN_SECONDS, reuse: bool = True, progress: bool = True) -> PreparedVideo:
    """Turn a talking video into a clips folder for ``train_avatar``; see the module docstring.

    Args:
        video_path: any video FFmpeg decodes, with its audio track: MP4, MOV, MKV, WebM...
        out_dir: the clips folder to write. It is created. Earlier ``clip_*`` files there are replaced.
        face_box / mouth_box: ``(x, y, w, h)`` px of the video as it plays. Given, they replace the
            detection. With a mouth box alone, the face box is still searched for. It is not needed if absent.
        segment_seconds: about this long each clip. The video is cut into equal parts.
        fps: frame rate of the clips. It must divide 16000. Default :data:`DEFAULT_FPS`, 25.
        region_size: the avatar's face region in px. The face must be big enough for it.
        max_side: frames are scaled down to this longer side. They are kept larger when the face would
            otherwise be smaller than ``region_size``. They are never scaled up.
        sample_frames: frames searched for the face, spread over the video.
        min_seconds: the shortest video accepted (:data:`MIN_SECONDS`).
        reuse: keep the clips of an earlier call with the same file and settings.
        progress: tqdm bars.
    Raises:
        :class:`~framegraph.stream.media.MediaError`, a ``ValueError`` naming the file. It is raised for a missing,
        unreadable or too short file. It is raised for a file without a video or audio track. It is raised for a silent
        audio track. It is raised for no face, or a face too small. ``ValueError`` is raised for bad arguments.
    """
    from PIL import Image

    path = os.fspath(video_path)
    fps = _check_arguments(fps, segment_seconds, region_size)
    out = Path(out_dir)
    settings = {"face_box": None if face_box is None else [float(v) for v in face_box],
                "mouth_box": None if mouth_box is None else [float(v) for v in mouth_box],
                "segment_seconds": float(segment_seconds), "fps": fps, "region_size": int(region_size),
                "max_side": int(max_side), "sample_frames": int(sample_frames), "min_seconds": float(min_seconds)}
    info = _check_file(path, min_seconds, region_size)
    video_fp = _fingerprint(path)
    if reuse and (done := _reuse(out, video_fp, settings)) is not None:
        return done
    audio, audio_start = _read_speech(path)
    found, face_box, mouth_box, detection = _find_boxes(path, info, face_box, mouth_box, sample_frames=sample_frames,
                                                        min_seconds=min_seconds, progress=progress)
    W, H = found["width"], found["height"]
    ow, oh, out_face, out_mouth, crop = _output_frame(path, W, H, face_box, mouth_box, region_size=region_size,
                                                      max_side=max_side)
    audio, bounds, audio_s = _timeline(path, audio, audio_start, found, fps=fps, segment_seconds=segment_seconds,
                                       min_seconds=min_seconds)
    out.mkdir(parents=True, exist_ok=True)
    _clear(out)
    portrait = _portrait_block(path, ow, oh, out_face, out_mouth)
    clips, background = _write_clips(path, out, found, audio, bounds, portrait, fps=fps, progress=progress)

    portrait_path = out / "portrait.png"
    median = np.median(np.stack(background), axis=0).round().astype(np.uint8)
    with written_whole(portrait_path) as tmp:
        Image.fromarray(median).save(tmp)
    n_out = bounds[-1]
    source = {"video": os.path.abspath(path), "width": W, "height": H, "fps": round(found["rate"], 3),
              "frames": found["frames"], "seconds": round(found["seconds"], 3), "audio_seconds": round(audio_s, 3),
              "rotation_turns": found["turns"], "scale": [round(ow / W, 5), round(oh / H, 5)]}
    result = PreparedVideo(str(out), [str(out / c["video"]) for c in clips], str(portrait_path), portrait, fps,
                           n_out, round(n_out / fps, 3), source, detection, False, settings)
    write_json(out / "index.json", {
        "format_version": FORMAT_VERSION, "complete": True, "truth": False, "video": video_fp, "settings": settings,
        "fps": fps, "frames": n_out, "seconds": result.seconds, "segment_seconds": float(segment_seconds),
        "portrait": portrait, "background": "portrait.png", "source": source, "detection": detection,
        "crop_box": list(crop), "clips": clips})
    return result


__all__ = ["MIN_SECONDS", "DEFAULT_FPS", "DEFAULT_SEGMENT_SECONDS", "DEFAULT_MAX_SIDE", "PreparedVideo",
           "locate_face", "prepare_video"]
