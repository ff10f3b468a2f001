"""PushSource: a source fed from outside the graph (a client's camera pose, a control value, anything
with a :class:`PortSpec`) — the generic twin of GStreamer's appsrc. Audio, which arrives as a stream of
samples of any length and leaves in fixed chunks, has its own :class:`~.media.PushAudioSource`."""
from __future__ import annotations

import threading

import torch

from .frame import PortSpec
from .stage import EndOfStream, Stage


class PushSource(Stage):
    """Emits what another thread :meth:`push` es, on port ``"value"`` (``spec``), stamped with the session
    clock at arrival. Holds one pending value: a value pushed while an older one is still pending
    replaces it (counted in ``superseded``) — the newest pose wins, nothing queues. Connect it with a
    ``latest`` edge to a stage paced by something else, or with any edge to be paced by the pushes.

    Args:
        spec: shape, dtype and device of a value.
        name: the stage name.
    """

    def __init__(self, spec: PortSpec, *, name: str = "push"):
        super().__init__(name)
        self.spec = spec
        self.outputs = {"value": spec}
        self._pending: torch.Tensor | None = None
        self._cv = threading.Condition()
        self._closed = self._interrupted = False
        self.received = 0
        self.superseded = 0

    def push(self, value) -> None:
        """Hand a value in (any thread). Raises ``ValueError`` for a value of another shape, a float value
        that is not finite, or after :meth:`close`."""
        v = torch.as_tensor(value, dtype=self.spec.dtype)
        if tuple(v.shape) != tuple(self.spec.shape):
            raise ValueError(f"{self.name}: expected a value of shape {list(self.spec.shape)}, got {list(v.shape)}")
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise ValueError(f"{self.name}: the value has NaN or infinite entries")
        with self._cv:
            if self._closed:
                raise ValueError(f"{self.name}: push after close")
            if self._pending is not None:
                self.superseded += 1
            self._pending = v.clone()
            self.received += 1
            self._cv.notify_all()

    def close(self) -> None:
        """No more values: the source ends once the pending one is out."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def interrupt(self) -> None:
        with self._cv:
            self._interrupted = True
            self._cv.notify_all()

    def setup(self, ctx):
        super().setup(ctx)
        self._interrupted = False

    def process(self, inputs, out):
        with self._cv:
            while self._pending is None and not self._closed and not self._interrupted:
                self._cv.wait()
            if self._pending is None or self._interrupted:
                raise EndOfStream
            value, self._pending = self._pending, None
        frame = out.write("value")  # outside the lock: it may wait on backpressure
        frame.data.copy_(value)
        frame.pts = self.ctx.clock.now_ticks()
