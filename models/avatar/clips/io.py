"""Reading a person's talking video and writing training clips, for :mod:`.video`, with PyAV.

Reading is frame by frame, never the whole video in memory. :func:`probe` reads the header. :func:`scan`
decodes every frame once. It finds the count and the times, and samples frames for the face search.
:func:`read_audio` reads the track as 16 kHz mono. Frames come out as displayed. They are scaled, and phone
videos with a rotation flag are turned upright. :class:`ClipWriter` writes one clip, H.264 + AAC, as
``.partial.mp4`` first.
"""
from __future__ import annotations

import os
from fractions import Fraction

import numpy as np

from framegraph.stream.files import partial_name
from framegraph.stream.media import PRESETS, SAMPLE_RATE, MediaError, open_media

DETECT_MAX_SIDE = 1024  # frames are searched for the face at most this large (speed)


def media_error(path, problem: str):
    """A :class:`~framegraph.stream.media.MediaError`, a ``ValueError``, naming the file and the problem."""

    return MediaError(path, problem)


def open_video(path):
    """The container, its first video stream and its first audio stream. The audio stream is None when absent."""

    container = open_media(path)
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["nothing"]
        container.close()
        raise media_error(path, f"has no video stream (it holds {', '.join(kinds)}); expected a video of the person "
                                 f"talking (MP4, MOV, MKV, WebM...)")
    vs = container.streams.video[0]
    try:
        vs.thread_type = "AUTO"
    except (AttributeError, ValueError):  # pragma: no cover - old PyAV
        pass
    return container, vs, (container.streams.audio[0] if container.streams.audio else None)


def rotation_turns(frame) -> int:
    """Quarter turns that show a phone video's frame upright. They turn counterclockwise, as ``np.rot90``."""
    try:
        angle = float(frame.rotation or 0)
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - PyAV without frame.rotation
        return 0
    return int(round(angle / 90.0)) % 4


def rgb_frame(frame, turns: int, width: int, height: int) -> np.ndarray:
    """A decoded frame → ``uint8 [height, width, 3]`` RGB as displayed: scaled and turned upright."""
    w, h = (height, width) if turns % 2 else (width, height)
    if (frame.width, frame.height) == (w, h):
        arr = frame.to_ndarray(format="rgb24")
    else:
        arr = frame.reformat(width=w, height=h, format="rgb24", interpolation="AREA").to_ndarray()
    if turns:
        arr = np.rot90(arr, turns)
    return np.ascontiguousarray(arr)


def frame_time(frame, index: int, rate: float) -> float:
    t = frame.time
    return float(t) if t is not None else index / rate


def probe(path) -> dict:
    """Streams, size, frame rate and duration from the header, without decoding."""
    container, vs, audio = open_video(path)
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


def scan(path, sample_times: list[float], *, progress: bool, total: int | None) -> dict:
    """Decode every frame once: count them, find their times, keep the frames nearest ``sample_times``.

    Kept frames are as displayed, at most :data:`DETECT_MAX_SIDE` px."""
    from tqdm import tqdm

    container, vs, _ = open_video(path)
    samples: list[np.ndarray] = []
    sample_at: list[float] = []
    n, first, last, turns, size, rate = 0, None, None, 0, None, None
    try:
        rate = float(vs.average_rate or vs.guessed_rate or 25)
        want = list(sample_times)
        with tqdm(total=total or None, desc="scan video", unit="frame", disable=not progress,
                  dynamic_ncols=True) as bar:
            for frame in container.decode(vs):
                t = frame_time(frame, n, rate)
                if first is None:
                    first, turns = t, rotation_turns(frame)
                    fw, fh = (frame.height, frame.width) if turns % 2 else (frame.width, frame.height)
                    d = min(1.0, DETECT_MAX_SIDE / max(fw, fh))
                    size = (fw, fh, max(2, round(fw * d)), max(2, round(fh * d)))
                last = t
                n += 1
                bar.update(1)
                if want and t - first >= want[0] - 1e-6:
                    while want and t - first >= want[0] - 1e-6:
                        want.pop(0)
                    samples.append(rgb_frame(frame, turns, size[2], size[3]))
                    sample_at.append(t - first)
    except Exception as exc:  # noqa: BLE001 - a decoder failure becomes a message naming the file
        import av

        if isinstance(exc, av.error.FFmpegError):
            raise media_error(path, f"is truncated or corrupt after {n} frames ({exc})") from exc
        raise
    finally:
        container.close()
    if n == 0:
        raise media_error(path, "has a video stream but no frame could be decoded (empty or corrupt)")
    return {"frames": n, "first_s": first, "last_s": last, "turns": turns, "rate": rate,
            "width": size[0], "height": size[1], "detect_scale": size[2] / size[0], "samples": samples,
            "sample_times": sample_at}


def read_audio(path) -> tuple[np.ndarray, float | None]:
    """The audio track as int16 mono 16 kHz, and the time in s of its first sample. The time is None if unknown."""
    import av

    container, _, stream = open_video(path)
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
            raise media_error(path, f"its audio track is truncated or corrupt ({exc})") from exc
    finally:
        container.close()
    return (np.concatenate(blocks).astype(np.int16) if blocks else np.zeros(0, np.int16)), start


def align_audio(audio: np.ndarray, start: float | None, t0: float) -> np.ndarray:
    """``audio`` starting at ``start`` → sample 0 at the first video frame's time ``t0``."""
    shift = int(round(((start if start is not None else t0) - t0) * SAMPLE_RATE))
    if shift > 0:
        return np.concatenate([np.zeros(shift, np.int16), audio])
    return audio[-shift:] if shift < 0 else audio


class ClipWriter:
    """One ``clip_NNNNN.mp4``: H.264 yuv420p + AAC 16 kHz mono, written as ``.partial.mp4`` first."""

    def __init__(self, path: str, width: int, height: int, fps: int):
        import av


        self.path = path
        self.partial = partial_name(path)
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


__all__ = ["SAMPLE_RATE", "DETECT_MAX_SIDE", "media_error", "open_video", "rotation_turns", "rgb_frame", "frame_time",
           "probe", "scan", "read_audio", "align_audio", "ClipWriter"]
