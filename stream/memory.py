"""Memory while graphs run.

Freed memory stays with the process, through glibc's malloc on Linux. The cycle collector leaves the loaded
models alone.

A stage computes each frame with the same temporary tensors. Each is a few MiB at video sizes. They are
allocated and freed again every frame. The glibc malloc gives every worker thread an arena of its own. It hands such
blocks back to the kernel when they are freed. It does so by ``mmap`` above a moving threshold and by heap
trimming. The next frame then faults every page in again. Fixed thresholds keep freed blocks in the heap for
the next frame.

A session's graph starts new worker threads. A new thread that gets a new arena faults its pages in on its
first frame. A session's first frame waits for it. ``framegraph bench first_frame`` shows the cost. The arena
count is capped at the cores the process may run on. A new thread then shares an arena the warm-up already
filled. At most that many threads run malloc at once anyway.

On a full collection, Python's cycle collector walks every object it tracks. It holds the interpreter meanwhile.
No stage thread runs, and the picture stream pauses. With torch, a model and Pipecat loaded, that is a large
number of objects. The first live graph freezes what is loaded by then, with :func:`freeze_loaded_objects`.
Later collections walk only what was made since.
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

MMAP_THRESHOLD_BYTES = 256 << 20  # blocks below this come from the heap; a 720p float frame is ~5 MiB
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
    """Set glibc's mmap and trim thresholds and its arena count, once per process.

    The arena count is :func:`arena_count`. The settings hold process-wide from then on. Returns True when they
    are set, now or before. Returns False where the C library is not glibc. There is nothing to do there.
    """
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
    """Once per process: collect, then take every object alive now out of the cycle collector's walks.

    This is ``gc.freeze``. The objects are still freed when their last reference goes. Returns True when it
    happened in this call.
    """
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
    """At exit, unfreeze when triton is loaded.

    Triton's extension lists every object never freed as leaked, some 80 lines. Frozen objects are never freed.
    Unfrozen, the last collection frees them.
    """
    if "triton._C.libtriton" in sys.modules:
        gc.unfreeze()


__all__ = ["freeze_loaded_objects", "keep_freed_memory"]
