"""Sources fed from outside the graph. They are the generic twin of GStreamer's appsrc.

The class :class:`Pushed` is what every such source shares. Another thread hands values in. A call of
:meth:`~Pushed.close` ends the stream once what is buffered is out. A call of :meth:`~Pushed.interrupt` ends it
at once, on barge-in or cancel. The worker waits on one condition for any of the three. Two sources build on it:

- :class:`PushSource`: one value with a :class:`PortSpec`. Examples are a client's camera pose or picture, or a
  control value. The newest pending value wins. Nothing queues.
- :class:`~.media.PushAudioSource`: PCM samples of any length in, fixed chunks out, through a bounded
  buffer.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from .frame import PortSpec
from .stage import EndOfStream, Stage


class Pushed(Stage):
    """Base of the sources another thread feeds.

    It holds the lock, close and interrupt, and the worker's wait. The wait is reported to the graph as the
    source's ``input_wait``. So a source idle until the client sends does not count as slow.

    Subclasses hold their buffer under ``self._cv``, a ``threading.Condition``. They call :meth:`_accepting`
    inside it before storing a pushed value. They call ``self._cv.notify_all()`` after. They call
    :meth:`_wait_until` at the start of ``process``.
    """

    waits_outside = True

    def __init__(self, name: str):
        super().__init__(name)
        self._cv = threading.Condition()
        self._closed = self._interrupted = False

    def close(self) -> None:
        """No more input: the source ends once what is buffered is out."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def interrupt(self) -> None:
        """End the stream now, dropping what is buffered. The graph's cancel calls this."""
        with self._cv:
            self._interrupted = True
            self._cv.notify_all()

    def setup(self, ctx):
        super().setup(ctx)
        self._interrupted = False

    def _accepting(self) -> None:
        """Under ``self._cv``: raise ``ValueError`` once the source is closed."""
        if self._closed:
            raise ValueError(f"{self.name}: push after close")

    def _wait_until(self, ready: Callable[[], bool]) -> bool:
        """Under ``self._cv``: wait until ``ready()``, a close or an interrupt.

        Returns False when interrupted: the stream ends now. After a close the caller delivers what is left,
        if anything.
        """
        t0 = time.monotonic_ns()
        while not ready() and not self._closed and not self._interrupted:
            self._cv.wait()
        if self.ctx is not None:
            self.ctx.input_waited(time.monotonic_ns() - t0)
        return not self._interrupted


class PushSource(Pushed):
    """Emits what another thread :meth:`push` es, on port ``port``, described by ``spec``.

    Each value is stamped with the session clock at arrival. The source holds one pending value. A value
    pushed while an older one is pending replaces it. ``superseded`` counts these. The newest pose wins and
    nothing queues. Connect it with a ``latest`` edge to a stage paced by something else. Or connect it with
    any edge to be paced by the pushes.

    Args:
        spec: shape, dtype and device of a value.
        name: the stage name.
        port: the output port's name, ``"value"`` by default. Use ``"video"`` for pictures, as a video
            source does.
    """

    def __init__(self, spec: PortSpec, *, name: str = "push", port: str = "value"):
        super().__init__(name)
        self.spec, self.port = spec, port
        self.outputs = {port: spec}
        self._pending: torch.Tensor | None = None
        self.received = 0
        self.superseded = 0

    def push(self, value) -> None:
        """Hand a value in, from any thread.

        Raises ``ValueError`` for a value of another shape or a float value that is not finite. It also raises
        after :meth:`close`.
        """
        v = torch.as_tensor(value, dtype=self.spec.dtype)
        if tuple(v.shape) != tuple(self.spec.shape):
            raise ValueError(f"{self.name}: expected a value of shape {list(self.spec.shape)}, got {list(v.shape)}")
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise ValueError(f"{self.name}: the value has NaN or infinite entries")
        with self._cv:
            self._accepting()
            if self._pending is not None:
                self.superseded += 1
            self._pending = v.clone()
            self.received += 1
            self._cv.notify_all()

    def process(self, inputs, out):
        with self._cv:
            if not self._wait_until(lambda: self._pending is not None) or self._pending is None:
                raise EndOfStream
            value, self._pending = self._pending, None
        frame = out.write(self.port)  # outside the lock: it may wait on backpressure
        frame.data.copy_(value)
        frame.pts = self.ctx.clock.now_ticks()
