"""Where a call's time goes: the torch profiler over a few calls, summed per op.

:func:`profile_ops` answers two questions a bench's miss raises. Is the device busy, or is the host the limit?
Which ops take the time? On CUDA it reads the kernels' device time and the host time of every op. On a CPU
there is only host time. The figures are per call, in milliseconds.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["profile_ops"]


def _device_us(event) -> float:
    """An averaged event's own device time, µs (the attribute torch 2.4+ names)."""
    return float(getattr(event, "self_device_time_total", 0.0) or 0.0)


def profile_ops(fn: Callable[[], object], device: torch.device | str, *, calls: int = 3, top: int = 8) -> dict:
    """Profile ``calls`` calls of ``fn`` after one untimed call.

    Returns ``wall_ms`` (per call), ``device_ms`` (the kernels' time summed, per call; 0 on a CPU),
    ``device_busy_share`` (device over wall; None on a CPU) and ``top``. ``top`` lists the ``top`` ops by own
    device time on CUDA, by own host time on a CPU. Each has ``name``, ``count``, ``device_ms``, ``host_ms``
    (per call) and ``share`` of the sorted total.
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - start) * 1000 / calls
    events = prof.key_averages()
    device_ms = sum(_device_us(e) for e in events) / 1000 / calls
    key = _device_us if cuda else (lambda e: float(e.self_cpu_time_total))
    ranked = sorted(events, key=key, reverse=True)
    total = sum(key(e) for e in ranked) or 1.0
    rows = [{"name": e.key, "count": e.count / calls, "device_ms": _device_us(e) / 1000 / calls,
             "host_ms": e.self_cpu_time_total / 1000 / calls, "share": key(e) / total} for e in ranked[:top]]
    return {"calls": calls, "wall_ms": wall_ms, "device_ms": device_ms,
            "device_busy_share": device_ms / wall_ms if cuda and wall_ms > 0 else None, "top": rows,
            "method": "torch.profiler over the calls after one untimed call; times are each op's own, per call"}
