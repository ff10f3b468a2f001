"""Outbox: the small bounded buffer between a session's graph and its asyncio sender.

The graph runs on worker threads.
Its sink stage calls :meth:`Outbox.offer` with encoded video, audio and control messages.
The session's sender coroutine awaits :meth:`Outbox.get` and writes them to the WebSocket.
A client that reads too slowly never makes anything grow.
Each kind has a fixed capacity. When it is full, the oldest message of that kind is dropped and counted.
Dropping one H.264 access unit would corrupt the frames that reference it.
So after a video drop every following non-key frame is dropped too, until a key frame arrives.
The outbox asks the encoder for one through ``on_keyframe_needed``.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .protocol import Kind

VIDEO, AUDIO, CONTROL, END = "video", "audio", "control", "end"


@dataclass
class Item:
    """One message waiting to be sent.

    For media, ``header`` is the :class:`~.protocol.MediaHeader` and ``payload`` the bytes.
    The header is packed when sent, so the time spent waiting here can be reported.
    For control messages ``payload`` is the dict.
    """

    kind: str
    payload: Any
    header: Any = None
    keyframe: bool = True
    queued_ns: int = field(default_factory=time.monotonic_ns)
    replace_key: str | None = None  # a control message that supersedes an unsent one with this key


class Outbox:
    """Bounded per-kind queue, filled from any thread, drained by one asyncio task.

    Args:
        loop: the session's event loop, the consumer side.
        video / audio / control: capacity per kind, in messages.
        on_keyframe_needed: called after H.264 frames were dropped, from the producer's thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, video: int = 4, audio: int = 25, control: int = 16,
                 on_keyframe_needed: Callable[[], None] | None = None):
        self._loop = loop
        self._caps = {VIDEO: video, AUDIO: audio, CONTROL: control}
        self._items: collections.deque[Item] = collections.deque()
        self._counts = {VIDEO: 0, AUDIO: 0, CONTROL: 0}
        self._lock = threading.Lock()
        self._wakeup = asyncio.Event()
        self._wake_pending = False
        self._ended = False
        self._media_held = False
        self._skip_until_key = False
        self.on_keyframe_needed = on_keyframe_needed
        self.dropped = {VIDEO: 0, AUDIO: 0, CONTROL: 0}
        self.offered = {VIDEO: 0, AUDIO: 0, CONTROL: 0}
        self.discontinuity = {VIDEO: False, AUDIO: False}

    # ---- producer side (any thread) ----------------------------------------------------------
    def offer(self, item: Item, front: bool = False) -> bool:
        """Queue ``item``. Returns False if it was dropped.

        With ``front`` it goes before everything queued, e.g. ``ready`` ahead of the first media.
        It is dropped when the outbox has ended, or when video waits for a key frame.
        """
        need_key = False
        with self._lock:
            if self._ended:
                return False
            kind = item.kind
            self.offered[kind] += 1
            if kind == VIDEO and self._skip_until_key:
                if not item.keyframe:
                    self.dropped[VIDEO] += 1
                    return False
                self._skip_until_key = False
            if item.replace_key is not None:
                for old in self._items:
                    if old.replace_key == item.replace_key:
                        old.payload, old.queued_ns = item.payload, item.queued_ns
                        return True
            if self._counts[kind] >= self._caps[kind]:
                need_key = self._drop_oldest(kind)
            if front:
                self._items.appendleft(item)
            else:
                self._items.append(item)
            self._counts[kind] += 1
            self._wake()
        if need_key and self.on_keyframe_needed is not None:
            self.on_keyframe_needed()
        return True

    def _drop_oldest(self, kind: str) -> bool:
        """Drop the oldest message of ``kind``, with the lock held.

        For video, also drop the non-key frames that depend on it.
        Returns True if a key frame must be requested.
        """
        victim = next(i for i in self._items if i.kind == kind)
        self._remove(victim)
        if kind in self.discontinuity:
            self.discontinuity[kind] = True
        if kind != VIDEO or victim.header is None or victim.header.kind != Kind.H264:  # JPEG, audio: independent
            return False
        for item in [i for i in self._items if i.kind == VIDEO]:
            if item.keyframe:
                return False  # the chain restarts at a queued key frame
            self._remove(item)
        self._skip_until_key = True
        return True

    def _remove(self, item: Item) -> None:
        self._items.remove(item)
        self._counts[item.kind] -= 1
        self.dropped[item.kind] += 1

    def reserve(self, kind: str, capacity: int) -> None:
        """Hold at least ``capacity`` messages of ``kind``. For a pipeline whose frames come in bursts."""
        with self._lock:
            self._caps[kind] = max(self._caps[kind], capacity)

    def end(self) -> None:
        """No more messages after those queued: the graph finished. Idempotent, any thread."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self._items.append(Item(END, None))
            self._wake()

    def clear_media(self) -> int:
        """Drop every queued video and audio message, for barge-in. Returns how many.

        These are not counted as drops: the client asked for them to go.
        """
        with self._lock:
            keep = [i for i in self._items if i.kind not in (VIDEO, AUDIO)]
            n = len(self._items) - len(keep)
            self._items = collections.deque(keep)
            self._counts[VIDEO] = self._counts[AUDIO] = 0
        return n

    def hold_media(self, held: bool) -> None:
        """While held, :meth:`get` hands out control messages only.

        Media and the end wait, queued and bounded as usual.
        The session holds media while its graph starts.
        So ``ready`` is the first message a client gets.
        """
        with self._lock:
            self._media_held = held
            if not held and self._items:
                self._wake()

    def _wake(self) -> None:
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._wakeup.set)
        except RuntimeError:  # the loop is closed: the session is gone
            pass

    # ---- consumer side (the session's event loop) -------------------------------------------
    async def get(self) -> Item:
        """The next message, oldest first. An ``END`` item comes after the last one.

        While media are held, only control messages come.
        """
        while True:
            with self._lock:
                item = next((i for i in self._items if not self._media_held or i.kind == CONTROL), None)
                if item is not None:
                    self._items.remove(item)
                    if item.kind != END:
                        self._counts[item.kind] -= 1
                    return item
                self._wake_pending = False
                self._wakeup.clear()
            await self._wakeup.wait()

    @property
    def depth(self) -> int:
        return len(self._items)

    def take_discontinuity(self, kind: str) -> bool:
        """True once after messages of ``kind`` were dropped. The sender flags the next one."""
        with self._lock:
            flag = self.discontinuity.get(kind, False)
            if flag:
                self.discontinuity[kind] = False
            return flag
