"""What a pipeline takes, declared once.

It is a dataclass of options whose fields say their kind, default and meaning.

    @dataclass
    class ScopeOptions(VideoOptions):
        window_ms: float = option(40.0, "the span of the waveform shown, ms", Number(5, 1000))
        gain: float = option(1.0, "waveform gain", Number(0.01, 100), live=True)

From that one declaration come:

- :meth:`Options.parse`: a client's ``start`` options, checked, into an instance.
  Each value is checked against its field.
  Unknown names are refused, since a typo must not pass silently.
  Cross-field rules live in :meth:`Options.check`.
- :meth:`Options.parse_live`: a ``config`` message's options.
  These are the fields marked ``live``, and the ones every session takes: :class:`SessionLive`.
- :meth:`Options.schema`: what ``GET /pipelines/NAME`` says about each option.
  That is its kind, range or choices, default, meaning and whether it is live.

Every refusal is a ``bad_option`` :class:`~..protocol.ProtocolError`, worded in the protocol's terms:
``"NAME: option 'KEY' = VALUE; expected WHAT"``.
The value is quoted as the client sent it.
WHAT is what the client may send instead, such as a range or the server's names.
It is never a server path or a command-line flag.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from framegraph import assets
from framegraph.apps.argtypes import COLOURS, colour

from ..limits import MAX_PIXELS
from ..protocol import ErrorCode, ProtocolError

MIN_SIDE = 16  # px: one H.264 macroblock; the test card's frame counter and the scope's waveform fit whole
FPS_RANGE = (1, 60)
PICTURE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def backgrounds_dir() -> Path:
    """The server's folder of background pictures.

    It is ``$FRAMEGRAPH_BACKGROUNDS``, else the shipped ``assets/backgrounds``.
    """
    return Path(os.environ.get("FRAMEGRAPH_BACKGROUNDS") or assets.path("backgrounds"))


def background_pictures() -> list[str]:
    """The file names of the pictures in :func:`backgrounds_dir`, sorted.

    The suffixes are .jpg, .jpeg, .png and .webp.
    These are what a client may send as a ``background``.
    """
    root = backgrounds_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in PICTURE_SUFFIXES)


def bad_option(pipeline: str, key: str, value, expected: str) -> ProtocolError:
    """The ``bad_option`` error for option ``key`` sent as ``value``."""
    return ProtocolError(ErrorCode.BAD_OPTION, f"{pipeline}: option {key!r} = {_short(value)}; expected {expected}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class Expected(ValueError):
    """A value a :class:`Kind` does not take. The message is what it takes."""


class Kind:
    """What values an option takes. :meth:`check` returns the value parsed or raises :class:`Expected`."""

    type: ClassVar[str] = "any"

    def check(self, value):
        raise NotImplementedError

    def expected(self) -> str:
        raise NotImplementedError

    def schema(self) -> dict:
        return {"type": self.type}


@dataclasses.dataclass(frozen=True)
class Number(Kind):
    """A finite number in ``[lo, hi]``. With ``lo_open`` it is ``(lo, hi]``."""

    lo: float
    hi: float
    lo_open: bool = False
    type: ClassVar[str] = "number"

    def check(self, value) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not (self.lo < value if self.lo_open else self.lo <= value) or value > self.hi:
            raise Expected(self.expected())
        return float(value)

    def expected(self) -> str:
        return f"a number in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"

    def schema(self) -> dict:
        return {"type": self.type, "range": [self.lo, self.hi], **({"lo_open": True} if self.lo_open else {})}


@dataclasses.dataclass(frozen=True)
class Integer(Kind):
    lo: int
    hi: int
    type: ClassVar[str] = "integer"

    def check(self, value) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
            raise Expected(self.expected())
        return value

    def expected(self) -> str:
        return f"an integer in [{self.lo}, {self.hi}]"

    def schema(self) -> dict:
        return {"type": self.type, "range": [self.lo, self.hi]}


@dataclasses.dataclass(frozen=True)
class Flag(Kind):
    type: ClassVar[str] = "boolean"

    def check(self, value) -> bool:
        if not isinstance(value, bool):
            raise Expected(self.expected())
        return value

    def expected(self) -> str:
        return "true or false"


@dataclasses.dataclass(frozen=True)
class Choice(Kind):
    """One of ``choices``.

    ``choices`` is a tuple, or a function giving the names the server has now, such as its avatars or models.
    ``what`` says what they are.
    """

    choices: Sequence[str] | Callable[[], Sequence[str]]
    what: str = "one of"
    type: ClassVar[str] = "choice"

    def names(self) -> list[str]:
        return list(self.choices() if callable(self.choices) else self.choices)

    def check(self, value) -> str:
        if not isinstance(value, str) or value not in self.names():
            raise Expected(self.expected())
        return value

    def expected(self) -> str:
        return f"{self.what} {self.names()}"

    def schema(self) -> dict:
        return {"type": self.type, "choices": self.names()}


@dataclasses.dataclass(frozen=True)
class Text(Kind):
    max_chars: int
    type: ClassVar[str] = "string"

    def check(self, value) -> str:
        if not isinstance(value, str) or len(value) > self.max_chars:
            raise Expected(self.expected())
        return value

    def expected(self) -> str:
        return f"a string of at most {self.max_chars} characters"

    def schema(self) -> dict:
        return {"type": self.type, "max_chars": self.max_chars}


@dataclasses.dataclass(frozen=True)
class FileName(Kind):
    """The name of a file or folder in a folder of the server's. It is a plain name, never a path.

    Whether it is there is the pipeline's check. The pipeline knows the folder.
    """

    where: str
    suffixes: tuple[str, ...] = ()
    type: ClassVar[str] = "name"

    def check(self, value) -> str:
        ok = isinstance(value, str) and value and "/" not in value and "\\" not in value and not value.startswith(".")
        if not ok or (self.suffixes and not value.endswith(self.suffixes)):
            raise Expected(self.expected())
        return value

    def expected(self) -> str:
        kind = f"a {' / '.join(self.suffixes)} file" if self.suffixes else "a file"
        return f"the name of {kind} in {self.where}"

    def schema(self) -> dict:
        return {"type": self.type, "where": self.where, **({"suffixes": list(self.suffixes)} if self.suffixes else {})}


@dataclasses.dataclass(frozen=True)
class Background(Kind):
    """A background: ``portrait``, ``transparent``, a colour, or a picture's file name.

    The colour is as :func:`~framegraph.apps.argtypes.colour` reads it.
    The picture is in the server's :func:`backgrounds_dir`.
    Its name is bare, exactly as :func:`background_pictures` lists it, never a path.
    Returns the word, ``(r, g, b)``, or the name.
    """

    type: ClassVar[str] = "background"

    def check(self, value):
        if value in ("portrait", "transparent"):
            return value
        if isinstance(value, str) and value in background_pictures():  # a name the folder lists: never a path
            return value
        rgb = colour(value) if isinstance(value, str) else None
        if rgb is None:
            raise Expected(self.expected())
        return rgb

    def expected(self) -> str:
        pictures = background_pictures()
        return (f'"portrait", "transparent" (with codec png or webp), a colour: {", ".join(COLOURS)}, "#rrggbb" or '
                f'"r,g,b" (0..255)' + (f", or a picture: {', '.join(pictures)}" if pictures else ""))

    def schema(self) -> dict:
        return {"type": self.type, "choices": ["portrait", "transparent", "<colour>", "<picture>"],
                "colours": list(COLOURS), "pictures": background_pictures()}


@dataclasses.dataclass(frozen=True)
class Size(Kind):
    """``"WxH"`` or ``[W, H]`` → ``(width, height)`` in pixels.

    Sides are even, for H.264 yuv420p.
    Each side is at least :data:`MIN_SIDE`. The total is at most :data:`MAX_PIXELS` pixels.
    """

    type: ClassVar[str] = "size"

    def check(self, value) -> tuple[int, int]:
        try:
            w, h = (int(p) for p in value.lower().split("x")) if isinstance(value, str) else value
            ok = isinstance(w, int) and isinstance(h, int) and not isinstance(w, bool) and not isinstance(h, bool)
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok or w < MIN_SIDE or h < MIN_SIDE or w % 2 or h % 2 or w * h > MAX_PIXELS:
            raise Expected(self.expected())
        return w, h

    def expected(self) -> str:
        return (f'"WxH" or [W, H]: even sides of at least {MIN_SIDE} ({MIN_SIDE}x{MIN_SIDE}), at most {MAX_PIXELS} '
                f"pixels in all (1920x1080)")

    def schema(self) -> dict:
        return {"type": self.type, "format": "WxH", "min_side": MIN_SIDE, "max_pixels": MAX_PIXELS}


@dataclasses.dataclass(frozen=True)
class Decreasing(Kind):
    """A strictly decreasing list of 1 to ``max_len`` numbers in ``(0, hi]``: diffusion timesteps."""

    hi: float
    max_len: int
    type: ClassVar[str] = "numbers"

    def check(self, value) -> list[float]:
        ok = isinstance(value, list) and 0 < len(value) <= self.max_len and all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t <= self.hi for t in value)
        if not ok or any(a <= b for a, b in zip(value, value[1:])):
            raise Expected(self.expected())
        return [float(t) for t in value]

    def expected(self) -> str:
        return f"a strictly decreasing list of 1-{self.max_len} numbers in (0, {self.hi:g}]"

    def schema(self) -> dict:
        return {"type": self.type, "range": [0, self.hi], "max_len": self.max_len}


def option(default, help: str, kind: Kind, *, live: bool = False, alias: str | None = None):
    """A field of a pipeline's options.

    - ``default``: its default. None means the pipeline's own, said in ``help``.
    - ``help``: what it means.
    - ``kind``: what it takes.
    - ``live``: also changeable in a ``config`` message.
    - ``alias``: an old name still accepted.
    """
    meta = {"help": help, "kind": kind, "live": live, "alias": alias}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "kind" in f.metadata]


def _value(f: dataclasses.Field, values: dict, pipeline: str) -> tuple[str, Any]:
    """The key a field was sent under, its name or its alias, and the value sent. None: not sent."""
    alias = f.metadata["alias"]
    if alias and values.get(alias) is not None:
        if values.get(f.name) is not None:
            raise bad_option(pipeline, alias, values[alias], f"either {f.name!r} or its old name {alias!r}, not both")
        return alias, values[alias]
    return f.name, values.get(f.name)


def _check(f: dataclasses.Field, key: str, value, pipeline: str):
    try:
        return f.metadata["kind"].check(value)
    except Expected as exc:
        raise bad_option(pipeline, key, value, str(exc)) from None


def _refuse_unknown(values: dict, fields: list[dataclasses.Field], pipeline: str, what: str) -> None:
    """Refuse the names no field answers to, by its name or its old one.

    The refusal lists the current names.
    """
    names = sorted(f.name for f in fields)
    unknown = sorted(set(values) - set(names) - {f.metadata["alias"] for f in fields})
    if unknown:
        raise ProtocolError(ErrorCode.BAD_OPTION, f"{pipeline}: unknown option(s) {unknown}; {what} {names}")


@dataclasses.dataclass
class Options:
    """Base of every pipeline's options dataclass. Its fields are made with :func:`option`."""

    batching: ClassVar[bool] = False  # the server's, set by ``pipelines.build``: not a client's option

    @classmethod
    def parse(cls, values: dict | None, pipeline: str):
        """A client's ``start`` options, checked, as an instance.

        A field left at None means "the pipeline's own", known only once it runs.
        Examples are the avatar's size and the model's fps.
        Raises ``bad_option`` naming the option, the value and what is expected.
        """
        values = dict(values or {})
        fields = _fields(cls)
        _refuse_unknown(values, fields, pipeline, "this pipeline takes")
        parsed, keys = {}, {}
        for f in fields:
            key, value = _value(f, values, pipeline)
            if value is not None:
                parsed[f.name], keys[f.name] = _check(f, key, value, pipeline), key
        opts = cls(**parsed)
        opts._sent_as = keys
        opts.check(pipeline)
        return opts

    @classmethod
    def parse_live(cls, values: dict | None, pipeline: str) -> dict:
        """A ``config`` message's options, checked. Returns ``{name: value}`` of those sent.

        They are those of :class:`SessionLive` and this pipeline's ``live`` fields.
        """
        values = dict(values or {})
        fields = _fields(SessionLive) + [f for f in _fields(cls) if f.metadata["live"]]
        _refuse_unknown(values, fields, pipeline, "live options (config) are")
        changes = {}
        for f in fields:
            key, value = _value(f, values, pipeline)
            if value is not None:
                changes[f.name] = _check(f, key, value, pipeline)
        return changes

    @classmethod
    def schema(cls) -> dict:
        """Each option: its kind, ``default``, ``help``, ``live`` and ``alias``.

        The kind is its ``type`` with its range or choices.
        """
        out = {}
        for f in _fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if isinstance(f.metadata["kind"], Size) and default is not None:
                default = f"{default[0]}x{default[1]}"
            alias = {"alias": f.metadata["alias"]} if f.metadata["alias"] else {}
            out[f.name] = {**f.metadata["kind"].schema(), "default": default, "help": f.metadata["help"],
                           "live": f.metadata["live"], **alias}
        return out

    def key(self, name: str) -> str:
        """The name the client sent option ``name`` under, for a refusal to quote. For an alias, the old name."""
        return getattr(self, "_sent_as", {}).get(name, name)

    def check(self, pipeline: str) -> None:
        """Rules between options, such as ``strength`` only with ``input: "camera"``. Raises :func:`bad_option`."""


