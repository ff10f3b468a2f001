"""A package index whose names are imported when first used.

``from pkg import name`` loads only the module of ``name``.

    _INDEX = {"load_avatar": ".bundle", "build_avatar_graph": ".graph"}
    __all__ = sorted(_INDEX)
    __getattr__, __dir__ = lazy_index(__name__, _INDEX)
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_index(package: str, index: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``.

    ``index`` maps each name to its module, relative to the package. A name is imported from its module on first
    use. It is then kept in the package.
    """
    def getattr_(name: str):
        if name not in index:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(index[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(index))

    return getattr_, dir_


__all__ = ["lazy_index"]
