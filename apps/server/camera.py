"""Camera frames a client sends: JPEG pictures in binary media messages (kind ``JPEG``), checked, decoded,
scaled to the session size and pushed into the pipeline's graph; or, over WebRTC, the decoded pictures of its
camera track (``push_picture``: scaled and pushed, no JPEG in between).

    client ──JPEG──▶ CameraInput.push_jpeg (the session's receiver) ──uint8 [H, W, 3]──▶ source ("video" port)
    client ──video track──▶ webrtc_media.pump_camera ──▶ CameraInput.push_picture ──┘

:class:`CameraInput` is what a pipeline with camera input returns as ``Pipeline.video_in``; its ``source``
(a :class:`~framegraph.stream.PushSource` of session-size pictures) is the graph's video source. The newest
picture wins: when the graph is busy, a picture still waiting is replaced by the next one (``superseded``),
nothing queues. Until the first picture arrives the source waits, so the graph produces nothing (no picture
is invented in the meantime).

Flow control: ``ready.video_in.pictures_per_chunk`` (``{"first", "next"}``) says how many pictures make
each output chunk (``generate``: ``1 + 4 (F - 1)``, then ``4 F``); a chunk's frames, as many as its
pictures, go out together. A client that must not lose a picture (``framegraph client --camera FILE``)
sends one chunk's pictures and waits for their frames before it sends the next, so no picture ever waits
behind a busy model to be replaced; a live camera just sends (the newest picture wins).

Every refusal is a :class:`~.protocol.ProtocolError` and leaves the session running:

- ``too_large``: a payload over ``max_bytes``, or a picture over :data:`~.limits.MAX_PIXELS` pixels
  (checked from the JPEG header, before decoding);
- ``bad_binary``: a payload that is not a JPEG, or one that does not decode (truncated, corrupt);
- ``rate_limited``: pictures faster than ``max_fps`` (a token bucket, bursts of one second's worth, at least
  :data:`BURST_FRAMES`): the extra ones are dropped and counted (``dropped_rate``); the error is sent for the
  first drop only. The burst absorbs jitter between the client's camera and the server's receiver (timers,
  the network, a busy server reading several pictures at once): a camera at its pace is not refused for it.

Decoding runs on the receiver (the event loop): a 832×480 JPEG takes a few ms with PIL, at most ``max_fps``
times a second; a bigger picture is decoded at a reduced scale (JPEG draft mode) when that still covers the
session size.
"""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from framegraph.stream import PushSource
from framegraph.stream.media import scale_picture, video_port

from .limits import MAX_PIXELS, TokenBucket
from .protocol import ErrorCode, ProtocolError

BURST_FRAMES = 3  # the fewest pictures a client may send back to back before the rate counts
JPEG_MAGIC = b"\xff\xd8\xff"


def default_max_bytes(width: int, height: int) -> int:
    """The largest JPEG accepted for a ``width × height`` session: 1.5 bytes per pixel (a quality-95 JPEG of a
    busy picture takes about 1), at least 64 KiB."""
    return max(64 * 1024, int(1.5 * width * height))


