"""``framegraph bench startup``: how long each command takes from the shell, start-up included.

    framegraph bench startup --out benchmarks/results/cpu/startup.json

Each command is run as a user runs it. That is the ``framegraph`` script beside this interpreter, in a fresh
process, from the repository root. Each runs ``--runs`` times. The commands take turns, so a burst of load on a
shared machine spreads over all of them. The JSON has every wall time, the median, and the target.

The targets are from issue #35, on 2 cores:

- ``--help`` and ``render --help``: ≤ 0.5 s;
- ``info``: ≤ 1.5 s;
- a 1-s test card: ≤ 1.5 s;
- a 1-s avatar render: ≤ 3 s. It uses the shipped bundle and 1 s of espeak-ng speech.

One more run of each goes under ``python -X importtime``. It records whether the command imports torch and how
long its imports take. The load average is recorded with each command's runs. Each run's CPU time, user +
system, is recorded beside its wall time. On a shared machine the wall time also holds the waits for a core.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import wave

from .meta import ROOT, bench_metadata, write_result
from .speech import SAMPLE_RATE, speech

TARGETS_S = {"help": 0.5, "render_help": 0.5, "info": 1.5, "render_testcard_1s": 1.5, "render_avatar_1s": 3.0}


def _framegraph() -> list[str]:
    """The ``framegraph`` command: its script beside this interpreter, else ``python -m framegraph.apps.cli``."""
    script = os.path.join(os.path.dirname(sys.executable), "framegraph")
    return [script] if os.path.isfile(script) else [sys.executable, "-P", "-m", "framegraph.apps.cli"]


def _commands(avatar: str, wav: str, tmp: str) -> dict[str, list[str]]:
    return {"help": ["--help"], "render_help": ["render", "--help"], "info": ["info"],
            "render_testcard_1s": ["render", "--testcard", "--seconds", "1", "--out", os.path.join(tmp, "card.mp4")],
            "render_avatar_1s": ["render", "--avatar", avatar, "--audio", wav,
                                 "--out", os.path.join(tmp, "avatar.mp4")]}


def _timed(argv: list[str]) -> tuple[float, float]:
    """``(wall s, CPU s)`` of one run.

    The CPU time is user + system, for the process and its threads. It is what the command cost the machine.
    On a shared machine the wall time also holds its waits for a core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise ValueError(f"bench startup: {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _imports(args: list[str]) -> dict:
    """One run under ``-X importtime``: whether torch was imported, and the seconds its top-level imports took."""
    done = subprocess.run([sys.executable, "-P", "-X", "importtime", "-m", "framegraph.apps.cli", *args], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows = [m.groups() for m in re.finditer(r"^import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)$", done.stderr, re.M)]
    return {"imports_torch": any(name == "torch" for _, _, name in rows),
            "import_s": round(sum(int(us) for us, indent, _ in rows if len(indent) == 1) / 1e6, 3)}


def _speech_wav(path: str, seconds: float) -> dict:
    samples, info = speech(seconds, seed=0)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.astype("<i2").tobytes())
    return {**info, "seconds": seconds, "sample_rate": SAMPLE_RATE}


def run(args: argparse.Namespace) -> int:
    runs = 1 if args.quick else args.runs
    if runs < 1:
        raise ValueError(f"--runs {runs}: expected at least 1")
    result = bench_metadata("startup")
    with tempfile.TemporaryDirectory(prefix="fg-bench-startup-") as tmp:
        wav = os.path.join(tmp, "speech.wav")
        audio = _speech_wav(wav, 1.0)
        commands = _commands(os.path.relpath(os.path.abspath(args.avatar), ROOT), wav, tmp)
        walls, cpus, loads = ({name: [] for name in commands} for _ in range(3))
        for _ in range(runs):
            for name, argv in commands.items():
                loads[name].append(round(os.getloadavg()[0], 2))
                wall, cpu = _timed(_framegraph() + argv)
                walls[name].append(round(wall, 3))
                cpus[name].append(round(cpu, 3))
        rows = {name: {"command": " ".join(["framegraph", *argv]).replace(tmp, "TMP"), "wall_s": walls[name],
                       "median_s": round(statistics.median(walls[name]), 3), "min_s": min(walls[name]),
                       "max_s": max(walls[name]), "cpu_s": cpus[name],
                       "cpu_median_s": round(statistics.median(cpus[name]), 3), "load_average_1min": loads[name],
                       "target_s": TARGETS_S[name], "target_met": statistics.median(walls[name]) <= TARGETS_S[name],
                       **_imports(argv)}
                for name, argv in commands.items()}
    result.update({"runs": runs, "script": " ".join(_framegraph()).replace(ROOT, "."), "audio": audio,
                   "niceness": os.nice(0),  # below 0: the commands ran ahead of other jobs on a shared machine
                   "note": "wall time from the shell, in a fresh process each run: interpreter start, imports, the "
                           "work and the exit; cpu_s: user + system time of the process" +
                           ("; --quick: one run, a smoke test" if args.quick else ""),
                   "commands": rows})
    png = write_result(result, args.out, figure)
    for name, r in rows.items():
        print(f"{name:>20}  median {r['median_s']:.2f} s (target {r['target_s']:g} s: "
              f"{'met' if r['target_met'] else 'NOT met'}; CPU {r['cpu_median_s']:.2f} s), imports torch: "
              f"{r['imports_torch']}")
    print(f"wrote {args.out} and {png}")
    return 0


def figure(data: dict, plt):
    """Median wall time per command, each run a dot. Its target is a tick, its median CPU time a diamond."""
    rows = data["commands"]
    names = list(rows)
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 1.4))
    y = range(len(names))
    ax.barh(y, [rows[n]["median_s"] for n in names],
            color=["tab:green" if rows[n]["target_met"] else "tab:red" for n in names])
    for i, n in enumerate(names):
        ax.plot(rows[n]["wall_s"], [i] * len(rows[n]["wall_s"]), "k.", ms=3)
        ax.plot([rows[n]["target_s"]] * 2, [i - 0.4, i + 0.4], "k-", lw=2)
        if "cpu_median_s" in rows[n]:
            ax.plot(rows[n]["cpu_median_s"], i, "D", mfc="none", mec="k", ms=5)
    ax.set_yticks(list(y), [rows[n]["command"].replace("framegraph ", "", 1).split(" --out")[0][:48] for n in names],
                  fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("s from the shell (bar: median wall time; dots: runs; diamond: median CPU time; tick: target)",
                  fontsize=8)
    load = data.get("load_average_1_5_15min", ["?"])[0]
    ax.set_title(f"framegraph start-up, {data.get('device', '')}, load {load} at the start", fontsize=9)
    fig.tight_layout()
    return fig
