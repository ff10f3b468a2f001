"""Video out: MP4 (H.264 + AAC) files, live H.264 and JPEG encoders, image sequences.

Video frames travel as ``uint8 [H, W, 3]`` RGB on the CPU. Encoded payloads travel on variable-length
``uint8`` ports. ``frame.length`` bytes are valid. So a WebSocket sink can send them as they are.
"""
from __future__ import annotations

import io
import os
from fractions import Fraction

import av
import numpy as np
import torch
from PIL import Image

from ..files import partial_name
from ..frame import Flag, PortSpec
from ..stage import EndOfStream, IndexedSource, Stage
from .audio import SAMPLE_RATE, chunk_samples
from .errors import MediaError, open_media

# x264 settings. "live": every frame leaves the encoder at once. That is zerolatency: no lookahead, no
# B-frames, no frame threads. "offline": better compression; the encoder may hold frames back.
# "master": near-transparent at crf 10, for files that are training data. docs/runtimes.md has its cost.
PRESETS = {
    "live": {"preset": "ultrafast", "tune": "zerolatency", "bf": "0"},
    "offline": {"preset": "veryfast", "crf": "20"},
    "master": {"preset": "veryfast", "crf": "10"},
}


def video_port(width: int, height: int) -> PortSpec:
    return PortSpec((height, width, 3), torch.uint8, "cpu")


def _check_size(width: int, height: int, what: str) -> None:
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"{what}: size {width}x{height} must be positive and even (H.264 yuv420p)")


