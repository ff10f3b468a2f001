"""Clear errors for bad media files: which file, and what was wrong with it."""
from __future__ import annotations

import os

import av


class MediaError(ValueError):
    """A media file could not be used. ``path`` names it. The message says what was expected."""

    def __init__(self, path, problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def open_media(path):
    """``av.open(path)`` with errors that name the file and the problem."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MediaError(path, "no such file")
    if os.path.isdir(path):
        raise MediaError(path, "is a directory, expected a media file")
    if os.path.getsize(path) == 0:
        raise MediaError(path, "is empty (0 bytes), expected an audio or video file")
    try:
        return av.open(path)
    except (av.error.InvalidDataError, av.error.EOFError) as exc:
        raise MediaError(path, f"is not a media file FFmpeg can read, or is truncated; expected audio "
                                 f"or video ({exc.strerror or exc})") from exc
    except av.error.FFmpegError as exc:
        raise MediaError(path, f"could not be opened ({exc})") from exc
