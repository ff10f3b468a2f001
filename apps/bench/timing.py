"""Timing an op the way GPU kernels are timed in the field, and the card's own peaks.

The way is Triton's ``do_bench``. On CUDA, :func:`do_bench` works in steps:

- A first call is not timed. It holds compilation and autotuning.
- The time of one call is estimated.
- Calls run untimed for at least ``warmup_ms``, while the clocks ramp up.
- Timed repetitions run for at least ``rep_ms``.

Each repetition follows an L2 flush. A buffer larger than any L2 is zeroed. So an op cannot read inputs a
previous repetition left in the cache. Each is timed by its own pair of CUDA events around the op alone.

Some ops can be captured: no host sync, no allocation it cannot replay. Their repetitions are replayed from one
CUDA graph of ``flush, op`` pairs instead. So the figure has no launch overhead. The time of a graph of flushes
alone is subtracted. On a CPU it uses ``time.perf_counter`` around each call. The warm-up and repetition budgets
are the same. There is no flush.

:func:`measure_peaks` measures what the device really reaches, in the same run. One peak is copy bandwidth: a
device-to-device ``copy_`` of a buffer much larger than L2. It counts bytes read + written per second. The other
is dense matmul throughput: bf16 on CUDA, float32 on a CPU. So an op can be reported as a fraction of *measured*
peaks, not of a datasheet's.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable

import torch

__all__ = ["do_bench", "measure_peaks", "flush_buffer", "time_cap", "CaseTimeout", "L2_FLUSH_BYTES"]

L2_FLUSH_BYTES = 256 * 2**20  # larger than the L2 of any GPU we time (H100 50 MB, H200 60 MB, RTX 5090 96 MB)


def flush_buffer(device: torch.device) -> torch.Tensor | None:
    """The buffer zeroed between repetitions to flush L2. None on a CPU."""
    if device.type != "cuda":
        return None
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)


def _quantiles(times_ms: list[float]) -> dict:
    t = sorted(times_ms)

    def q(p):
        return t[min(len(t) - 1, int(p * len(t)))]

    return {"median_ms": q(0.5), "min_ms": t[0], "p20_ms": q(0.2), "p80_ms": q(0.8), "p90_ms": q(0.9),
            "max_ms": t[-1], "mean_ms": sum(t) / len(t), "reps": len(t)}


def _cpu(fn, warmup_ms: float, rep_ms: float, max_reps: int, min_reps: int) -> dict:
    fn()
    t0 = time.perf_counter()
    fn()
    est = max((time.perf_counter() - t0) * 1e3, 1e-3)
    deadline = time.perf_counter() + warmup_ms / 1e3
    warm = 0
    while time.perf_counter() < deadline:
        fn()
        warm += 1
    times = []
    for _ in range(max(min_reps, min(max_reps, int(rep_ms / est) + 1))):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return _quantiles(times) | {"warmup_calls": warm, "method": "perf_counter per call (CPU: no L2 flush)",
                                "times_ms": times}


def _events(fn, cache, n: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        cache.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _graphed(fn, cache, n: int) -> float | None:
    """ms per call from a CUDA graph of ``n`` (flush, op) pairs, less a graph of ``n`` flushes.

    None when the op cannot be captured. An op that syncs with the host is found by a run under
    ``set_sync_debug_mode("error")``, before any capture: a capture that fails can leave the CUDA random
    generator in capture state, and the next ``torch.randn`` on the device raises."""
    stream = torch.cuda.Stream()
    try:
        torch.cuda.set_sync_debug_mode("error")
        with torch.cuda.stream(stream):
            fn()  # warm on the capture stream; a host sync raises here
    except RuntimeError:
        return None
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    try:
        ops, flushes = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(ops, stream=stream):
            for _ in range(n):
                cache.zero_()
                fn()
        with torch.cuda.graph(flushes, stream=stream):
            for _ in range(n):
                cache.zero_()
    except Exception:  # noqa: BLE001 - a host sync or an allocation it cannot replay: time it eagerly
        torch.cuda.synchronize()
        return None
    result = []
    for graph in (ops, flushes):
        graph.replay()  # once untimed
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        result.append(start.elapsed_time(end))
    return max(result[0] - result[1], 0.0) / n


def do_bench(fn: Callable[[], object], device: torch.device | str, *, warmup_ms: float = 25.0,
             rep_ms: float = 100.0, flush_l2: bool = True, graph: bool = True, max_reps: int = 10_000,
             min_reps: int = 3, keep_times: bool = False) -> dict:
    """Time ``fn()``, as the module docs say.

    Returns ``median_ms``, the figure to report. Also ``min_ms``, ``p20_ms``, ``p80_ms``, ``mean_ms``, ``reps``,
    ``warmup_calls`` and ``method``. On CUDA it adds ``graph_ms`` and ``graph_note``. ``graph_ms`` is per call
    from a CUDA-graph replay, None where the op could not be captured. With ``keep_times`` it adds ``times_ms``,
    every repetition."""
    device = torch.device(device)
    if device.type != "cuda":
        out = _cpu(fn, warmup_ms, rep_ms, max_reps, min_reps)
        return out if keep_times else {k: v for k, v in out.items() if k != "times_ms"}
    cache = flush_buffer(device) if flush_l2 else torch.empty(1, dtype=torch.int32, device=device)
    fn()
    torch.cuda.synchronize()
    est = max(sum(_events(fn, cache, 5)) / 5, 1e-3)
    n_warm = max(1, int(warmup_ms / est))
    for _ in range(n_warm):
        fn()
    reps = max(min_reps, min(max_reps, int(rep_ms / est)))
    times = _events(fn, cache, reps)
    out = _quantiles(times) | ({"times_ms": times} if keep_times else {}) | {
        "warmup_calls": n_warm, "method": f"CUDA events around each call after an L2 flush ({L2_FLUSH_BYTES >> 20} "
                                          f"MiB zeroed); ≥ {warmup_ms:g} ms warm-up, ≥ {rep_ms:g} ms of repetitions"}
    if graph:
        g = _graphed(fn, cache, min(reps, 100))
        out["graph_ms"] = g
        out["graph_note"] = ("per call from one CUDA graph of flush + call pairs, less a graph of the flushes alone"
                             if g is not None else "not capturable (the op syncs with the host or allocates)")
    return out


class CaseTimeout(Exception):
    """A case ran past its time cap. See :func:`time_cap`."""


@contextlib.contextmanager
def time_cap(seconds: float | None, what: str):
    """Raise :class:`CaseTimeout` once ``seconds`` have passed inside the block. None or 0: no cap.

    It raises in this thread, the main one. So one slow case cannot take a whole run's time. It uses
    ``SIGALRM``, which interrupts Python between operations, not a running kernel."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise CaseTimeout(f"{what}: over its {seconds:g} s cap")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def measure_peaks(device: torch.device | str, *, copy_mib: int = 1024, matmul_n: int = 8192) -> dict:
    """The device's own copy bandwidth and dense matmul throughput, measured now. See the module docs."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    if not cuda:
        copy_mib, matmul_n = min(copy_mib, 256), min(matmul_n, 2048)
    src = torch.empty(copy_mib * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    copy = do_bench(lambda: dst.copy_(src), device, flush_l2=False, graph=False)
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    mm = do_bench(lambda: a @ b, device, flush_l2=False, graph=False)

    return {
        "copy_tb_s": 2 * copy_mib * 2**20 / (copy["median_ms"] * 1e-3) / 1e12,
        "copy_method": f"dst.copy_(src) of {copy_mib} MiB float32 on the device: bytes read + written per second",
        "matmul_tflop_s": 2 * matmul_n**3 / (mm["median_ms"] * 1e-3) / 1e12,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "matmul_method": f"a @ b, {matmul_n}x{matmul_n} {str(dtype).removeprefix('torch.')}: 2 n^3 flops per call",
    }
