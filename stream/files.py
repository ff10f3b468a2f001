"""Files written whole.

The context :func:`written_whole` works with any writer. The file appears complete or not at all. The name
:func:`partial_name` says where it is written meanwhile. The function :func:`write_json` is the project's one
JSON writer. Reports, bundles and benches use it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def json_default(value):
    """What ``json`` cannot write as it is.

    Numpy scalars become Python numbers. Paths become strings. Anything else raises a TypeError naming its type.
    """
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"a {type(value).__name__} is not JSON serializable (expected numbers, strings, lists and dicts)")


def partial_name(path) -> str:
    """``NAME.partial.EXT`` beside ``path``, which is ``NAME.EXT``.

    A file is written there before it is whole. The extension is kept for writers that choose the format by it,
    such as PIL and ``np.savez``.
    """
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.partial{ext}"


@contextmanager
def written_whole(path) -> Iterator[Path]:
    """Use as ``with written_whole(path) as tmp: save(..., tmp)``.

    The block writes :func:`partial_name`. It is renamed to ``path`` when the block ends. A reader or a crash
    never sees half a file. When the block raises, the partial file is removed. ``path`` is then left as it was.
    """
    path = Path(path)
    tmp = Path(partial_name(path))
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_json(path, data, *, indent: int = 2, sort_keys: bool = False) -> Path:
    """Write ``data`` as indented JSON to ``path``, whole, with :func:`written_whole`.

    The folder is made if needed. Returns the path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as tmp:
        text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=json_default)
        tmp.write_text(text + "\n", encoding="utf-8")
    return path


__all__ = ["json_default", "partial_name", "written_whole", "write_json"]
