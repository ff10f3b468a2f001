"""The session clock: one timeline for audio and video, and the pacing of sources.

Time is counted in integer **ticks**, 48 000 per second by default. So 20 ms of 16 kHz audio is 960 ticks.
A 25 fps frame is 1920 ticks, a 30 fps frame 1600, a 60 fps frame 800. Audio is the master. Video pts come
from audio sample counts, or from the frame index in offline renders. They never come from the wall clock.
So picture and sound cannot drift apart.

Modes:
``realtime``
    A source's frame is released when the wall clock reaches its pts. The wall clock counts from the
    moment the graph started. For live use.
``fast``
    As fast as possible, with no waiting. For offline renders and benches.
"""
from __future__ import annotations

import threading
import time
from fractions import Fraction
from typing import Literal, get_args

TICKS_PER_SECOND = 48_000
ClockMode = Literal["realtime", "fast"]
MODES: tuple[str, ...] = get_args(ClockMode)


class Clock:
    """Session clock.

    Args:
        mode: ``"realtime"`` or ``"fast"``.
        ticks_per_second: tick rate of pts values.
    """

    def __init__(self, mode: ClockMode = "fast", ticks_per_second: int = TICKS_PER_SECOND):
        if mode not in MODES:
            raise ValueError(f"unknown clock mode {mode!r}; expected one of {MODES}")
        self.mode = mode
        self.ticks_per_second = int(ticks_per_second)
        self.start_ns: int | None = None
        self._stopped = threading.Event()

    # ---- conversions --------------------------------------------------------------------------
    def ticks_from_samples(self, n_samples: int, sample_rate: int) -> int:
        """pts of audio sample ``n_samples`` at ``sample_rate`` Hz. Exact when the rates divide."""
        return (int(n_samples) * self.ticks_per_second) // int(sample_rate)

    def ticks_from_frame(self, index: int, fps: float | Fraction) -> int:
        """pts of video frame ``index`` at ``fps`` frames per second, rounded to the nearest tick."""
        return round(Fraction(int(index)) * self.ticks_per_second / Fraction(fps).limit_denominator(1001))

    def frame_at_ticks(self, pts: int, fps: float | Fraction) -> int:
        """Index of the video frame showing at ``pts``: the last frame whose pts ≤ ``pts``."""
        return int(Fraction(int(pts)) * Fraction(fps).limit_denominator(1001) // self.ticks_per_second)

    def seconds(self, ticks: int) -> float:
        return ticks / self.ticks_per_second

    def ticks(self, seconds: float) -> int:
        return round(seconds * self.ticks_per_second)

    # ---- pacing -------------------------------------------------------------------------------
    def start(self) -> None:
        self.start_ns = time.monotonic_ns()
        self._stopped.clear()

    def stop(self) -> None:
        """Wake anything waiting in :meth:`wait_until`. Used on graph cancel and drain."""
        self._stopped.set()

    def now_ticks(self) -> int:
        """Ticks since :meth:`start` on the wall clock."""
        if self.start_ns is None:
            return 0
        return (time.monotonic_ns() - self.start_ns) * self.ticks_per_second // 1_000_000_000

    def deadline_ns(self, pts: int) -> int:
        """Monotonic ns at which ``pts`` is due in realtime mode."""
        return (self.start_ns or 0) + pts * 1_000_000_000 // self.ticks_per_second

    def wait_until(self, pts: int) -> bool:
        """Realtime: wait until ``pts`` is due.

        Returns False if the clock was stopped meanwhile. Fast mode returns at once.
        """
        if self.mode == "fast":
            return not self._stopped.is_set()
        delay_s = (self.deadline_ns(pts) - time.monotonic_ns()) / 1e9
        if delay_s > 0:
            return not self._stopped.wait(delay_s)
        return not self._stopped.is_set()


class FlowLimiter:
    """At most ``max_in_flight`` frames of one source between the source and the sinks.

    A frame is "done" when a sink consumes it. It is also done when a stage consumes it without emitting
    anything, or when a ring drops it. Done-ness is a watermark of sequence numbers. Frames of one source are
    produced in order. So the limiter needs no per-frame bookkeeping.
    """

    def __init__(self, max_in_flight: int):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = int(max_in_flight)
        self.emitted = 0  # sequence numbers 0..emitted-1 were released by the source
        self.done_upto = -1  # every seq <= this is done
        self.dropped = 0  # frames the source dropped because too many were in flight
        self._cv = threading.Condition()
        self._cancelled = False

    @property
    def in_flight(self) -> int:
        return self.emitted - 1 - self.done_upto

    def has_room(self) -> bool:
        return self.in_flight < self.max_in_flight

    def wait_for_room(self) -> bool:
        """Block until a frame may be emitted. Returns False if cancelled."""
        with self._cv:
            while not self._cancelled and self.in_flight >= self.max_in_flight:
                self._cv.wait()
            return not self._cancelled

    def emitted_one(self) -> None:
        with self._cv:
            self.emitted += 1

    def done(self, seq: int) -> None:
        with self._cv:
            if seq > self.done_upto:
                self.done_upto = seq
                self._cv.notify_all()

    def cancel(self) -> None:
        with self._cv:
            self._cancelled = True
            self._cv.notify_all()
