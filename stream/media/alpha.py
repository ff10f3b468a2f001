"""Video with an alpha channel.

Pictures and their mattes are joined into RGBA. They are written to WebM files, VP9 with alpha, or to ProRes
4444 ``.mov`` files. Such files are read back. RGBA pictures can also go out as PNG / WebP images.

    video uint8 [H, W, 3] ─┐
                           ├─▶ JoinAlpha ──rgba uint8 [H, W, 4]──▶ AlphaVideoSink("talk.webm" | "talk.mov")
    alpha uint8 [H, W] ────┘                                          ▲ audio int16 [chunk]

The format follows the file name, by :data:`ALPHA_FORMATS`:

- ``.webm``: VP9 from libvpx in ``yuva420p``, with Opus sound. The alpha plane is coded as a second VP9 stream.
  Browsers and OBS play that with transparency.
- ``.mov``: ProRes 4444 from ``prores_ks`` in ``yuva444p10le``, with 16-bit PCM sound. It is the editors'
  intermediate. Alpha is kept losslessly.

Both encoders are in the FFmpeg that PyAV's wheel carries. FFmpeg's own VP9 decoder drops the alpha plane. So
:func:`read_video_rgba` decodes WebM with libvpx's.
"""
from __future__ import annotations

import io
import os

import av
import numpy as np
import torch
from PIL import Image

from ..frame import Flag, PortSpec
from ..stage import Stage
from .audio import SAMPLE_RATE
from .errors import MediaError, open_media
from .video import MP4Sink, _put_bytes, video_port

# file suffix → (container, video encoder, pixel format, encoder options, audio encoder)
ALPHA_FORMATS = {
    ".webm": ("webm", "libvpx-vp9", "yuva420p", {"crf": "18", "b:v": "0", "deadline": "good", "cpu-used": "5",
                                                 "row-mt": "1"}, "libopus"),
    ".mov": ("mov", "prores_ks", "yuva444p10le", {"profile": "4", "alpha_bits": "16"}, "pcm_s16le"),
}
IMAGE_CODECS = ("png", "webp")  # RGBA pictures one by one: the server's transparent video


def alpha_format(path) -> str:
    """The suffix of ``path`` when it names a video format with alpha, one of :data:`ALPHA_FORMATS`.

    Otherwise raises ``ValueError`` naming the suffix and those expected.
    """
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in ALPHA_FORMATS:
        raise ValueError(f"{os.fspath(path)!r}: video with alpha is written as WebM (VP9 with alpha, .webm) or ProRes "
                         f"4444 (.mov); the name ends in {suffix or 'no suffix'!r}")
    return suffix


def rgba_port(width: int, height: int) -> PortSpec:
    return PortSpec((height, width, 4), torch.uint8, "cpu")


class JoinAlpha(Stage):
    """A picture and its matte, frame for frame, as one RGBA picture.

    Ports: in ``"video"`` ``uint8 [H, W, 3]`` and ``"alpha"`` ``uint8 [H, W]``. They are the same frame's, in
    lock-step. Out ``"rgba"`` ``uint8 [H, W, 4]``. Its alpha is straight, not premultiplied.
    """

    def __init__(self, *, width: int, height: int, name: str = "join_alpha"):
        super().__init__(name)
        self.inputs = {"video": video_port(width, height), "alpha": PortSpec((height, width), torch.uint8, "cpu")}
        self.outputs = {"rgba": rgba_port(width, height)}

    def process(self, inputs, out):
        rgba = out.write("rgba").data
        rgba[..., :3].copy_(inputs["video"].data)
        rgba[..., 3].copy_(inputs["alpha"].data)


