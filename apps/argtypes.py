"""argparse value types shared by the command line: each error says what was wrong and what was expected."""
from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Callable

from framegraph.models.runtime import RUNTIMES


def _number(text: str, parse: Callable[[str], float], kind: str, ok: Callable[[float], bool], expected: str):
    """``text`` read by ``parse``, ``int`` or ``float``.

    An error says it is not ``kind``. When ``ok(value)`` is false, it says that ``expected`` was expected."""
    try:
        v = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if not ok(v):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return v


def positive_int(text: str) -> int:
    return _number(text, int, "a whole number", lambda v: v > 0, "a positive whole number")


def non_negative_int(text: str) -> int:
    return _number(text, int, "a whole number", lambda v: v >= 0, "a whole number ≥ 0")


def positive_ints(text: str) -> list[int]:
    """Comma-separated positive whole numbers: ``"96,208"`` → ``[96, 208]``."""
    return [positive_int(part.strip()) for part in text.split(",")]


def non_negative_ints(text: str) -> list[int]:
    """Comma-separated whole numbers ≥ 0: ``"0,80"`` → ``[0, 80]``."""
    return [non_negative_int(part.strip()) for part in text.split(",")]


def positive_float(text: str) -> float:
    return _number(text, float, "a number", lambda v: v > 0, "a positive number")


def non_negative_float(text: str) -> float:
    return _number(text, float, "a number", lambda v: v >= 0, "a number ≥ 0")


# The largest picture a --size may ask for: H.264's largest level (6.2) holds 8192x4320.
MAX_SIDE = 8192
MAX_PIXELS = 8192 * 4320
SIZE_LIMIT = "at most 8192 a side and 8192x4320 pixels in all"


def _check_limit(text: str, w: int, h: int) -> None:
    if w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
        raise argparse.ArgumentTypeError(f"size {text!r} is past the limit: {SIZE_LIMIT} (H.264's largest picture); "
                                         f"e.g. 3840x2160")


def size(text: str, *, even: bool = False) -> tuple[int, int]:
    """``"640x360"`` → ``(640, 360)``, within :data:`SIZE_LIMIT`.

    With ``even``, both sides must be even, as H.264 in yuv420p needs."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected WIDTHxHEIGHT, e.g. 640x360") from None
    if w <= 0 or h <= 0 or (even and (w % 2 or h % 2)):
        need = "positive and even" if even else "positive"
        raise argparse.ArgumentTypeError(f"size {text!r}: width and height must be {need}")
    _check_limit(text, w, h)
    return w, h


def video_size(text: str) -> tuple[int, int]:
    """A size for an encoded video: positive and even."""
    return size(text, even=True)


# Where a model's stages compute (models/runtime.py, torch-free). AVATAR_RUNTIMES: every runtime an avatar kind may
# run on. VAE_RUNTIMES: the generate pipeline's causal VAE decoder's, registered by models.generate, which --help
# does not load. tests/apps/test_cli.py checks this copy and the int8 ones against the models.
AVATAR_RUNTIMES = RUNTIMES
VAE_RUNTIMES = ("torch", "onnx")
INT8_MODES = ("dynamic", "static")  # how `framegraph export --int8` quantizes (models.onnx.quantize.MODES)
INT8_DEFAULT_MODE = "static"  # `--int8` alone: bench avatar_int8's choice (models.avatar.int8.DEFAULT_MODE)


class _DeprecatedAlias(argparse.Action):
    """An option's old name: stores into the new option's ``dest`` and says so once on stderr."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: note: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_runtime_argument(p: argparse.ArgumentParser, help: str, *, choices=AVATAR_RUNTIMES, type=None,
                         default="torch") -> None:
    """``--runtime``, where the models compute, and its old name ``--backend``.

    The old name is hidden and still accepted, with a deprecation note. ``type`` replaces ``choices`` for a
    parsed list, such as the benches' ``torch,onnx``."""
    kw = {"type": type} if type is not None else {"choices": choices}
    p.add_argument("--runtime", default=default, help=help, **kw)
    p.add_argument("--backend", dest="runtime", action=_DeprecatedAlias, new="--runtime", help=argparse.SUPPRESS, **kw)


def port(text: str) -> int:
    """``--port``: 0..65535. With 0 the system picks a free one."""
    return _number(text, int, "a whole number", lambda v: 0 <= v <= 65535, "a port 0..65535 (0 picks a free one)")


def check_port_free(host: str, port: int) -> None:
    """A ``ValueError`` naming ``port`` and ``--port`` when a program already listens there.

    Port 0 is always free. The port is tried as the servers bind it, with ``SO_REUSEADDR``. So only a listening
    socket counts."""
    if port == 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return  # a host that does not resolve: the server's own bind says so
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return
            raise ValueError(f"port {port} on {host} is in use (another program listens there): choose another "
                             f"with --port N, or --port 0 for a free one") from None


