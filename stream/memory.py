"""Memory while graphs run: freed memory stays with the process (glibc's malloc on Linux), and the cycle
collector leaves the loaded models alone.

A stage computes each frame with the same temporary tensors: a few MiB each at video sizes, allocated and
freed again every frame. glibc gives every worker thread an arena of its own and hands such blocks back to
the kernel when they are freed (``mmap`` above a moving threshold, heap trimming), so the next frame faults
every page in again: measured on the video avatar's mouth region (720×576 frame, 240² region, 2-core CPU)
~4,900 page faults and ~40 % system time per frame in a worker thread, against none in the main thread; its
graph ran at ~20 fps instead of ~27. Fixed thresholds keep freed blocks in the heap for the next frame.

A session's graph starts new worker threads, and a new thread that gets a new arena faults its pages in on its
first frame: a warmed model step's first call in such a thread costs about twice a steady one, and a session's first
frame waits for it (``framegraph bench first_frame``). With no more arenas than the cores the process may run on, a
new thread shares an arena the warm-up already filled, and at most that many threads run malloc at once anyway.

Python's cycle collector, on a full collection, walks every object it tracks while holding the interpreter: with
torch, a model and Pipecat loaded that is ~280,000 objects and 150-190 ms on a 2-core CPU, during which no stage
thread runs and the picture stream pauses. The first live graph freezes what is loaded by then
(:func:`freeze_loaded_objects`); later collections walk only what was made since.
"""
from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import gc
import os
import sys
import threading

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

MMAP_THRESHOLD_BYTES = 256 << 20  # blocks below this come from the heap (a 720p float frame is ~5 MiB)
TRIM_THRESHOLD_BYTES = 1 << 30  # free memory at the heap's top kept up to this before handing it back

_done = False
_frozen = False
_lock = threading.Lock()


def arena_count() -> int:
    """The most malloc arenas worth having: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds and its arena count (:func:`arena_count`) once per process
    (process-wide, from then on); True when they are set (now or before), False where the C library is not glibc
    (nothing to do there)."""
    global _done
    with _lock:
        if _done:
            return True
        if not sys.platform.startswith("linux"):
            return False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # musl and others: no mallopt
            return False
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _done = all([mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
                     mallopt(M_ARENA_MAX, arena_count())])
        return _done


def freeze_loaded_objects() -> bool:
    """Once per process: collect, then take every object alive now out of the cycle collector's walks
    (``gc.freeze``; they are still freed when their last reference goes). True when it happened in this call."""
    global _frozen
    with _lock:
        if _frozen:
            return False
        _frozen = True
    gc.collect()
    gc.freeze()
    atexit.register(_unfreeze_for_triton)
    return True


def _unfreeze_for_triton() -> None:
    """At exit: triton's extension lists every object never freed as leaked (~80 lines), and frozen ones are
    never freed; unfrozen, the last collection frees them."""
    if "triton._C.libtriton" in sys.modules:
        gc.unfreeze()


__all__ = ["freeze_loaded_objects", "keep_freed_memory"]
