"""Ring: a fixed set of preallocated frames between one producer stage and one consumer stage.

Each edge of a graph is one ring. Its slots are allocated once, when the graph starts. While it runs,
nothing is allocated and nothing queues without bound. The edge's explicit **policy** says what happens when
the producer is faster than the consumer:

``block``
    The producer waits for a free slot. This is backpressure. Nothing is lost. Offline renders use this.
``drop_oldest``
    The producer takes the oldest unread frame's slot. That frame is dropped and counted. For live video.
``drop_newest``
    The new frame is dropped and counted. The unread ones are kept.
``latest``
    A wait-free newest value. The consumer always gets the most recent frame. It re-reads it until a newer
    one arrives, as for camera pose → renderer. Superseded unread frames count as drops.

Slot life cycle: FREE → (producer) WRITING → READY → (consumer) READING → FREE.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Literal, get_args

from .frame import Frame, PortSpec

Policy = Literal["block", "drop_oldest", "drop_newest", "latest"]  # what a full ring does with a new frame
POLICIES: tuple[str, ...] = get_args(Policy)


class RingAborted(Exception):
    """Raised to a producer or consumer waiting on a ring when the graph is cancelled."""


class Ring:
    """Bounded single-producer, single-consumer ring of preallocated :class:`Frame` slots.

    Args:
        spec: what each slot holds.
        capacity: number of slots, 1–8. ``drop_oldest`` uses at least 2: one being written, one waiting
            for the reader. ``latest`` uses at least 3: one written, one ready, one read.
        policy: one of ``block | drop_oldest | drop_newest | latest``.
        n_stages: size of each frame's per-stage timing table.
        name: ``"producer.port -> consumer.port"``, used in errors and telemetry.
    """

    def __init__(self, spec: PortSpec, capacity: int = 2, policy: Policy = "block", n_stages: int = 1,
                 name: str = "ring"):
        if policy not in POLICIES:
            raise ValueError(f"ring {name}: unknown policy {policy!r}; expected one of {POLICIES}")
        if not 1 <= capacity <= 8:
            raise ValueError(f"ring {name}: capacity must be 1..8 slots, got {capacity}")
        if policy == "latest":
            capacity = max(capacity, 3)
        elif policy == "drop_oldest":
            # With one slot the producer would take back every frame the moment it starts writing the
            # next one. It holds the slot while a paced source waits for its pts. So the consumer could
            # lose every race. Hence one slot to write while one waits for the reader.
            capacity = max(capacity, 2)
        self.spec, self.capacity, self.policy, self.name = spec, capacity, policy, name
        self.slots = [Frame(spec, n_stages, i) for i in range(capacity)]
        # drop_newest writes a frame it will drop into this spare slot, so a producer never waits.
        self._spare = Frame(spec, n_stages, capacity) if policy == "drop_newest" else None
        self._free = collections.deque(range(capacity), maxlen=capacity)
        self._ready = collections.deque(maxlen=capacity)
        self._held: int | None = None  # latest: the slot the consumer is (re-)reading
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._doorbell: threading.Condition | None = None
        self._closed = False
        self._aborted = False
        self.on_drop: Callable[[Frame], None] | None = None
        self.frames_in = 0  # published by the producer
        self.frames_out = 0  # taken by the consumer
        self.drops = 0

    # ---- wiring -------------------------------------------------------------------------------
    def attach_consumer(self, doorbell: threading.Condition) -> None:
        """The consumer stage's condition, notified whenever this ring gets a frame or closes."""
        self._doorbell = doorbell

    def _ring_doorbell(self) -> None:
        if self._doorbell is not None:
            with self._doorbell:
                self._doorbell.notify_all()

    # ---- producer side ------------------------------------------------------------------------
    def acquire_write(self) -> Frame:
        """A slot to write the next frame into, its metadata reset. Blocks only under ``block``."""
        with self._lock:
            while True:
                if self._aborted:
                    raise RingAborted(self.name)
                if self._closed:
                    raise RuntimeError(f"ring {self.name}: write after end of stream")
                if self._free:
                    frame = self.slots[self._free.popleft()]
                    break
                if self.policy == "drop_newest":
                    frame = self._spare
                    break
                if self.policy in ("drop_oldest", "latest") and self._ready:
                    frame = self.slots[self._ready.popleft()]
                    self._count_drop(frame)
                    break
                self._space.wait()
        frame.reset_meta()
        return frame

    def publish(self, frame: Frame) -> None:
        """Publish a written frame to the consumer. Under ``drop_newest`` a full ring drops it instead."""
        with self._lock:
            self.frames_in += 1
            if frame is self._spare:
                self._count_drop(frame)
                return
            if self.policy == "latest":
                while self._ready:  # superseded before anyone read them
                    old = self._ready.popleft()
                    self._count_drop(self.slots[old])
                    self._free.append(old)
            self._ready.append(frame.index)
        self._ring_doorbell()

    def cancel_write(self, frame: Frame) -> None:
        """Give back a slot the producer acquired but did not fill."""
        with self._lock:
            if frame is not self._spare:
                self._free.append(frame.index)
                self._space.notify()

    def close(self) -> None:
        """End of stream: the consumer reads what is ready, then sees the ring as finished."""
        with self._lock:
            self._closed = True
        self._ring_doorbell()

    def abort(self) -> None:
        """Wake every waiter with :class:`RingAborted`. Used on graph cancel."""
        with self._lock:
            self._aborted = True
            self._space.notify_all()
        self._ring_doorbell()

    def _count_drop(self, frame: Frame) -> None:
        self.drops += 1
        if self.on_drop is not None:
            self.on_drop(frame)

    # ---- consumer side ------------------------------------------------------------------------
    def has_frame(self) -> bool:
        """True when :meth:`take` would return a frame without waiting."""
        return bool(self._ready) or (self.policy == "latest" and self._held is not None)

    @property
    def finished(self) -> bool:
        """Closed by the producer and nothing left to read."""
        return self._closed and not self._ready

    @property
    def aborted(self) -> bool:
        return self._aborted

    @property
    def depth(self) -> int:
        """Frames ready and unread."""
        return len(self._ready)

    def take(self) -> Frame:
        """The next frame for the consumer: oldest first, or newest under ``latest``.

        Call :meth:`has_frame` first. Release it with :meth:`release` when done.
        """
        with self._lock:
            if self.policy == "latest":
                if self._ready:
                    newest = self._ready.pop()
                    while self._ready:  # older than what we now read
                        old = self._ready.popleft()
                        self._count_drop(self.slots[old])
                        self._free.append(old)
                    if self._held is not None:
                        self._free.append(self._held)
                    self._held = newest
                    self.frames_out += 1
                    self._space.notify()
                return self.slots[self._held]
            self.frames_out += 1
            return self.slots[self._ready.popleft()]

    def release(self, frame: Frame) -> None:
        """The consumer is done with ``frame``. Its slot becomes free. Under ``latest`` it is kept."""
        if self.policy == "latest":
            return
        with self._lock:
            self._free.append(frame.index)
            self._space.notify()

    def __repr__(self) -> str:
        return (f"Ring({self.name!r}, {self.policy}, capacity={self.capacity}, depth={self.depth}, "
                f"drops={self.drops})")
