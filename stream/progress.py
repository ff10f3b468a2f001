"""Running a graph from the command line.

It gives a progress bar, an estimate of the total time, Ctrl-C that drains and a clear summary. A training
loop's step can hold Ctrl-C to the step's end.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator

from tqdm import tqdm

from .graph import Graph
from .stage import Stage


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class TotalEstimate:
    """Estimates the run's total time from the frames measured so far, and says it.

    ``line(done, total)`` returns the sentence to print, or None.

    The pace is that of the last half of the run measured, at least 2 s. So a fast start is soon outweighed.
    Such a start comes from frames already waiting in the rings, or a first burst. The first frame carries the
    warm-up and is not paced. The estimate is said once ``settle_s`` of frames are measured. It is said again,
    revised, whenever it moves by more than the fraction ``revise`` from the one last said.
    """

    def __init__(self, unit: str, hint: str | None, slow_s: float, from_s: float, settle_s: float = 2.0,
                 revise: float = 0.25):
        self.unit, self.hint, self.slow_s, self.from_s = unit, hint, slow_s, from_s
        self.settle_s, self.revise = settle_s, revise
        self.t_start = time.monotonic()
        self.samples: list[tuple[float, int]] = []  # (time, frames done) from the first frame on
        self.said: float | None = None  # the estimate last said (s)

    def pace(self, now: float, done: int) -> float | None:
        """Frames per second over the last half of the measured time, at least 2 s. None before any."""
        t_first = self.samples[0][0]
        since = max(t_first, now - max(2.0, 0.5 * (now - t_first)))
        t0, d0 = [(t, d) for t, d in self.samples if t <= since][-1]
        return (done - d0) / (now - t0) if done > d0 and now > t0 else None

    def line(self, done: int, total: int) -> str | None:
        now = time.monotonic()
        if done < 1 or total <= 0 or done >= total:
            return None
        if not self.samples or done > self.samples[-1][1]:
            self.samples.append((now, done))
        if now - self.samples[0][0] < self.settle_s:
            return None
        rate = self.pace(now, done)
        if rate is None:
            return None
        estimate = (now - self.t_start) + (total - done) / rate
        if self.said is not None and abs(estimate - self.said) <= self.revise * self.said:
            return None
        first = self.said is None
        self.said = estimate
        if estimate < self.from_s:
            return None
        text = (f"{'estimated' if first else 'revised estimate, at the pace so far:'} total: {_duration(estimate)} "
                f"for {total} {self.unit}s at {rate:.3g} {self.unit}/s")
        if self.hint and estimate > self.slow_s and first:
            text += f"; {self.hint}"
        return text


def run_with_progress(graph: Graph, counter: Stage, total: int, desc: str, unit: str = "frame",
                      slow_hint: str | None = None, slow_s: float = 60.0, estimate_from_s: float = 10.0) -> dict:
    """Start ``graph``, show a progress bar and return the report.

    The bar counts frames processed by ``counter`` out of ``total``. ``counter`` is usually the sink. After the
    first frames the estimated total time is printed, from the pace measured, by :class:`TotalEstimate`. It is
    printed only when it is at least ``estimate_from_s`` seconds. When it is longer than ``slow_s``,
    ``slow_hint`` says how to make it faster. It is printed again when the pace changes it. The bar alone says
    nothing when stderr is not a terminal. Ctrl-C drains the graph, so file sinks finish a playable file. The
    report then has ``"interrupted": True``.
    """
    graph.start()
    index = graph.stages.index(counter)
    bar = tqdm(total=total, desc=desc, unit=unit, disable=None, file=sys.stderr, dynamic_ncols=True)
    estimate = TotalEstimate(unit, slow_hint, slow_s, estimate_from_s)
    interrupted = False
    try:
        while graph.running:
            try:
                graph.join(timeout=0.2)
            except TimeoutError:
                pass
            except KeyboardInterrupt:
                if interrupted:  # second Ctrl-C: stop now
                    graph.cancel()
                    raise
                interrupted = True
                bar.write("interrupted: finishing the file (Ctrl-C again to abort)", file=sys.stderr)
                graph.drain()
            done = graph.telemetry.stages[index].work.count
            bar.update(done - bar.n)
            said = estimate.line(done, total)
            if said:
                bar.write(said, file=sys.stderr)
        report = graph.join()
    finally:
        bar.close()
    report["interrupted"] = interrupted
    return report


@contextlib.contextmanager
def finish_step_on_interrupt() -> Iterator[threading.Event]:
    """Within the block the first SIGINT only sets the yielded event.

    The loop then stops at the next step boundary. A second SIGINT raises ``KeyboardInterrupt`` at once. Outside
    the main thread signals can't be caught. There the event never sets and Ctrl-C behaves as usual.
    """
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return

    def handler(signum, frame):
        if event.is_set():
            raise KeyboardInterrupt
        event.set()
        print("\nCtrl-C: finishing this step and saving (Ctrl-C again to stop at once)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)
