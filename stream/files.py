"""Files written whole: :func:`written_whole` (any writer: the file appears complete or not at all),
:func:`partial_name` (where it is written meanwhile) and :func:`write_json`, the one JSON writer of the project
(reports, bundles, benches)."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def json_default(value):
    """What ``json`` cannot write as it is: numpy scalars as Python numbers, paths as strings; anything else is a
    TypeError naming its type."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"a {type(value).__name__} is not JSON serializable (expected numbers, strings, lists and dicts)")


def partial_name(path) -> str:
    """``NAME.partial.EXT`` beside ``path`` (``NAME.EXT``): where a file is written before it is whole. The
    extension is kept for the writers that choose the format by it (PIL, ``np.savez``)."""
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.partial{ext}"


@contextmanager
def written_whole(path) -> Iterator[Path]:
    """``with written_whole(path) as tmp: save(..., tmp)``: the block writes :func:`partial_name`, which is renamed
    to ``path`` when the block ends, so a reader (or a crash) never sees half a file; when the block raises, the
    partial file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = Path(partial_name(path))
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_json(path, data, *, indent: int = 2, sort_keys: bool = False) -> Path:
    """Write ``data`` as indented JSON to ``path`` (its folder made), whole (:func:`written_whole`). Returns the
    path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as tmp:
        text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=json_default)
        tmp.write_text(text + "\n", encoding="utf-8")
    return path


__all__ = ["json_default", "partial_name", "written_whole", "write_json"]
