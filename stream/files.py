"""Files written whole: :func:`write_json`, the one JSON writer of the project (reports, bundles, benches)."""
from __future__ import annotations

import json
import os
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


def write_json(path, data, *, indent: int = 2) -> Path:
    """Write ``data`` as indented JSON to ``path`` (its folder made) whole: to ``PATH.partial`` first, then renamed,
    so a reader never sees half a file. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=indent, default=json_default) + "\n")
    os.replace(tmp, path)
    return path


__all__ = ["json_default", "write_json"]
