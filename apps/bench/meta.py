"""What every benchmark JSON records beside its numbers, and how a bench writes its result.

The JSON records the device, versions, the exact command and the commit. A bench writes the JSON, and its
figure as a PNG beside it."""
from __future__ import annotations

import datetime
import os
import subprocess
from collections.abc import Callable

import matplotlib.pyplot as plt

from framegraph import assets
from framegraph.stream.files import write_json

from ..cli import command_line
from ..info import collect, device_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # apps/bench/ is two below
ASSETS = str(assets.ROOT)


def git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty else "")


def bench_metadata(name: str) -> dict:
    """``{"benchmark", "device", "command", "git_commit", "date", "versions", "cuda"}``."""
    info = collect()
    return {
        "benchmark": name,
        "device": device_name(),
        "command": command_line(),
        "git_commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": info["python"],
        "platform": info["platform"],
        "cpu_count": info["cpu_count"],
        # other work on the machine inflates CPU timings: recorded so a reader can judge them
        "load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()],
        "versions": info["versions"],
        "cuda": info["cuda"],
    }


def pyplot():
    """``matplotlib.pyplot`` drawing off screen, with the Agg backend."""
    import matplotlib  # heavy, and only for figures; the backend must be chosen before pyplot is imported

    matplotlib.use("Agg")

    return plt


def write_result(result: dict, out, figure: Callable) -> str:
    """Write ``result`` as JSON to ``out``, making its folder. Returns the PNG's path.

    ``figure(result, plt)`` goes as a PNG beside it: ``NAME.png`` for ``NAME.json``."""
    write_json(out, result)
    png = os.path.splitext(str(out))[0] + ".png"
    plt = pyplot()
    fig = figure(result, plt)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
