"""An asyncio server on its own event loop, in a daemon thread.

This is the one way the server and the cluster's front door run beside the caller's code.
The class :class:`StartedInWith` is the context manager of the handles that start them.
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Self


class StartedInWith:
    """A handle with ``start()`` and ``stop()``. ``start()`` returns the handle.

    As a context manager it starts on entering the ``with`` block. It stops on leaving it.
    """

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LoopThread:
    """Runs the subclass's ``_serve()`` coroutine on :attr:`loop` in a daemon thread named ``name``.

    ``_serve`` sets ``_ready`` once it is up. A failure before that sets it too.
    ``_serve`` returns once ``_stop``, its own event, is set.
    Then :meth:`_start_thread` starts the thread and waits for ``_ready``. It raises what ``_serve`` failed with.

    The loop's default executor serves ``asyncio.to_thread`` and aiortc's encoders.
    It is its own pool of at most :attr:`workers` threads, named ``<name>:worker_<i>``.
    It grows lazily up to that bound while calls overlap. It is shut down with the loop.
    So a count of the process's threads can tell its workers from anything leaked.
    """

    workers = min(32, (os.cpu_count() or 1) + 4)  # asyncio's own default bound

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(self.workers, thread_name_prefix=f"{name}:worker")
        self.loop.set_default_executor(self.executor)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    async def _serve(self) -> None:
        raise NotImplementedError

    def _start_thread(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()
        finally:
            self.executor.shutdown(wait=False)
