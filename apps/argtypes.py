"""argparse value types shared by the command line: each error says what was wrong and what was expected."""
from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive whole number")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return v


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number ≥ 0")
    return v


def size(text: str, *, even: bool = False) -> tuple[int, int]:
    """``"640x360"`` → ``(640, 360)``; ``even``: both sides even (what H.264 in yuv420p needs)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected WIDTHxHEIGHT, e.g. 640x360") from None
    if w <= 0 or h <= 0 or (even and (w % 2 or h % 2)):
        need = "positive and even" if even else "positive"
        raise argparse.ArgumentTypeError(f"size {text!r}: width and height must be {need}")
    return w, h


def video_size(text: str) -> tuple[int, int]:
    """A size for an encoded video: positive and even."""
    return size(text, even=True)


def add_compile_argument(p: argparse.ArgumentParser, what: str) -> None:
    """``--compile / --no-compile``: run ``what`` on the ``compiled`` runtime (Inductor, and CUDA graphs on a GPU;
    :mod:`framegraph.models.compile`). Default: on CUDA, off on a CPU."""
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help=f"compile {what} with torch.compile (Inductor) and, on a GPU, replay its steps from CUDA "
                        f"graphs; kernels cached in $FRAMEGRAPH_CACHE (default ~/.cache/framegraph). Default: on "
                        f"with CUDA, off on a CPU (compiling takes seconds to minutes there)")


def compiled_or(compile_flag: bool | None, runtime: str, device: str) -> str:
    """The runtime a command runs its torch models on: ``"compiled"`` when ``--compile`` says so (or, unset, on
    CUDA) and the models run on torch; ``runtime`` otherwise."""
    import torch

    on = compile_flag if compile_flag is not None else torch.device(device).type == "cuda"
    return "compiled" if on and runtime == "torch" else runtime