class MP4Sink(Stage):
    """Sink: writes an MP4 file with H.264 yuv420p video and, optionally, AAC audio.

    Inputs: ``"video"`` ``uint8 [H, W, 3]``. When ``audio_rate`` is set, also ``"audio"``
    ``int16 [chunk]`` mono PCM. Streams are muxed by pts, from session ticks to each stream's own time
    base. So picture and sound stay in sync whatever order frames arrive in, with ``trigger = "any"``.

    The file is written as ``NAME.partial.mp4``. It is renamed to ``path`` when the stream ends normally.
    Ctrl-C → drain is a normal end too. If the graph is cancelled or a stage fails, what was written is
    closed properly. It is kept as ``NAME.partial.mp4``, in ``self.partial_path``. It is never silently
    half-written.
    """

    trigger = "any"

    def __init__(self, path, *, width: int, height: int, fps: float, audio_rate: int | None = SAMPLE_RATE,
                 audio_chunk_ms: int = 20, preset: str = "offline", name: str = "mp4"):
        super().__init__(name)
        _check_size(width, height, f"MP4Sink {path}")
        if preset not in PRESETS:
            raise ValueError(f"MP4Sink: unknown preset {preset!r}; expected one of {list(PRESETS)}")
        self.path = os.fspath(path)
        self.partial_path = partial_name(self.path)
        self.width, self.height = width, height
        self.fps = Fraction(fps).limit_denominator(1001)
        self.audio_rate = audio_rate
        self.preset = preset
        self.inputs = {"video": video_port(width, height)}
        if audio_rate:
            self.inputs["audio"] = PortSpec((chunk_samples(audio_rate, audio_chunk_ms),), torch.int16, "cpu")
        self.frames_written = 0
        self.audio_samples_written = 0
        self._container = None
        self._last_audio_pts_ticks = None

    def setup(self, ctx):
        super().setup(ctx)
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        self.frames_written = self.audio_samples_written = 0
        self._last_video_index = -1
        self._container, self._vstream, self._astream = self._open()

    def _open(self):
        """The container and its video and audio streams, ready to mux.

        The audio stream is None without audio. Here it is H.264 + AAC in MP4. A sink for another format
        overrides this, using :meth:`_open_streams`. It also overrides :meth:`_video_frame`.
        """
        options = dict(PRESETS[self.preset], g=str(max(1, round(2 * self.fps))))
        return self._open_streams("mp4", "libx264", "yuv420p", options, "aac")

    def _open_streams(self, fmt: str, vcodec: str, pix_fmt: str, options: dict, acodec: str):
        """``partial_path`` opened as container ``fmt``.

        It has a ``vcodec`` stream at the sink's size and rate, with ``pix_fmt`` and encoder ``options``.
        It has a mono ``acodec`` stream when the sink has sound.
        """
        container = av.open(self.partial_path, mode="w", format=fmt)
        vs = container.add_stream(vcodec, rate=self.fps)
        vs.width, vs.height, vs.pix_fmt = self.width, self.height, pix_fmt
        vs.codec_context.time_base = Fraction(1) / self.fps
        vs.codec_context.options = dict(options)
        audio = None
        if self.audio_rate:
            audio = container.add_stream(acodec, rate=self.audio_rate)
            audio.layout = "mono"
            audio.codec_context.time_base = Fraction(1, self.audio_rate)
        return container, vs, audio

    def _video_frame(self, data: torch.Tensor) -> av.VideoFrame:
        """A ``"video"`` frame's data as a PyAV frame for the encoder.

        The encoder converts it to the stream's pixel format.
        """
        return av.VideoFrame.from_ndarray(data.numpy(), format="rgb24")

    def process(self, inputs, out):
        clock = self.ctx.clock
        if "audio" in inputs:
            f = inputs["audio"]
            samples = f.valid.numpy().reshape(1, -1)
            af = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            af.sample_rate = self.audio_rate
            af.pts = f.pts * self.audio_rate // clock.ticks_per_second
            af.time_base = Fraction(1, self.audio_rate)
            self._container.mux(self._astream.encode(af))
            self.audio_samples_written += f.length
            self._last_audio_pts_ticks = f.pts + clock.ticks_from_samples(f.length, self.audio_rate)
        if "video" in inputs:
            f = inputs["video"]
            index = clock.frame_at_ticks(f.pts, self.fps)
            if index <= self._last_video_index:  # two frames map to one slot: keep time monotonic
                index = self._last_video_index + 1
            vf = self._video_frame(f.data)
            vf.pts = index
            vf.time_base = Fraction(1) / self.fps
            self._container.mux(self._vstream.encode(vf))
            self._last_video_index = index
            self.frames_written += 1
            if self._last_audio_pts_ticks is not None and self.ctx.telemetry is not None:
                self.ctx.telemetry.record_av_offset(
                    1000.0 * clock.seconds(f.pts - self._last_audio_pts_ticks))

    def teardown(self):
        if self._container is None:
            return
        try:
            self._container.mux(self._vstream.encode(None))
            if self._astream is not None:
                self._container.mux(self._astream.encode(None))
        finally:
            self._container.close()
            self._container = None
        if not self.ctx.cancelled():
            os.replace(self.partial_path, self.path)


def encoder_opens(codec: str) -> bool:
    """True when FFmpeg has the encoder ``codec`` and it opens on this machine.

    A hardware encoder such as ``h264_nvenc`` is compiled into the wheel whether or not its GPU and driver
    are here. Only opening it tells.
    """
    try:
        c = av.CodecContext.create(codec, "w")
        if c.type == "video":
            c.width, c.height, c.time_base = 64, 64, Fraction(1, 25)
            c.pix_fmt = c.codec.video_formats[0].name
        else:
            c.sample_rate, c.layout, c.format = 48000, "stereo", c.codec.audio_formats[0].name
        c.open()
        return True
    except Exception:  # noqa: BLE001 - unknown codec, no device, no driver: not usable here
        return False


