"""What every benchmark JSON records beside its numbers (device, versions, exact command, commit), and
how a bench writes its result (the JSON, and its figure as a PNG beside it)."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Callable

from framegraph import assets
from framegraph.stream.files import write_json

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


_COMMAND: str | None = None


def set_command(argv: list[str]) -> None:
    """Record the ``framegraph`` command line being run (``cli.main`` calls this), so a benchmark run
    from Python (``main([...])``) records its own arguments, not the host program's."""
    global _COMMAND
    _COMMAND = " ".join(["framegraph", *argv])


def _command() -> str:
    if _COMMAND is not None:
        return _COMMAND
    return " ".join([os.path.basename(sys.executable)] + sys.argv)


def bench_metadata(name: str) -> dict:
    """``{"benchmark", "device", "command", "git_commit", "date", "versions", "cuda"}``."""
    from ..info import collect, device_name

    info = collect()
    return {
        "benchmark": name,
        "device": device_name(),
        "command": _command(),
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


def add_out_argument(p) -> None:
    """``--out FILE.json``: where a bench writes its result (its figure goes beside it as ``FILE.png``)."""
    p.add_argument("--out", required=True, help="JSON file to write (a PNG plot is written beside it)")


def pyplot():
    """``matplotlib.pyplot`` drawing off screen (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_result(result: dict, out, figure: Callable) -> str:
    """Write ``result`` as JSON to ``out`` (its folder made) and ``figure(result, plt)`` as a PNG beside it
    (``NAME.png`` for ``NAME.json``); returns the PNG's path."""
    write_json(out, result)
    png = os.path.splitext(str(out))[0] + ".png"
    plt = pyplot()
    fig = figure(result, plt)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
