"""Shipped assets (each with a PROVENANCE note): ``path("avatars", "astronaut")`` finds one."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent


def path(*parts: str) -> Path:
    """The shipped asset at ``assets/<parts...>`` (installed or in a checkout). Raises
    ``FileNotFoundError`` naming what exists when it is missing."""
    found = ROOT.joinpath(*parts)
    if not found.exists():
        have = sorted(p.name for p in found.parent.iterdir()) if found.parent.is_dir() else []
        raise FileNotFoundError(f"no shipped asset {'/'.join(parts)!r} under {ROOT}; there is {have}")
    return found