class AlphaVideoSink(MP4Sink):
    """Sink: a video file with an alpha channel and, when ``audio_rate`` is set, sound.

    The name's suffix picks the format from :data:`ALPHA_FORMATS`. It is WebM VP9 + Opus, or ProRes 4444
    ``.mov`` + PCM.

    Inputs: ``"video"`` ``uint8 [H, W, 4]`` RGBA with straight alpha, as :class:`JoinAlpha` makes it. And
    ``"audio"`` ``int16 [chunk]``. Streams are muxed by pts. The file is written as ``NAME.partial.EXT`` and
    renamed at the end, as :class:`MP4Sink` does.
    """

    def __init__(self, path, *, width: int, height: int, fps: float, audio_rate: int | None = SAMPLE_RATE,
                 audio_chunk_ms: int = 20, name: str = "alpha_video"):
        self.suffix = alpha_format(path)
        super().__init__(path, width=width, height=height, fps=fps, audio_rate=audio_rate,
                         audio_chunk_ms=audio_chunk_ms, name=name)
        self.inputs["video"] = rgba_port(width, height)

    def _open(self):
        return self._open_streams(*ALPHA_FORMATS[self.suffix])

    def _video_frame(self, data: torch.Tensor) -> av.VideoFrame:
        return av.VideoFrame.from_ndarray(data.numpy(), format="rgba")


def _decoded_frames(container, stream):
    """The decoded frames of ``stream``.

    WebM's VP9 goes through libvpx. It decodes the alpha plane that FFmpeg's own VP9 decoder drops. Anything
    else goes through the stream's own decoder.
    """
    if stream.codec_context.name != "vp9":
        yield from container.decode(stream)
        return
    decoder = av.CodecContext.create("libvpx-vp9", "r")
    for packet in container.demux(stream):
        if packet.size:
            yield from decoder.decode(packet)
    yield from decoder.decode(None)


def read_video_rgba(path) -> dict:
    """Decode a video file with alpha, as :class:`AlphaVideoSink` writes.

    Returns ``{"frames": uint8 [T, H, W, 4] RGBA, "fps", "has_alpha"}``. For a file without an alpha plane,
    ``has_alpha`` is False and alpha is 255.
    """
    container = open_media(path)
    try:
        if not container.streams.video:
            raise MediaError(path, "has no video stream; expected a video file")
        vs = container.streams.video[0]
        frames, has_alpha = [], False
        for f in _decoded_frames(container, vs):
            has_alpha = has_alpha or "a" in f.format.name.replace("gray", "")
            frames.append(f.to_ndarray(format="rgba"))
        fps = float(vs.average_rate) if vs.average_rate else None
    finally:
        container.close()
    return {"frames": np.stack(frames) if frames else np.zeros((0, 0, 0, 4), np.uint8), "fps": fps,
            "has_alpha": has_alpha}


class RGBAImageEncoder(Stage):
    """``uint8 [H, W, 4]`` RGBA in, a PNG or WebP picture out on a variable-length ``uint8`` port.

    PNG is lossless. WebP uses ``quality`` and is lossless at 100. These are video frames for consumers that
    keep alpha, one picture a frame.
    """

    def __init__(self, *, width: int, height: int, codec: str = "png", quality: int = 90, name: str = "rgba_image"):
        super().__init__(name)
        if codec not in IMAGE_CODECS:
            raise ValueError(f"RGBAImageEncoder: codec {codec!r}; expected one of {IMAGE_CODECS}")
        if not 1 <= quality <= 100:
            raise ValueError(f"RGBAImageEncoder: quality must be 1..100, got {quality}")
        self.codec, self.quality = codec, quality
        self.inputs = {"rgba": rgba_port(width, height)}
        self.outputs = {codec: PortSpec((width * height * 4 + 65536,), torch.uint8, "cpu", variable=True)}
        self._buf = io.BytesIO()

    def process(self, inputs, out):
        self._buf.seek(0)
        self._buf.truncate()
        image = Image.fromarray(inputs["rgba"].data.numpy(), mode="RGBA")
        if self.codec == "png":
            image.save(self._buf, "PNG", compress_level=1)
        else:
            image.save(self._buf, "WEBP", quality=self.quality, lossless=self.quality == 100, method=2)
        frame = out.write(self.codec)
        _put_bytes(frame, self._buf.getbuffer(), self.name)
        frame.flags |= Flag.KEYFRAME


__all__ = ["ALPHA_FORMATS", "IMAGE_CODECS", "alpha_format", "rgba_port", "JoinAlpha", "AlphaVideoSink",
           "read_video_rgba", "RGBAImageEncoder"]
