"""Telemetry: per-stage work and waits, end-to-end latency, FPS, drops, deadline misses, time to first frame.

Recording is cheap enough to leave on. Each sample goes into a preallocated window. That is a numpy ring of
the last ``window`` values. It also goes into cumulative histogram buckets. Nothing is allocated. Percentiles
are computed only when a report is asked for. ``prometheus_text`` renders a report in the Prometheus text
exposition format. So any server can mount it at ``/metrics``.
"""
from __future__ import annotations

import bisect
import threading
import time

import numpy as np

# Histogram bucket upper bounds in milliseconds (Prometheus convention: cumulative, plus +Inf).
BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0,
              2500.0, 10000.0)


def percentiles(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """``np.percentile(values, ps)`` with linear interpolation, from one sort.

    numpy's own call loads ``numpy.ma`` the first time. That would slow the end of every command-line run.
    """
    v = np.sort(values)
    out = []
    for p in ps:
        pos = (len(v) - 1) * p / 100
        lo = int(pos)
        hi = min(lo + 1, len(v) - 1)
        out.append(float(v[lo] + (v[hi] - v[lo]) * (pos - lo)))
    return out


class LatencyWindow:
    """The last ``window`` latency samples in ms, plus all-time histogram counts and sum."""

    def __init__(self, window: int = 4096):
        self.values_ms = np.zeros(window, dtype=np.float64)
        self.count = 0
        self.sum_ms = 0.0
        self.buckets = [0] * (len(BUCKETS_MS) + 1)

    def add(self, ms: float) -> None:
        self.values_ms[self.count % len(self.values_ms)] = ms
        self.count += 1
        self.sum_ms += ms
        self.buckets[bisect.bisect_left(BUCKETS_MS, ms)] += 1

    def recent(self) -> np.ndarray:
        return self.values_ms[: min(self.count, len(self.values_ms))]

    def summary(self) -> dict:
        v = self.recent()
        if len(v) == 0:
            return {"count": 0}
        p50, p95, p99 = percentiles(v, (50, 95, 99))
        return {"count": self.count, "mean_ms": float(v.mean()), "p50_ms": float(p50),
                "p95_ms": float(p95), "p99_ms": float(p99), "max_ms": float(v.max())}


class StageStats:
    """What the runtime records for one stage, per frame, in three parts that do not overlap.

    - ``work``: the stage's own compute. That is its ``process`` call, less the time it was blocked on output.
    - ``output_wait``: blocked on output. That is waiting for a free slot on a full downstream ``block`` ring.
      Fan-out copies are included. At a source in fast mode it also covers waiting for a flow-limiter credit.
    - ``input_wait``: waiting for upstream input before the call. A source fed from outside the graph has
      :attr:`~.stage.Stage.waits_outside`. There it is the wait inside ``process`` for the pushed input.

    A realtime source's pacing wait for its frame's pts is in none of them. Any other source has no
    ``input_wait``. A sink has no ``output_wait``. Those are None. Budgets, deadline misses and the fallback
    governor look at ``work`` only. A stage that waits on its neighbours is not over budget.
    """

    def __init__(self, name: str, budget_ms: float | None, window: int, *, inputs: bool = True,
                 outputs: bool = True):
        self.name = name
        self.budget_ms = budget_ms
        self.work = LatencyWindow(window)  # ms of own compute per frame
        self.output_wait = LatencyWindow(window) if outputs else None  # ms blocked on output per frame
        self.input_wait = LatencyWindow(window) if inputs else None  # ms waiting for input per frame
        self.deadline_misses = 0
        self.fallback_level = 0
        self.fallback_changes = 0
        self.discarded = 0  # frames written to an output port nobody reads (released at once)
        self.first_ns = 0
        self.last_ns = 0

    def record(self, enter_ns: int, exit_ns: int, work_ns: int, output_wait_ns: int = 0,
               input_wait_ns: int = 0) -> None:
        """Record one frame.

        It entered ``process`` at ``enter_ns`` and left the stage at ``exit_ns``. Both are monotonic ns, for
        the FPS. ``work_ns``, ``output_wait_ns`` and ``input_wait_ns`` are its three parts in ns.
        """
        ms = work_ns / 1e6
        self.work.add(ms)
        if self.output_wait is not None:
            self.output_wait.add(output_wait_ns / 1e6)
        if self.input_wait is not None:
            self.input_wait.add(input_wait_ns / 1e6)
        if self.budget_ms is not None and ms > self.budget_ms:
            self.deadline_misses += 1
        if not self.first_ns:
            self.first_ns = enter_ns
        self.last_ns = exit_ns

    def fps(self) -> float:
        n = self.work.count
        span = (self.last_ns - self.first_ns) / 1e9
        return (n - 1) / span if n > 1 and span > 0 else 0.0

    @staticmethod
    def _wait_summary(win: LatencyWindow | None) -> dict | None:
        return None if win is None else {**win.summary(), "total_s": win.sum_ms / 1000.0}

    def report(self) -> dict:
        """The stage's report: ``work``, ``output_wait``, ``input_wait``, frames, fps and budget checks.

        ``work`` has count, mean, p50/p95/p99 and max in ms. ``output_wait`` and ``input_wait`` add
        ``total_s``, in all-time seconds. They are None where the stage has no such side.
        """
        return {"budget_ms": self.budget_ms, "frames": self.work.count, "fps": self.fps(),
                "work": self.work.summary(), "output_wait": self._wait_summary(self.output_wait),
                "input_wait": self._wait_summary(self.input_wait), "deadline_misses": self.deadline_misses,
                "fallback_level": self.fallback_level, "fallback_changes": self.fallback_changes,
                "discarded": self.discarded}


class Telemetry:
    """Per-graph telemetry.

    It holds one :class:`StageStats` per stage, end-to-end latency at sinks, TTFF and A/V offset. It is
    thread-safe for the graph's workers. Each stage writes only its own stats. Sinks share the end-to-end
    window under a lock.
    """

    def __init__(self, stage_names: list[str], budgets_ms: list[float | None], window: int = 4096,
                 sides: list[tuple[bool, bool]] | None = None):
        """``sides`` gives per stage a pair: has inputs, has outputs. None means every stage has both."""
        sides = sides or [(True, True)] * len(stage_names)
        self.stages = [StageStats(n, b, window, inputs=i, outputs=o)
                       for n, b, (i, o) in zip(stage_names, budgets_ms, sides)]
        self.end_to_end = LatencyWindow(window)  # sink exit − source capture, ms
        self.av_offset = LatencyWindow(window)  # video pts − audio pts at the sink, ms (signed)
        self.start_ns = time.monotonic_ns()
        self.first_frame_ns = 0
        self.sink_frames = 0
        self._last_sink_ns = 0
        self._lock = threading.Lock()

    def started(self) -> None:
        self.start_ns = time.monotonic_ns()

    def sink_frame(self, capture_ns: int, now_ns: int) -> None:
        """A frame reached a sink: end-to-end latency from its capture, and time to first frame."""
        with self._lock:
            if capture_ns:
                self.end_to_end.add((now_ns - capture_ns) / 1e6)
            if not self.first_frame_ns:
                self.first_frame_ns = now_ns
            self.sink_frames += 1
            self._last_sink_ns = now_ns

    def record_av_offset(self, offset_ms: float) -> None:
        """A sink that presents audio and video reports how far video leads audio, in signed ms."""
        with self._lock:
            self.av_offset.add(offset_ms)

    def sink_fps(self) -> float:
        span = (self._last_sink_ns - self.first_frame_ns) / 1e9
        return (self.sink_frames - 1) / span if self.sink_frames > 1 and span > 0 else 0.0

    def report(self, edges: list[dict] | None = None, extra: dict | None = None) -> dict:
        ttff = (self.first_frame_ns - self.start_ns) / 1e6 if self.first_frame_ns else None
        out = {
            "time_to_first_frame_ms": ttff,
            "sink_frames": self.sink_frames,
            "fps": self.sink_fps(),
            "end_to_end": self.end_to_end.summary(),
            "av_offset": self.av_offset.summary(),
            "stages": {s.name: s.report() for s in self.stages},
            "edges": edges or [],
        }
        if extra:
            out.update(extra)
        return out


def _labels(**kv) -> str:
    parts = [f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
             for k, v in kv.items()]
    return "{" + ",".join(parts) + "}" if parts else ""


def prometheus_family(name: str, kind: str, help_: str, series) -> list[str]:
    """The lines of one Prometheus metric family.

    They are ``# HELP``, ``# TYPE`` and one line per ``(labels dict, value)`` of ``series``. The type is
    ``counter`` or ``gauge``.
    """
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"] + [f"{name}{_labels(**lab)} {value}"
                                                                   for lab, value in series]


