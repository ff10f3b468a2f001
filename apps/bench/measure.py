"""What the benches measure with: call timing, latency summaries, torch threads, process memory."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

import psutil
import torch

from framegraph.stream.telemetry import LatencyWindow

MiB = 2 ** 20


def summary_ms(values_ms) -> dict:
    """``{"count", "mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms"}`` of a sequence of times in ms.

    Empty input gives ``{"count": 0}``. It is the graph telemetry's own summary,
    :class:`~framegraph.stream.telemetry.LatencyWindow`. So a bench's p99 means what a graph report's means."""
    window = LatencyWindow(max(1, len(values_ms)))
    for v in values_ms:
        window.add(float(v))
    return window.summary()


def stage_times(report: dict, names=None) -> dict:
    """Per stage of a graph report that ran: its work per call and its waits.

    ``names`` picks the stages; the default is all. Work is ``process()`` less its waits on full rings. It has
    ``calls``, ``mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms`` and ``max_ms``. The waits are
    ``output_wait_p50_ms`` / ``output_wait_p99_ms`` / ``output_wait_total_s``: time blocked on a full downstream
    ring. The same three exist for ``input_wait``: time waiting for upstream input. Each is None where the
    stage has no such side."""
    table = {}
    for name in report["stages"] if names is None else names:
        s = report["stages"][name]
        work = s["work"]
        if not work.get("count"):
            continue
        table[name] = {"calls": work["count"], **{k: v for k, v in work.items() if k != "count"}}
        for side in ("output_wait", "input_wait"):
            w = s[side] or {}
            table[name] |= {f"{side}_p50_ms": w.get("p50_ms"), f"{side}_p99_ms": w.get("p99_ms"),
                            f"{side}_total_s": w.get("total_s")}
    return table


def time_ms(call: Callable[[int], object], device: torch.device, iters: int, warmup: int = 0,
            first: int = 0) -> list[float]:
    """ms of each of ``iters`` calls ``call(i)`` after ``warmup`` untimed ones.

    ``i`` counts from ``first``. It is a frame index, for renderers whose scene moves. Timing uses CUDA events on
    CUDA, with no host synchronize inside the timed region. Elsewhere it uses ``time.perf_counter``."""
    for i in range(warmup):
        call(first + i)
    first += warmup
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for i in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(first + i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for i in range(iters):
            t0 = time.perf_counter()
            call(first + i)
            times.append((time.perf_counter() - t0) * 1000)
    return times


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU intra-op threads set to ``n`` inside the block, then restored. ``None`` leaves them as they are."""
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def rss_bytes() -> int:
    """Resident memory of this process in bytes, from Linux ``/proc/self/statm``."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status``, such as ``VmRSS`` or ``VmHWM``. None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class MemoryProbe:
    """Peak memory of one call: ``{"peak_memory_mib", "render_memory_mib"}``. ``method`` says how.

    - CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. That is everything torch
      allocated on the device, scene included. Render memory is that peak minus what was allocated before the
      call.
    - CPU on Linux: the process's peak RSS, ``VmHWM``, during the call. It is reset first through
      ``/proc/self/clear_refs``, and freed heap pages are returned with ``malloc_trim``. Render memory is that
      peak minus the RSS before the call.
    - CPU elsewhere: RSS sampled by ``psutil`` every millisecond in a thread. It can miss short peaks.
    """

    kind: Literal["cuda", "vmhwm", "psutil"]

    def __init__(self, device: torch.device):
        self.device = device
        self._trim = None
        if device.type == "cuda":
            self.method = ("cuda: torch.cuda.max_memory_allocated during one render after reset_peak_memory_stats "
                           "(peak_memory_mib: all torch allocations, scene included; render_memory_mib: peak minus "
                           "allocated before the render)")
            self.kind = "cuda"
            return
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            self._trim = None
        if status_kib("VmHWM") is not None and self._reset_hwm():
            self.kind = "vmhwm"
            self.method = ("cpu: process peak RSS (Linux VmHWM, reset through /proc/self/clear_refs) during one "
                           "render, after gc + malloc_trim(0) (peak_memory_mib: whole-process RSS peak; "
                           "render_memory_mib: peak minus RSS before the render)")
        else:
            self.kind = "psutil"
            self.method = ("cpu: psutil RSS sampled every 1 ms in a thread during one render (peak_memory_mib: "
                           "whole-process RSS peak; render_memory_mib: peak minus RSS before; short peaks can be "
                           "missed)")

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def measure(self, fn) -> dict:
        gc.collect()
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            fn()
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            return {"peak_memory_mib": peak / MiB, "render_memory_mib": (peak - before) / MiB}
        if self._trim is not None:
            self._trim(0)
        if self.kind == "vmhwm":
            before = status_kib("VmRSS") * 1024
            self._reset_hwm()
            fn()
            peak = status_kib("VmHWM") * 1024
        else:
            proc = psutil.Process()
            before = peak = proc.memory_info().rss
            done = threading.Event()
            samples = [before]

            def sample():
                while not done.is_set():
                    samples.append(proc.memory_info().rss)
                    time.sleep(0.001)

            th = threading.Thread(target=sample, daemon=True)
            th.start()
            try:
                fn()
            finally:
                done.set()
                th.join()
            peak = max(samples + [proc.memory_info().rss])
        return {"peak_memory_mib": peak / MiB, "render_memory_mib": max(peak - before, 0) / MiB}

