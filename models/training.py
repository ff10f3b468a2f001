"""What the trainers of :mod:`framegraph.models` share.

- the learning-rate schedule;
- the CPU threads while training;
- the rule that resumes a finished phase or trains it;
- the pace of a loop, and its ETA;
- files written whole.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from framegraph.stream.memory import keep_freed_memory
from framegraph.stream.progress import _duration as duration

T = TypeVar("T")
REPORT = "train_report.json"


def lr_at(step: int, steps: int, lr: float, warmup: int, min_fraction: float = 0.1) -> float:
    """The learning rate of ``step`` of ``steps``, 0-based.

    It warms up linearly over ``warmup`` steps to ``lr``.
    Then it decays on a cosine to ``min_fraction · lr`` at the last step.
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (min_fraction + (1 - min_fraction) * 0.5 * (1 + math.cos(math.pi * p)))


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run the block with ``n`` intra-op CPU threads, restoring the setting after. None leaves it unchanged.

    From then on the process keeps the memory it frees: :func:`~framegraph.stream.memory.keep_freed_memory`.
    A training step frees its activations and allocates them again at the next step.
    Without this, glibc would hand them back to the kernel every step.
    Every page would then fault in again at the next one.
    """
    keep_freed_memory()
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str):
    """Store the block's wall-clock seconds, rounded to 0.1, as ``timings[name + "_s"]``."""
    t = time.monotonic()
    try:
        yield
    finally:
        timings[f"{name}_s"] = round(time.monotonic() - t, 1)


def recorded_steps(folder, resume: bool = True) -> int | None:
    """The steps an earlier training recorded in ``folder/train_report.json``, next to its model's ``config.json``.

    None when either file is missing or ``resume`` is off.
    :func:`resume_or_train` compares it with the steps asked for.
    """
    folder = Path(folder)
    if not resume or not (folder / "config.json").is_file() or not (folder / REPORT).is_file():
        return None
    return int(json.loads((folder / REPORT).read_text()).get("steps", 0))


def resume_or_train(steps: int, done: int | None, load: Callable[[], T], train: Callable[[], T]) -> T:
    """One phase of a training: load it or train it.

    It calls ``load()`` when an earlier run recorded ``done`` steps of this phase, at least the ``steps`` asked for.
    Else it calls ``train()``. That continues from the phase's own checkpoint, where it keeps one.
    ``done`` is None when nothing finished, or on a fresh start.
    """
    if done is not None and done >= steps:
        return load()
    return train()


class Pace:
    """The measured pace of a loop. Call :meth:`tick` after each step.

    The seconds per step are the mean of the last ``window`` steps.
    The first step after the start is a warm-up, and is left out.
    """

    def __init__(self, window: int = 50):
        self.times: deque[float] = deque(maxlen=window)
        self.last: float | None = None
        self.ticks = 0

    def tick(self) -> None:
        now = time.monotonic()
        if self.last is not None and self.ticks > 1:
            self.times.append(now - self.last)
        self.last, self.ticks = now, self.ticks + 1

    def start(self) -> None:
        """The loop starts, or starts again, now. The time before it is no step's."""
        self.last, self.ticks = time.monotonic(), 1

    @property
    def step_s(self) -> float | None:
        """Seconds per step. None before two steps were timed."""
        return sum(self.times) / len(self.times) if self.times else None

    def left(self, done: int, total: int) -> str:
        """``"1.21 s/step, about 52 min left"`` for ``done`` of ``total`` steps. "" before a step was timed."""
        if self.step_s is None:
            return ""
        return f"{self.step_s:.3g} s/step, about {duration(self.step_s * max(0, total - done))} left"


__all__ = ["REPORT", "lr_at", "cpu_threads", "timed", "recorded_steps", "resume_or_train", "Pace", "duration"]
