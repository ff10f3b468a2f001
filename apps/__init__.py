"""User-facing apps: the framegraph CLI, demo, servers, benches."""
from __future__ import annotations

import importlib
from collections.abc import Callable


def exports(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """A package's ``__getattr__``, per PEP 562, that loads each public name from its submodule on first use.

    ``names`` maps name → ``".module"``. So a light module inside the package can be imported alone, without the
    heavy ones beside it. A command's settings are such a module."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(names[name], package), name)

    return __getattr__
