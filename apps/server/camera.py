"""Camera frames a client sends, into the pipeline's graph.

Over WebSocket they are JPEG pictures in binary media messages of kind ``JPEG``.
Each is checked, decoded, scaled to the session size and pushed into the graph.
Over WebRTC they are the decoded pictures of the client's camera track.
``push_picture`` scales and pushes them, with no JPEG in between.

    client ──JPEG──▶ CameraInput.push_jpeg (the session's receiver) ──uint8 [H, W, 3]──▶ source ("video" port)
    client ──video track──▶ webrtc_media.pump_camera ──▶ CameraInput.push_picture ──┘

A pipeline with camera input returns a :class:`CameraInput` as ``Pipeline.video_in``.
Its ``source`` is the graph's video source: a :class:`~framegraph.stream.PushSource` of session-size pictures.
The newest picture wins. When the graph is busy, the next picture replaces one still waiting.
That one counts as ``superseded``. Nothing queues.
Until the first picture arrives the source waits, so the graph produces nothing.
No picture is invented in the meantime.

Flow control: ``ready.video_in.pictures_per_chunk`` says how many pictures make each output chunk.
Its keys are ``"first"`` and ``"next"``.
For ``generate`` they are ``1 + 4 (F - 1)``, then ``4 F``.
A chunk's frames, as many as its pictures, go out together.
Some clients must not lose a picture, such as ``framegraph client --camera FILE``.
Such a client sends one chunk's pictures and waits for their frames before it sends the next.
So no picture waits behind a busy model to be replaced.
A live camera just sends, and the newest picture wins.

Every refusal is a :class:`~.protocol.ProtocolError` and leaves the session running:

- ``too_large``: a payload over ``max_bytes``, or a picture over :data:`~.limits.MAX_PIXELS` pixels.
  The size is read from the JPEG header, before decoding.
- ``bad_binary``: a payload that is not a JPEG, or one that does not decode.
- ``rate_limited``: pictures faster than ``max_fps``.
  A token bucket allows bursts of one second's worth, at least :data:`BURST_FRAMES`.
  The extra pictures are dropped and counted in ``dropped_rate``.
  The error is sent for the first drop only.
  The burst absorbs jitter between the client's camera and the server's receiver.
  So a camera at its own pace is not refused.

Decoding runs on the receiver, on the event loop, at most ``max_fps`` times a second.
A bigger picture is decoded at a reduced scale in JPEG draft mode, when that still covers the session size.
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
    """The largest JPEG accepted for a ``width × height`` session: 1.5 bytes per pixel, at least 64 KiB.

    A quality-95 JPEG of a busy picture takes about 1 byte per pixel.
    """
    return max(64 * 1024, int(1.5 * width * height))


class CameraInput:
    """The camera input of one session: JPEG payloads in, session-size pictures out of :attr:`source`.

    Args:
        width / height: the session's picture size. Pictures of another size are scaled to fit.
            The aspect is kept, with black bars, as in :func:`~framegraph.stream.media.scale_picture`.
        max_fps: the most pictures a second the client may send. This is the session's fps.
        max_bytes: the largest JPEG payload. Default :func:`default_max_bytes`.
            The session lowers it to what its per-message limit lets through.
        pictures_per_chunk: ``(first, next)``, the pictures of the first output chunk and of every later one.
            This is ``ready.video_in.pictures_per_chunk``. ``(1, 1)`` is a frame per picture.
        name: the source stage's name.

    Counters:

    - ``frames_in``: pictures pushed.
    - ``dropped_rate``: pictures dropped for coming faster than ``max_fps``.
    - ``scaled``: pictures of another size than the session's.
    - ``last_size``: ``(width, height)`` of the last picture as sent.
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
        """Check, decode, scale and push one JPEG picture.

        Returns False when the picture was dropped for the rate.
        The first such drop raises ``rate_limited`` instead.
        Raises :class:`~.protocol.ProtocolError` for a payload it refuses.
        """
        if len(payload) > self.max_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"camera picture of {len(payload)} bytes exceeds video_in."
                                                     f"max_bytes = {self.max_bytes}; send a smaller or more "
                                                     f"compressed JPEG (lower quality)")
        if not self._within_rate():
            return False
        return self._push(self.decode(payload))

    def push_picture(self, picture: np.ndarray) -> bool:
        """One decoded camera picture, ``uint8 [H, W, 3]`` RGB, from a WebRTC camera track.

        It is scaled and pushed as :meth:`push_jpeg` does.
        Returns False when it was dropped for the rate.
        """
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
        """A JPEG payload → ``uint8 [H, W, 3]`` RGB.

        A picture far bigger than the session size decodes at a reduced scale.
        Raises ``bad_binary`` or ``too_large`` otherwise.
        """
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
        """The client's pictures end. The source ends once a picture still waiting is out."""
        self.source.close()