class CameraInput:
    """The camera input of one session: JPEG payloads in, session-size pictures out of :attr:`source`.

    Args:
        width / height: the session's picture size; pictures of another size are scaled to fit (aspect kept,
            black bars; :func:`~framegraph.stream.media.scale_picture`, as the file input of ``generate``).
        max_fps: the most pictures a second the client may send (the session's fps).
        max_bytes: the largest JPEG payload (default :func:`default_max_bytes`); the session lowers it to what
            its per-message limit lets through.
        pictures_per_chunk: ``(first, next)``: the pictures of the first output chunk and of every later one
            (``ready.video_in.pictures_per_chunk``; ``(1, 1)``: a frame per picture).
        name: the source stage's name.

    Counters: ``frames_in`` (pictures pushed), ``dropped_rate`` (dropped for coming faster than ``max_fps``),
    ``scaled`` (pictures of another size than the session's), ``last_size`` (``(width, height)`` of the last
    picture as sent).
    """

    def __init__(self, *, width: int, height: int, max_fps: float, max_bytes: int | None = None,
                 pictures_per_chunk: tuple[int, int] = (1, 1), name: str = "camera"):
        if max_fps <= 0:
            raise ValueError(f"CameraInput: max_fps={max_fps}; expected a positive number of pictures per second")
        self.width, self.height, self.max_fps = width, height, float(max_fps)
        self.pictures_per_chunk = pictures_per_chunk
        self.max_bytes = max_bytes or default_max_bytes(width, height)
        self.source = PushSource(video_port(width, height), name=name, port="video")
        self.frames_in = self.dropped_rate = self.scaled = 0
        self.last_size: tuple[int, int] | None = None
        self._bucket = TokenBucket(self.max_fps, max(BURST_FRAMES, self.max_fps))

    def describe(self) -> dict:
        """``ready.video_in``: what the client sends."""
        first, later = self.pictures_per_chunk
        return {"format": "jpeg", "width": self.width, "height": self.height, "max_bytes": self.max_bytes,
                "max_fps": self.max_fps, "pictures_per_chunk": {"first": first, "next": later}}

    def push_jpeg(self, payload: bytes) -> bool:
        """Check, decode, scale and push one JPEG picture. Returns False when it was dropped for the rate (the
        first such drop raises ``rate_limited`` instead); raises :class:`~.protocol.ProtocolError` for a payload
        it refuses."""
        if len(payload) > self.max_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"camera picture of {len(payload)} bytes exceeds video_in."
                                                     f"max_bytes = {self.max_bytes}; send a smaller or more "
                                                     f"compressed JPEG (lower quality)")
        if not self._within_rate():
            return False
        return self._push(self.decode(payload))

    def push_picture(self, picture: np.ndarray) -> bool:
        """One decoded camera picture (``uint8 [H, W, 3]`` RGB, a WebRTC camera track's frame): scaled and pushed
        as :meth:`push_jpeg` does; False when it was dropped for the rate."""
        if picture.ndim != 3 or picture.shape[2] != 3 or picture.shape[0] * picture.shape[1] > MAX_PIXELS:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"camera picture of shape {tuple(picture.shape)}: expected "
                                                     f"[H, W, 3] of at most {MAX_PIXELS} pixels")
        if not self._within_rate():
            return False
        self.last_size = (picture.shape[1], picture.shape[0])
        return self._push(torch.from_numpy(np.ascontiguousarray(picture)))

    def _within_rate(self) -> bool:
        if self._bucket.take():
            return True
        self.dropped_rate += 1
        if self.dropped_rate == 1:
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"camera pictures come faster than video_in.max_fps = "
                                                        f"{self.max_fps:g}; the extra ones are dropped (told "
                                                        f"once; stats.received.video_dropped counts them)")
        return False

    def _push(self, picture: torch.Tensor) -> bool:
        if picture.shape[:2] != (self.height, self.width):
            picture = scale_picture(picture, (self.width, self.height))
            self.scaled += 1
        self.source.push(picture)
        self.frames_in += 1
        return True

    def decode(self, payload: bytes) -> torch.Tensor:
        """A JPEG payload → ``uint8 [H, W, 3]`` RGB (at a reduced scale when the picture is far bigger than the
        session size); ``bad_binary`` / ``too_large`` otherwise."""
        if not payload.startswith(JPEG_MAGIC):
            raise ProtocolError(ErrorCode.BAD_BINARY, f"camera picture is not a JPEG (starts with "
                                                      f"{bytes(payload[:4]).hex(' ')}; a JPEG starts with ff d8 ff); "
                                                      f"send kind 1 messages holding one JPEG image each")
        try:
            with Image.open(io.BytesIO(payload), formats=["JPEG"]) as im:
                w, h = im.size
                self.last_size = (w, h)
                if w * h > MAX_PIXELS:
                    raise ProtocolError(ErrorCode.TOO_LARGE, f"camera picture of {w}x{h} pixels exceeds "
                                                             f"{MAX_PIXELS} pixels; send {self.width}x{self.height} "
                                                             f"(video_in.width x height)")
                im.draft("RGB", (self.width, self.height))  # DCT scaling: never below the size asked
                rgb = im.convert("RGB")
        except ProtocolError:
            raise
        except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError... for bad data
            raise ProtocolError(ErrorCode.BAD_BINARY, f"camera picture does not decode as a JPEG "
                                                      f"({type(exc).__name__}: {exc})") from None
        return torch.from_numpy(np.array(rgb))

    def close(self) -> None:
        """The client's pictures end: the source ends once a picture still waiting is out."""
        self.source.close()
