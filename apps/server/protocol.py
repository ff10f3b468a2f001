"""The wire protocol of ``framegraph serve``, version 1: control messages and the binary media header.

``apps/PROTOCOL.md`` is the specification. This module is its executable twin.
Control messages are JSON text objects with a ``"type"``.
Media messages are binary: a fixed 48-byte little-endian :class:`MediaHeader`, then the payload.

Everything a client sends is checked here before the session acts on it.
Both :func:`parse_control` and :func:`parse_media` raise :class:`ProtocolError`.
It has a stable ``code`` and a message that names the offending value.
The session turns it into an ``error`` message.
"""
from __future__ import annotations

import enum
import json
import math
import struct
from dataclasses import dataclass

from framegraph.stream.media import SAMPLE_RATE

PROTOCOL_VERSION = 1
MAGIC = b"FG"
AUDIO_SAMPLE_RATE = SAMPLE_RATE  # PCM16 on the wire is the runtime's rate

# magic, version, kind, flags, header_len, seq, pts, capture_ns, graph_us, compute_us, encode_us,
# send_wait_us, payload_len
HEADER = struct.Struct("<2sBBHHIqqIIIII")
HEADER_BYTES = HEADER.size  # 48
assert HEADER_BYTES == 48


class Kind(enum.IntEnum):
    """What a binary message carries."""

    JPEG = 1  # server → client: one JPEG image
    H264 = 2  # server → client: one H.264 access unit, Annex-B (start codes), SPS/PPS on key frames
    PCM16 = 3  # both ways: mono little-endian int16 at 16 kHz
    PNG = 4  # server → client: one PNG image, RGBA (the avatar's ``background: "transparent"``)
    WEBP = 5  # server → client: one WebP image, RGBA (the same, smaller)


class MediaFlag(enum.IntFlag):
    """Bits of the header's ``flags`` field."""

    NONE = 0
    KEYFRAME = 1  # video that decodes on its own
    DISCONTINUITY = 2  # messages of this kind were dropped just before this one (or pts jumped)
    INTERRUPTED = 4  # first message after a barge-in (``interrupt``)
    CLIENT_CLOCK = 8  # capture_ns is in the client's clock (the capture time of the client audio
    #                   that produced this message); otherwise it is the server's monotonic clock


CLIENT_TYPES = ("start", "config", "interrupt", "pose", "stop", "ping")
SERVER_TYPES = ("ready", "error", "stats", "ended", "config", "pong")


class ErrorCode(str, enum.Enum):
    """``code`` of an ``error`` message. Stable: clients may switch on them."""

    BAD_JSON = "bad_json"  # a text message that is not a JSON object
    BAD_MESSAGE = "bad_message"  # a field is missing or has the wrong type / range
    UNKNOWN_TYPE = "unknown_type"  # "type" is not one of CLIENT_TYPES
    TOO_LARGE = "too_large"  # message over the server's per-message limit
    BAD_BINARY = "bad_binary"  # bad magic / version / kind, truncated, or length mismatch
    OUT_OF_ORDER = "out_of_order"  # e.g. audio before "start", "start" twice
    UNKNOWN_PIPELINE = "unknown_pipeline"
    BAD_OPTION = "bad_option"  # an option the pipeline does not know, or a bad value
    UNSUPPORTED = "unsupported"  # audio to a pipeline without audio input, pose without pose input
    RATE_LIMITED = "rate_limited"  # more messages per second than the server allows
    TIMEOUT = "timeout"  # no "start" in time
    PIPELINE_FAILED = "pipeline_failed"  # a stage raised; the session ends
    INTERNAL = "internal"
    BAD_OFFER = "bad_offer"  # WebRTC: an SDP offer that does not parse, or lacks a data channel or video
    FULL = "full"  # the model's measured capacity is taken by other sessions: retry after retry_after_s