class H264Encoder(Stage):
    """Live H.264 encoder: ``uint8 [H, W, 3]`` frames in, one Annex-B access unit out per frame.

    It runs zerolatency, with no B-frames. The output is a variable-length ``uint8`` port. Key frames carry
    :attr:`Flag.KEYFRAME`. One comes every ``gop`` frames, so a client can join mid-stream.
    """

    def __init__(self, *, width: int, height: int, fps: float, gop: int | None = None,
                 bitrate_kbps: int | None = None, name: str = "h264"):
        super().__init__(name)
        _check_size(width, height, "H264Encoder")
        self.width, self.height, self.fps = width, height, Fraction(fps).limit_denominator(1001)
        self.gop = gop or max(1, round(2 * self.fps))
        self.bitrate_kbps = bitrate_kbps
        self.inputs = {"video": video_port(width, height)}
        self.outputs = {"h264": PortSpec((width * height * 3 // 2 + 65536,), torch.uint8, "cpu", variable=True)}
        self._codec = None
        self._keyframe_requested = False

    def request_keyframe(self) -> None:
        """Make the next frame a key frame. Callable from any thread.

        Use it when a live sink dropped frames that later ones depend on, or a client joined mid-stream.
        """
        self._keyframe_requested = True

    def setup(self, ctx):
        super().setup(ctx)
        c = av.CodecContext.create("libx264", "w")
        c.width, c.height, c.pix_fmt = self.width, self.height, "yuv420p"
        c.time_base = Fraction(1) / self.fps
        c.framerate = self.fps
        opts = dict(PRESETS["live"], g=str(self.gop))
        if self.bitrate_kbps:
            c.bit_rate = self.bitrate_kbps * 1000
        c.options = opts
        self._codec = c
        self._index = 0

    def process(self, inputs, out):
        vf = av.VideoFrame.from_ndarray(inputs["video"].data.numpy(), format="rgb24")
        vf.pts = self._index
        self._index += 1
        if self._keyframe_requested:
            self._keyframe_requested = False
            vf.pict_type = av.video.frame.PictureType.I
        packets = self._codec.encode(vf)
        if not packets:
            return
        payload = b"".join(bytes(p) for p in packets)
        frame = out.write("h264")
        _put_bytes(frame, payload, self.name)
        if any(p.is_keyframe for p in packets):
            frame.flags |= Flag.KEYFRAME

    def teardown(self):
        self._codec = None


class JpegEncoder(Stage):
    """``uint8 [H, W, 3]`` RGB in, a JPEG image out on a variable-length ``uint8`` port."""

    def __init__(self, *, width: int, height: int, quality: int = 85, name: str = "jpeg"):
        super().__init__(name)
        if not 1 <= quality <= 100:
            raise ValueError(f"JpegEncoder: quality must be 1..100, got {quality}")
        self.quality = quality
        self.inputs = {"video": video_port(width, height)}
        self.outputs = {"jpeg": PortSpec((width * height * 3 + 65536,), torch.uint8, "cpu", variable=True)}
        self._buf = io.BytesIO()

    def process(self, inputs, out):
        self._buf.seek(0)
        self._buf.truncate()
        Image.fromarray(inputs["video"].data.numpy()).save(self._buf, "JPEG", quality=self.quality)
        frame = out.write("jpeg")
        _put_bytes(frame, self._buf.getbuffer(), self.name)
        frame.flags |= Flag.KEYFRAME


def _put_bytes(frame, payload, who: str) -> None:
    n = len(payload)
    if n > frame.data.shape[0]:
        raise ValueError(f"{who}: encoded frame of {n} bytes exceeds the port capacity "
                         f"{frame.data.shape[0]} bytes")
    frame.data[:n] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    frame.length = n


class ImageSequenceSink(Stage):
    """Sink: writes each frame to ``folder/pattern``, such as ``frame_000000.png``.

    The extension picks PNG or JPEG. The frame index comes from pts, so dropped frames leave gaps, not shifts.
    """

    def __init__(self, folder, *, width: int, height: int, fps: float, pattern: str = "frame_{:06d}.png",
                 name: str = "images"):
        super().__init__(name)
        self.folder = os.fspath(folder)
        self.pattern = pattern
        self.fps = Fraction(fps).limit_denominator(1001)
        self.inputs = {"video": video_port(width, height)}
        self.written: list[str] = []

    def setup(self, ctx):
        super().setup(ctx)
        os.makedirs(self.folder, exist_ok=True)
        self.written = []

    def process(self, inputs, out):
        f = inputs["video"]
        path = os.path.join(self.folder, self.pattern.format(self.ctx.clock.frame_at_ticks(f.pts, self.fps)))
        Image.fromarray(f.data.numpy()).save(path)
        self.written.append(path)


def iter_video_frames(path):
    """Yield the frames of a video file one by one as ``uint8 [H, W, 3]`` RGB.

    Memory stays constant. Use it for long files that :func:`read_video` would hold in RAM all at once.
    """
    container = open_media(path)
    try:
        if not container.streams.video:
            raise MediaError(path, "has no video stream; expected a video file")
        for f in container.decode(container.streams.video[0]):
            yield f.to_ndarray(format="rgb24")
    finally:
        container.close()


def read_video(path) -> dict:
    """Decode an MP4 or any video file for inspection.

    Returns ``{"frames": uint8 [T, H, W, 3], "frame_times_s": [T], "fps", "audio": int16 [S] or None,
    "audio_rate", "audio_start_s"}``.
    """
    container = open_media(path)
    try:
        if not container.streams.video:
            raise MediaError(path, "has no video stream; expected a video file")
        vs = container.streams.video[0]
        frames, times = [], []
        for f in container.decode(vs):
            frames.append(f.to_ndarray(format="rgb24"))
            times.append(float(f.pts * f.time_base) if f.pts is not None else float("nan"))
        fps = float(vs.average_rate) if vs.average_rate else None
    finally:
        container.close()
    audio, rate, start = None, None, None
    container = open_media(path)
    try:
        if container.streams.audio:
            a = container.streams.audio[0]
            rate = a.codec_context.sample_rate
            blocks = []
            for f in container.decode(a):
                if start is None and f.pts is not None:
                    start = float(f.pts * f.time_base)
                arr = f.to_ndarray()
                if arr.dtype != np.int16:  # AAC decodes to float planar
                    arr = np.clip(np.round(arr * 32767.0), -32768, 32767).astype(np.int16)
                blocks.append(arr[0])
            audio = np.concatenate(blocks) if blocks else np.zeros(0, np.int16)
    finally:
        container.close()
    return {"frames": np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8),
            "frame_times_s": np.array(times), "fps": fps, "audio": audio, "audio_rate": rate,
            "audio_start_s": start}


def probe_video(path) -> tuple[int, int, float | None]:
    """``(width, height, fps)`` of a video file's first video stream. The fps is None when the file does not say."""
    container = open_media(path)
    try:
        if not container.streams.video:
            raise MediaError(path, "has no video stream; expected a video file")
        vs = container.streams.video[0]
        return vs.codec_context.width, vs.codec_context.height, (float(vs.average_rate) if vs.average_rate else None)
    finally:
        container.close()


class VideoFileSource(IndexedSource):
    """Source: the frames of a video file, ``uint8 [H, W, 3]`` RGB at the file's own size, one per call.

    Frames are stamped at ``fps`` from frame 0. The default is the file's rate. With ``loop`` it starts again
    at the end, so a file can drive an endless stream. ``n_frames`` stops it after that many. The file is
    probed at construction, so a bad file fails before a graph is built.
    """

    def __init__(self, path, *, fps: float | None = None, loop: bool = False, n_frames: int | None = None,
                 name: str = "video_file"):
        width, height, file_fps = probe_video(os.fspath(path))
        super().__init__(name, fps=float(fps or file_fps or 25.0), n_frames=n_frames)
        self.path, self.width, self.height, self.loop = os.fspath(path), width, height, loop
        self.outputs = {"video": video_port(self.width, self.height)}
        self._frames = None

    def setup(self, ctx):
        super().setup(ctx)
        self._frames = iter_video_frames(self.path)

    def emit(self, out):
        rgb = next(self._frames, None)
        if rgb is None and self.loop and self.index:
            self._frames.close()
            self._frames = iter_video_frames(self.path)
            rgb = next(self._frames, None)
        if rgb is None:
            raise EndOfStream
        frame = out.write("video")
        frame.data.copy_(torch.from_numpy(rgb))
        return frame

    def teardown(self):
        if self._frames is not None:
            self._frames.close()
            self._frames = None