@dataclasses.dataclass
class SessionLive(Options):
    """What a ``config`` message may set on every pipeline, besides the pipeline's own ``live`` options."""

    quality: int | None = option(None, "JPEG quality (jpeg sessions)", Integer(1, 100))
    keyframe: bool | None = option(None, "true: the next frame is a key frame (h264 sessions)", Flag())
    stats_interval_ms: float | None = option(None, "milliseconds between stats messages", Number(100, 60_000))


@dataclasses.dataclass
class VideoOptions(Options):
    """The video format every pipeline negotiates.

    A pipeline's options subclass it, and may change a default.
    """

    size: tuple[int, int] | None = option((320, 240), "the video's width and height", Size())
    fps: float | None = option(25.0, "video frames a second", Number(*FPS_RANGE))
    codec: str = option("jpeg", "how video frames are sent: JPEG pictures or an H.264 stream", Choice(("jpeg", "h264")))
    quality: int = option(80, "JPEG quality (also live, in config)", Integer(1, 100))
    bitrate_kbps: int | None = option(None, "H.264 bit rate (default: x264's constant quality)", Integer(50, 50_000))
    gop: int | None = option(None, "H.264 frames between key frames (default: one second's)", Integer(1, 600))

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]

    def video_format(self) -> dict:
        """``ready.video``: the negotiated format."""
        d = {"codec": self.codec, "width": self.width, "height": self.height, "fps": self.fps}
        if self.codec in ("png", "webp"):
            d.update(alpha=True, **({"quality": self.quality} if self.codec == "webp" else {}))
        elif self.codec == "jpeg":
            d["quality"] = self.quality
        else:
            d.update(bitrate_kbps=self.bitrate_kbps, gop=self.gop or max(1, round(self.fps)),
                     format="annexb", profile="constrained-baseline-like (x264 ultrafast, zerolatency)")
        return d