class ProtocolError(Exception):
    """A client message the server refuses; ``code`` is an :class:`ErrorCode`."""

    def __init__(self, code: ErrorCode, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.retry_after_s = retry_after_s  # when trying again may succeed (``full``), in s

    def to_message(self, **extra) -> dict:
        retry = {} if self.retry_after_s is None else {"retry_after_s": self.retry_after_s}
        return {"type": "error", "code": self.code.value, "message": self.message, **retry, **extra}


@dataclass
class MediaHeader:
    """The 48-byte header in front of every binary message. See ``apps/PROTOCOL.md``.

    Attributes:
        kind: :class:`Kind` of the payload.
        flags: :class:`MediaFlag` bits.
        seq: per-kind counter of messages the sender produced. A gap means some were dropped.
        pts: presentation time in session ticks, 48 000 per second.
        capture_ns: capture time of the audio or source frame this message descends from, in ns.
        graph_us / compute_us / encode_us / send_wait_us: server-side timings of this message, in µs.
            They are source capture → sink, time in compute stages, time in the encoder,
            and time waiting in the session's send buffer. Zero in client → server messages.
        payload_len: bytes of payload after the header.
    """

    kind: int
    flags: int = 0
    seq: int = 0
    pts: int = 0
    capture_ns: int = 0
    graph_us: int = 0
    compute_us: int = 0
    encode_us: int = 0
    send_wait_us: int = 0
    payload_len: int = 0

    def pack(self) -> bytes:
        clamp = _clamp_u32
        return HEADER.pack(MAGIC, PROTOCOL_VERSION, int(self.kind), int(self.flags) & 0xFFFF, HEADER_BYTES,
                           int(self.seq) & 0xFFFFFFFF, int(self.pts), int(self.capture_ns),
                           clamp(self.graph_us), clamp(self.compute_us), clamp(self.encode_us),
                           clamp(self.send_wait_us), int(self.payload_len))


def _clamp_u32(v) -> int:
    return max(0, min(0xFFFFFFFF, int(v)))


def pack_media(header: MediaHeader, payload) -> bytes:
    """Header + payload as one binary message. ``header.payload_len`` is set from the payload."""
    header.payload_len = len(payload)
    return header.pack() + bytes(payload)


def parse_media(data: bytes) -> tuple[MediaHeader, memoryview]:
    """Split a binary message into its header and payload.

    Raises :class:`ProtocolError` with ``bad_binary`` when the message:

    - is shorter than a header;
    - has the wrong magic or version;
    - has a header length below 48;
    - has an unknown kind;
    - has a payload length that does not match what follows the header.
    """
    if len(data) < HEADER_BYTES:
        raise ProtocolError(ErrorCode.BAD_BINARY, f"binary message of {len(data)} bytes is shorter than "
                                                  f"the {HEADER_BYTES}-byte media header")
    (magic, version, kind, flags, header_len, seq, pts, capture_ns, graph_us, compute_us, encode_us,
     send_wait_us, payload_len) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(ErrorCode.BAD_BINARY, f"binary message starts with {magic!r}; expected {MAGIC!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.BAD_BINARY, f"media header version {version}; this server speaks "
                                                  f"{PROTOCOL_VERSION}")
    if header_len < HEADER_BYTES or header_len > len(data):
        raise ProtocolError(ErrorCode.BAD_BINARY, f"header_len {header_len} must be {HEADER_BYTES}..{len(data)}")
    if kind not in Kind.__members__.values():
        raise ProtocolError(ErrorCode.BAD_BINARY, f"unknown media kind {kind}; expected one of "
                                                  f"{[int(k) for k in Kind]}")
    if header_len + payload_len != len(data):
        raise ProtocolError(ErrorCode.BAD_BINARY, f"payload_len {payload_len} + header {header_len} bytes "
                                                  f"!= message length {len(data)} (truncated?)")
    header = MediaHeader(Kind(kind), flags, seq, pts, capture_ns, graph_us, compute_us, encode_us,
                         send_wait_us, payload_len)
    return header, memoryview(data)[header_len:]


# ---- control messages ---------------------------------------------------------------------------------

def parse_control(text: str) -> dict:
    """Decode a text message into a checked control message: a dict with a known ``type``.

    Raises :class:`ProtocolError`:

    - ``bad_json``: not JSON, or not an object.
    - ``unknown_type``.
    - ``bad_message``: a field of the wrong type.
    """
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.BAD_JSON, f"text message is not valid JSON ({exc})") from None
    if not isinstance(msg, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, f"a control message is a JSON object; got "
                                                f"{type(msg).__name__}")
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f'a control message needs a string "type"; got {kind!r}')
    if kind not in CLIENT_TYPES:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:40]!r}; expected one of "
                                                    f"{list(CLIENT_TYPES)}")
    if kind == "start":
        _expect(msg, "pipeline", str)
        _expect(msg, "options", dict, optional=True)
        version = _expect(msg, "version", int, optional=True)
        if version is not None and version != PROTOCOL_VERSION:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"protocol version {version} requested; this server "
                                                       f"speaks {PROTOCOL_VERSION}")
    elif kind == "config":
        _expect(msg, "options", dict)
    elif kind == "pose":
        msg["matrix"] = parse_pose(msg.get("matrix"))
        _expect(msg, "pts", int, optional=True)
    return msg


def _expect(msg: dict, key: str, typ: type, optional: bool = False):
    value = msg.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f'"{msg["type"]}" needs "{key}" as a {_JSON_NAMES[typ]}; '
                                                   f"got {type(value).__name__} {_short(value)}")
    return value


_JSON_NAMES = {str: "string", dict: "object", int: "integer", list: "array", float: "number"}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_pose(matrix) -> list[list[float]]:
    """A camera pose: a 4×4 world-to-camera matrix, as a list of 4 rows or 16 numbers, row-major.

    The convention is OpenCV's: x right, y down, z forward.
    Returns 4 rows of floats. Raises ``bad_message``.
    """
    if isinstance(matrix, list) and len(matrix) == 16 and all(_is_number(v) for v in matrix):
        matrix = [matrix[i:i + 4] for i in range(0, 16, 4)]
    ok = (isinstance(matrix, list) and len(matrix) == 4
          and all(isinstance(r, list) and len(r) == 4 and all(_is_number(v) for v in r) for r in matrix))
    if not ok:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f'"pose" needs "matrix": 4 rows of 4 finite numbers '
                                                   f"(world-to-camera, OpenCV); got {_short(matrix)}")
    rows = [[float(v) for v in r] for r in matrix]
    if any(abs(a - b) > 1e-4 for a, b in zip(rows[3], (0.0, 0.0, 0.0, 1.0))):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f'"pose" matrix must end with the row [0, 0, 0, 1]; '
                                                   f"got {rows[3]}")
    return rows


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