def prometheus_text(telemetries: list[Telemetry] | Telemetry, edges: list[list[dict]] | None = None,
                    prefix: str = "framegraph", labels: list[dict] | None = None) -> str:
    """Prometheus text exposition, format 0.0.4, of one or several graphs' telemetry.

    Args:
        telemetries: a :class:`Telemetry` or a list of them, one per session of a server.
        edges: per telemetry, the edge list of :meth:`Graph.edge_report`, with drops and queue depth.
        labels: per telemetry, extra labels such as ``{"session": "3"}``.
    Returns the text to serve with content type ``text/plain; version=0.0.4``.
    """
    if isinstance(telemetries, Telemetry):
        telemetries = [telemetries]
    edges = edges or [[] for _ in telemetries]
    labels = labels or [{} for _ in telemetries]
    lines: list[str] = []

    def histogram(name: str, help_: str, series: list[tuple[dict, LatencyWindow]]):
        lines.append(f"# HELP {prefix}_{name} {help_}")
        lines.append(f"# TYPE {prefix}_{name} histogram")
        for lab, win in series:
            cum = 0
            for bound, n in zip(BUCKETS_MS + (float("inf"),), win.buckets):
                cum += n
                le = "+Inf" if bound == float("inf") else repr(bound / 1000.0)
                lines.append(f"{prefix}_{name}_bucket{_labels(**lab, le=le)} {cum}")
            lines.append(f"{prefix}_{name}_sum{_labels(**lab)} {win.sum_ms / 1000.0}")
            lines.append(f"{prefix}_{name}_count{_labels(**lab)} {win.count}")

    def counter(name: str, kind: str, help_: str, series: list[tuple[dict, float]]):
        lines.extend(prometheus_family(f"{prefix}_{name}", kind, help_, series))

    def per_stage(part: str) -> list[tuple[dict, LatencyWindow]]:
        return [({**lab, "stage": s.name}, getattr(s, part)) for t, lab in zip(telemetries, labels)
                for s in t.stages if getattr(s, part) is not None]

    histogram("stage_work_seconds", "A stage's own compute per frame (process(), less its waits on output).",
              per_stage("work"))
    histogram("stage_output_wait_seconds", "Time per frame a stage was blocked on output (a full downstream "
              "ring, a source's flow-limiter credit).", per_stage("output_wait"))
    histogram("stage_input_wait_seconds", "Time per frame a stage waited for upstream input.", per_stage("input_wait"))
    histogram("end_to_end_latency_seconds", "Source capture to sink, per frame.",
              [(lab, t.end_to_end) for t, lab in zip(telemetries, labels)])
    counter("deadline_misses_total", "counter", "Frames whose work exceeded the stage budget.",
            [({**lab, "stage": s.name}, s.deadline_misses) for t, lab in zip(telemetries, labels) for s in t.stages])
    counter("sink_frames_total", "counter", "Frames that reached a sink.",
            [(lab, t.sink_frames) for t, lab in zip(telemetries, labels)])
    counter("edge_drops_total", "counter", "Frames dropped on an edge by its policy.",
            [({**lab, "edge": e["name"]}, e["drops"]) for es, lab in zip(edges, labels) for e in es])
    counter("edge_queue_depth", "gauge", "Frames ready and unread on an edge.",
            [({**lab, "edge": e["name"]}, e["depth"]) for es, lab in zip(edges, labels) for e in es])
    counter("sessions", "gauge", "Graphs (sessions) reported.", [({}, len(telemetries))])
    return "\n".join(lines) + "\n"
