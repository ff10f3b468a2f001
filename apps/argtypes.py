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