def size_hw(text: str) -> tuple[int, int]:
    """``"480x832"`` → ``(480, 832)``, within :data:`SIZE_LIMIT`.

    The order is HEIGHTxWIDTH, the video models' convention. ``framegraph generate``, ``export --generate`` and
    ``bench generate`` use it."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size {text!r}: expected HEIGHTxWIDTH, e.g. 480x832") from None
    if h <= 0 or w <= 0:
        raise argparse.ArgumentTypeError(f"--size {text!r}: height and width must be positive")
    _check_limit(text, w, h)
    return h, w


def timesteps(text: str) -> list[float]:
    """``"1000,750,500,250"`` → a strictly decreasing list of timesteps in (0, 1000]."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timesteps {text!r}: expected comma-separated numbers, e.g. "
                                         f"1000,750,500,250") from None
    if not values or any(not 0 < v <= 1000 for v in values) or any(a <= b for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"--timesteps {text!r}: expected strictly decreasing values in (0, 1000], "
                                         f"e.g. 1000,750,500,250")
    return values


def name_list(choices: tuple[str, ...], option: str):
    """A type for ``option A,B``: names measured one after the other, each one of ``choices``, none twice.

    The benches use it."""

    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        if not names or any(n not in choices for n in names) or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"{option} {text!r}: expected some of {', '.join(choices)}, "
                                             f"comma-separated, e.g. {','.join(choices)}")
        return names

    return parse


def runtime_list(choices: tuple[str, ...]):
    """A type for ``--runtime A,B``: runtimes measured one after the other, each one of ``choices``."""
    return name_list(choices, "--runtime")


# Colour names a background may be given by (``--background``, the server's ``background`` option).
COLOURS = {"green": (0, 255, 0), "blue": (0, 0, 255), "magenta": (255, 0, 255), "black": (0, 0, 0),
           "white": (255, 255, 255), "grey": (128, 128, 128), "gray": (128, 128, 128)}


def colour(text: str) -> tuple[int, int, int] | None:
    """``"green"`` / ``"#00ff00"`` / ``"0,255,0"`` → ``(r, g, b)`` 0..255. None when ``text`` is not a colour."""
    t = text.strip().lower()
    if t in COLOURS:
        return COLOURS[t]
    try:
        if t.startswith("#") and len(t) == 7:
            return tuple(int(t[i:i + 2], 16) for i in (1, 3, 5))
        values = tuple(int(v) for v in t.split(","))
    except ValueError:
        return None
    return values if len(values) == 3 and all(0 <= v <= 255 for v in values) else None


def background(text: str):
    """``--background``: a colour as ``(r, g, b)``, or the path of an existing picture. See :func:`colour`."""
    rgb = colour(text)
    if rgb is not None:
        return rgb
    if os.path.isfile(text):
        return text
    raise argparse.ArgumentTypeError(f"background {text!r}: expected a colour ({', '.join(COLOURS)}, #rrggbb or "
                                     f"r,g,b with each 0..255) or the path of a picture that exists")


def placement(text: str) -> tuple[float, ...]:
    """``--place X,Y,Z[,YAW,HEIGHT]``: 3 or 5 numbers. A height must be > 0."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--place {text!r}: expected X,Y,Z or X,Y,Z,YAW,HEIGHT (numbers), e.g. "
                                         f"0,0,0 or 0,0,0,30,1.5") from None
    if len(values) not in (3, 5) or not all(v == v and abs(v) != float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"--place {text!r}: expected X,Y,Z or X,Y,Z,YAW,HEIGHT (finite numbers), "
                                         f"e.g. 0,0,0 or 0,0,0,30,1.5")
    if len(values) == 5 and not values[4] > 0:
        raise argparse.ArgumentTypeError(f"--place {text!r}: HEIGHT {values[4]:g} must be > 0 (scene units)")
    return values


def add_compile_argument(p: argparse.ArgumentParser, what: str) -> None:
    """``--compile / --no-compile``: run ``what`` on the ``compiled`` runtime. Default: on CUDA, off on a CPU.

    That runtime is Inductor, and CUDA graphs on a GPU. See :mod:`framegraph.models.compile`."""
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help=f"compile {what} with torch.compile (Inductor) and, on a GPU, replay its steps from CUDA "
                        f"graphs; kernels cached in $FRAMEGRAPH_CACHE (default ~/.cache/framegraph). Default: on "
                        f"with CUDA, off on a CPU (compiling takes seconds to minutes there)")


def compiled_or(compile_flag: bool | None, runtime: str, device: str) -> str:
    """The runtime a command runs its torch models on.

    It is ``"compiled"`` when ``--compile`` says so and the models run on torch. Unset, ``--compile`` means on
    with CUDA. Otherwise it is ``runtime``."""
    import torch

    on = compile_flag if compile_flag is not None else torch.device(device).type == "cuda"
    return "compiled" if on and runtime == "torch" else runtime


def add_config_argument(p: argparse.ArgumentParser, flag: str, config, field: str, help: str) -> None:
    """Add ``flag``: a number or a string whose default is ``config``'s ``field``.

    Its type is the default's. Its help is ``help`` followed by "(default VALUE)". A float is written with
    ``:g``."""
    default = getattr(config, field)
    shown = f"{default:g}" if isinstance(default, float) else default
    p.add_argument(flag, type=type(default), default=default, help=f"{help} (default {shown})")
