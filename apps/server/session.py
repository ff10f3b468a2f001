"""Session: one client connection, one pipeline graph, from ``start`` to ``ended``.

The session is transport-neutral. It talks to its client through a :class:`~.transport.Transport`.
That is a WebSocket, :class:`~.transport.WebSocketTransport`, or a WebRTC peer, ``webrtc.WebRtcTransport``.
Two coroutines run per connection:

- The **receiver** checks and dispatches what the client sends: control JSON, PCM audio.
  It never waits on the client's reading.
- The **sender** drains the session's :class:`~.outbox.Outbox` into the transport.
  The outbox holds media from the graph's sink and control messages.

So a slow reader stalls only the sender, and the outbox drops what does not fit.

Every refusal is an ``error`` message with a stable code. Most do not end the session.
The exceptions are ``timeout`` (no ``start``), ``pipeline_failed`` and too many errors in a row.
After too many errors nothing more is read, and the connection closes with code 1008.
When the connection goes, for any reason, the graph is cancelled and joined before the handler returns.
No session outlives its socket, and no thread outlives its session.
A session frees its ``max_sessions`` slot when its graph has stopped, before the close handshake.
No close waits on a client longer than the close timeout.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING

from framegraph.stream import StageError
from framegraph.stream.media import H264Encoder

from . import pipelines
from .limits import TokenBucket
from .outbox import AUDIO, CONTROL, END, VIDEO, Item, Outbox
from .protocol import (
    HEADER_BYTES,
    PROTOCOL_VERSION,
    ErrorCode,
    Kind,
    MediaFlag,
    ProtocolError,
    parse_control,
    parse_media,
)
from .stages import CaptureTimes
from .transport import Transport, TransportClosed, WebSocketTransport

if TYPE_CHECKING:  # pragma: no cover
    from .app import StreamServer

log = logging.getLogger("framegraph.server")


class Session:
    """State of one connection.

    ``await Session(server, ws).run()`` is the whole connection handler.
    ``ws`` is a websockets connection or any :class:`~.transport.Transport`.
    """

    def __init__(self, server: StreamServer, ws):
        self.server = server
        self.transport: Transport = ws if hasattr(ws, "send_media") else WebSocketTransport(ws)
        self.config = server.config
        self.id = secrets.token_hex(6)
        self.loop = asyncio.get_running_loop()
        self.pipeline: pipelines.Pipeline | None = None
        self.pipeline_name: str | None = None
        self.outbox = Outbox(self.loop, video=self.config.outbox_video, audio=self.config.outbox_audio,
                             control=self.config.outbox_control)
        self.capture_times = CaptureTimes()
        self.state = "new"  # new → running → stopping → ended
        self.end_reason: str | None = None
        self.opened_ns = time.monotonic_ns()
        self.started_ns = 0
        self.stats_interval_s = self.config.stats_interval_s
        self.bucket = TokenBucket(self.config.max_messages_per_s, max(1.0, self.config.max_messages_per_s))
        self.errors_in_a_row = 0
        self.counters = {"messages_in": 0, "bytes_in": 0, "audio_samples_in": 0, "poses_in": 0, "video_in": 0,
                         "video_dropped": 0, "errors": 0, "rate_limited": 0, "bytes_out": 0}
        self.sent = {VIDEO: 0, AUDIO: 0, CONTROL: 0}
        self.first_video_ns = self.last_video_ns = 0
        self.video_sent_ns: collections.deque[int] = collections.deque(maxlen=256)  # when the last frames went out
        self._last_rate_error = 0.0
        self._receiver: asyncio.Task | None = None
        self._sender: asyncio.Task | None = None
        self._stats: asyncio.Task | None = None
        self._close_code: tuple[int, str] | None = None  # set when the session itself closes the connection

    # ---- life cycle -----------------------------------------------------------------------------
    async def run(self) -> None:
        self._receiver = asyncio.current_task()
        self._sender = asyncio.create_task(self._send_loop(), name=f"session {self.id} sender")
        try:
            await self._receive_loop()
        except TransportClosed:
            pass
        finally:
            if self.end_reason is None:
                self.end_reason = "disconnected"
            await self.close()

    async def close(self) -> None:
        """Free everything.

        It stops the graph off the event loop, with cancel and join. Then it stops the tasks and frees the slot.
        If the session itself is closing, after too many errors, it then sends what is queued.
        Those are the errors. The close handshake follows.
        """
        if self._stats is not None:
            self._stats.cancel()
        if self.pipeline is not None:
            graph = self.pipeline.graph
            graph.cancel()
            try:
                await asyncio.to_thread(graph.join, 10.0)
                self.pipeline.closed()
            except StageError:
                self.pipeline.closed()  # it failed, and it has stopped
            except TimeoutError:  # what it borrowed stays with it: a graph still running may use it
                log.error("session %s: graph did not stop within 10 s", self.id)
        self.outbox.end()
        self.state = "ended"
        self.server.release(self)
        if self._close_code is not None:
            await self._close_socket(*self._close_code)
        if self._sender is not None and self._sender is not asyncio.current_task():
            self._sender.cancel()

    async def _close_socket(self, code: int, reason: str, last: list[dict] | None = None) -> None:
        """Send the control messages ``last``, then the close handshake with ``code``.

        This happens after the sender has sent what is queued, once the outbox has ended.
        A client that does not read has full buffers, so even the close frame cannot go out.
        It is given the connection's close timeout. Then the connection is cut.
        """
        sender = self._sender
        discard = None
        if asyncio.current_task() is self._receiver:  # the receive loop is over: nobody reads
            discard = asyncio.create_task(self._discard_incoming(), name=f"session {self.id} discard")
        try:
            async with asyncio.timeout(self.transport.close_timeout):
                if sender is not None and sender is not asyncio.current_task():
                    await asyncio.wait([sender])
                for msg in last or ():
                    await self.transport.send_text(json.dumps(msg))
                await self.transport.close(code, reason)
        except TransportClosed:
            pass
        except TimeoutError:
            log.info("session %s: client did not take the close within %g s; connection cut", self.id,
                     self.transport.close_timeout)
            self.transport.abort()
        finally:
            if discard is not None:
                discard.cancel()

    async def _discard_incoming(self) -> None:
        """Read and drop whatever the client still sends, so its side of the close handshake is seen.

        Unread messages would fill the receive queue and stop the connection reading.
        """
        try:
            while True:
                await self.transport.recv()
        except TransportClosed:
            pass

    # ---- receiving ------------------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        deadline = self.loop.time() + self.config.start_timeout_s
        while self.state != "ended":
            try:
                if self.state == "new":
                    async with asyncio.timeout_at(deadline):
                        message = await self.transport.recv()
                else:
                    message = await self.transport.recv()
            except TimeoutError:
                self.send_error(ProtocolError(ErrorCode.TIMEOUT, f"no \"start\" within "
                                                                 f"{self.config.start_timeout_s:g} s"))
                await self._finish("timeout")
                return
            await self._handle(message)
            if self.errors_in_a_row >= self.config.max_errors:  # a client gone wrong: read nothing more
                log.warning("session %s: %d protocol errors in a row; closing (1008)", self.id,
                            self.errors_in_a_row)
                self.end_reason = self.end_reason or "protocol_errors"
                self._close_code = (1008, "too many protocol errors")
                return

    async def _handle(self, message) -> None:
        self.counters["messages_in"] += 1
        self.counters["bytes_in"] += len(message)
        if not self.bucket.take():
            self.counters["rate_limited"] += 1
            now = time.monotonic()
            if now - self._last_rate_error >= 1.0:  # one error per second, not one per message
                self._last_rate_error = now
                self.send_error(ProtocolError(ErrorCode.RATE_LIMITED, f"more than "
                                              f"{self.config.max_messages_per_s:g} messages/s; dropped "
                                              f"{self.counters['rate_limited']} so far"))
            return
        try:
            if len(message) > self.config.max_message_bytes:
                raise ProtocolError(ErrorCode.TOO_LARGE, f"message of {len(message)} bytes exceeds the limit of "
                                                         f"{self.config.max_message_bytes} bytes")
            if isinstance(message, str):
                await self._on_control(parse_control(message))
            else:
                self._on_media(message)
            self.errors_in_a_row = 0
        except Exception as exc:  # noqa: BLE001 - a client must never take the server down
            if not isinstance(exc, ProtocolError):
                log.exception("session %s: internal error handling a message", self.id)
                exc = ProtocolError(ErrorCode.INTERNAL, f"the server failed handling this message "
                                                        f"({type(exc).__name__}); its log has the details")
            self.send_error(exc)
            self.errors_in_a_row += 1

    async def _on_control(self, msg: dict) -> None:
        kind = msg["type"]
        if kind == "ping":
            self.send_control({"type": "pong", "id": msg.get("id"), "server_ns": time.monotonic_ns()})
        elif kind == "start":
            await self._start(msg["pipeline"], msg.get("options"))
        elif kind == "stop":
            if self.state == "new":
                await self._finish("stopped")
            elif self.state == "running":
                self.state = "stopping"
                self.pipeline.stop()
        else:
            pipeline = self._require_running(kind)
            if kind == "interrupt":
                pipeline.graph.reset()
                self.outbox.clear_media()
                pipeline.sink.mark_interrupted()
            elif kind == "pose":
                if pipeline.pose_in is None:
                    raise ProtocolError(ErrorCode.UNSUPPORTED, f"pipeline {self.pipeline_name!r} takes no "
                                                               f"camera pose")
                pipeline.pose_in.push(msg["matrix"])
                self.counters["poses_in"] += 1
            elif kind == "config":
                applied = pipeline.apply_config(msg["options"])
                if "stats_interval_ms" in applied:
                    self.stats_interval_s = applied["stats_interval_ms"] / 1000
                self.send_control({"type": "config", "applied": applied})

    def _require_running(self, what: str) -> pipelines.Pipeline:
        if self.state != "running":
            hint = "send \"start\" first" if self.state == "new" else "the session is stopping"
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"{what!r} while the session is {self.state}: {hint}")
        return self.pipeline

    async def _start(self, name: str, options: dict | None) -> None:
        if self.state != "new":
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"\"start\" while the session is {self.state}; one "
                                                        f"pipeline per connection")
        try:
            pipeline = pipelines.build(name, options, self.config.batching)  # ProtocolError: bad name, option, full
        except ProtocolError as exc:
            if exc.code != ErrorCode.FULL:
                raise
            # the model has no room now: the session ends; the client goes to ``url`` (a cluster's other replica)
            # or retries later
            url = await self.server.elsewhere(self.transport.request)
            self.send_error(exc, **({} if url is None else {"url": url}))
            await self._finish("full")
            return
        await self.launch(name, pipeline)

    async def launch(self, name: str, pipeline: pipelines.Pipeline) -> None:
        """Start a built pipeline and queue ``ready``.

        The pipeline comes from ``start``, or from a WebRTC offer that named it.
        A stage failing to start is ``pipeline_failed`` and ends the session.
        """
        pipeline.sink.attach(self.outbox, self.capture_times if pipeline.audio_in is not None else None)
        self.outbox.reserve(VIDEO, pipeline.video_burst)  # a generate chunk's frames come at once: none dropped
        if isinstance(pipeline.encoder, H264Encoder):
            self.outbox.on_keyframe_needed = pipeline.encoder.request_keyframe
        self.pipeline, self.pipeline_name = pipeline, name
        self.outbox.hold_media(True)  # the first frames may come before "ready" is queued: they wait
        try:
            await asyncio.to_thread(pipeline.graph.start)
        except StageError as exc:
            self.outbox.hold_media(False)
            self.send_error(ProtocolError(ErrorCode.PIPELINE_FAILED, str(exc)))
            await self._finish("failed")
            return
        self.state = "running"
        self.started_ns = time.monotonic_ns()
        video_in = pipeline.video_in
        if video_in is not None:  # a camera picture is one message: the server's message limit caps it
            video_in.max_bytes = min(video_in.max_bytes, self.config.max_message_bytes - HEADER_BYTES)
        self.send_control({"type": "ready", "session": self.id, "protocol": PROTOCOL_VERSION,
                           "ticks_per_second": 48_000, "header_bytes": HEADER_BYTES, **pipeline.format,
                           "video_in": None if video_in is None else video_in.describe()}, front=True)
        self.outbox.hold_media(False)
        self._stats = asyncio.create_task(self._stats_loop(), name=f"session {self.id} stats")

    def _on_media(self, data: bytes) -> None:
        header, payload = parse_media(data)
        if header.kind == Kind.JPEG:
            self._on_camera(payload)
            return
        pipeline = self._require_running("audio")
        if pipeline.audio_in is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"pipeline {self.pipeline_name!r} takes no audio")
        if header.kind != Kind.PCM16:
            raise ProtocolError(ErrorCode.BAD_BINARY, f"client media must be PCM16 (kind {int(Kind.PCM16)}) or a "
                                                      f"camera JPEG (kind {int(Kind.JPEG)}); got kind "
                                                      f"{int(header.kind)}")
        if len(payload) % 2:
            raise ProtocolError(ErrorCode.BAD_BINARY, f"PCM16 payload of {len(payload)} bytes is not a whole "
                                                      f"number of samples")
        n = pipeline.audio_in.push(bytes(payload))
        self.capture_times.add(n, header.capture_ns)
        self.counters["audio_samples_in"] += n

    def _on_camera(self, payload: memoryview) -> None:
        """A camera JPEG for a pipeline with ``video_in``. The refusals are ``camera.CameraInput``'s."""
        pipeline = self._require_running("camera picture")
        if pipeline.video_in is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"pipeline {self.pipeline_name!r} takes no camera pictures "
                                                       f"(ready.video_in is null)")
        try:
            pushed = pipeline.video_in.push_jpeg(bytes(payload))
        except ProtocolError as exc:
            if exc.code == ErrorCode.RATE_LIMITED:
                self.counters["video_dropped"] += 1
            raise
        if pushed:
            self.counters["video_in"] += 1
        else:
            self.counters["video_dropped"] += 1

    # ---- sending --------------------------------------------------------------------------------
    def send_control(self, msg: dict, front: bool = False) -> None:
        self.outbox.offer(Item(CONTROL, msg, replace_key="stats" if msg["type"] == "stats" else None),
                          front=front)

    def send_error(self, exc: ProtocolError, **extra) -> None:
        self.counters["errors"] += 1
        self.server.count_error(exc.code)
        self.send_control(exc.to_message(**extra))

    async def _send_loop(self) -> None:
        """The only writer of media: outbox → socket, until the outbox ends."""
        try:
            while True:
                item = await self.outbox.get()
                if item.kind == END:
                    break
                if item.kind == CONTROL:
                    await self.transport.send_text(json.dumps(item.payload))
                    self.sent[CONTROL] += 1
                    continue
                h = item.header
                h.send_wait_us = (time.monotonic_ns() - item.queued_ns) // 1000
                if self.outbox.take_discontinuity(item.kind):
                    h.flags |= MediaFlag.DISCONTINUITY
                h.payload_len = len(item.payload)
                self.counters["bytes_out"] += await self.transport.send_media(item)
                self.sent[item.kind] += 1
                if item.kind == VIDEO:
                    self.last_video_ns = time.monotonic_ns()
                    self.first_video_ns = self.first_video_ns or self.last_video_ns
                    self.video_sent_ns.append(self.last_video_ns)
        except TransportClosed:
            return
        if self.end_reason is None:  # the graph ended by itself (end of stream, stop, or failure)
            await self._finish("stopped" if self.state == "stopping" else "finished")

    async def _finish(self, reason: str) -> None:
        """End the session in order, then close the connection with code 1000.

        First everything queued is sent. Then come a pipeline failure, if any, the final ``stats`` and ``ended``.
        """
        if self.end_reason is not None:
            return
        self.end_reason = reason
        graph_error = None
        if self.pipeline is not None:
            try:
                await asyncio.to_thread(self.pipeline.graph.join, 10.0)
            except StageError as exc:
                graph_error, self.end_reason = exc, "failed"
            except TimeoutError:
                log.error("session %s: graph did not finish within 10 s", self.id)
        if self._stats is not None:
            self._stats.cancel()
        self.outbox.end()
        sender = self._sender
        if sender is not None and sender is not asyncio.current_task():
            try:  # let it flush what is queued (a client that does not read gets 2 s)
                await asyncio.wait_for(asyncio.shield(sender), 2.0)
            except (TimeoutError, TransportClosed):
                sender.cancel()
        messages = []
        if graph_error is not None:
            messages.append(ProtocolError(ErrorCode.PIPELINE_FAILED, str(graph_error)).to_message())
            self.server.count_error(ErrorCode.PIPELINE_FAILED)
        if self.pipeline is not None:
            messages.append(self.stats())
        messages.append({"type": "ended", "session": self.id, "reason": self.end_reason})
        self.server.release(self)  # the graph is done: free the slot before the close handshake
        await self._close_socket(1000, self.end_reason, messages)
        self.state = "ended"

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.stats_interval_s)
            self.send_control(self.stats())

    def stats(self) -> dict:
        """The ``stats`` message: what was sent and dropped, latency and stage timings so far."""
        report = self.pipeline.graph.report() if self.pipeline is not None else {}
        span = (self.last_video_ns - self.first_video_ns) / 1e9
        stages = {name: {"fps": round(s["fps"], 2), "frames": s["frames"], "work_ms": _latency_ms(s["work"]),
                         "output_wait_ms": _wait_ms(s["output_wait"]), "input_wait_ms": _wait_ms(s["input_wait"]),
                         "deadline_misses": s["deadline_misses"], "fallback_level": s["fallback_level"]}
                  for name, s in report.get("stages", {}).items()}
        audio_in = self.pipeline.audio_in if self.pipeline is not None else None
        video_in = self.pipeline.video_in if self.pipeline is not None else None
        return {
            "type": "stats", "session": self.id, "pipeline": self.pipeline_name, "state": self.state,
            "uptime_s": round((time.monotonic_ns() - self.opened_ns) / 1e9, 3),
            "sent": dict(self.sent), "bytes_out": self.counters["bytes_out"],
            "fps": round((self.sent[VIDEO] - 1) / span, 2) if span > 0 else 0.0,
            "dropped": {"video": self.outbox.dropped[VIDEO], "audio": self.outbox.dropped[AUDIO],
                        "control": self.outbox.dropped[CONTROL],
                        "source": sum(s["dropped_in_flight_limit"] for s in report.get("sources", {}).values()),
                        "edges": sum(e["drops"] for e in report.get("edges", [])),
                        "input_overflow_samples": audio_in.overflow_samples if audio_in is not None else 0,
                        "input_replaced_pictures": video_in.source.superseded if video_in is not None else 0},
            "outbox_depth": self.outbox.depth,
            "time_to_first_frame_ms": report.get("time_to_first_frame_ms"),
            "end_to_end_ms": _latency_ms(report.get("end_to_end", {})),
            "av_offset_ms": _latency_ms(report.get("av_offset", {})),
            "stages": stages,
            "received": {k: self.counters[k] for k in ("messages_in", "audio_samples_in", "poses_in", "video_in",
                                                       "video_dropped", "errors", "rate_limited")},
            "warnings": [w for w in (self._slow_warning(),) if w],
        }

    def recent_fps(self, window_s: float = 3.0) -> float:
        """Video frames sent per second over the last ``window_s``."""
        now = time.monotonic_ns()
        return sum(1 for t in self.video_sent_ns if now - t <= window_s * 1e9) / window_s

    def _slow_warning(self, window_s: float = 3.0) -> str | None:
        """A sentence when the server cannot keep up, else None.

        It is given when the video of the last ``window_s`` went out at under half the fps the session asked for.
        Frames are then being dropped.
        None also before ``window_s`` of running.
        """
        asked = ((self.pipeline.format or {}).get("video") or {}).get("fps") if self.pipeline is not None else None
        now = time.monotonic_ns()
        if not asked or self.state != "running" or not self.started_ns or now - self.started_ns < window_s * 1e9:
            return None
        fps = self.recent_fps(window_s)
        if fps >= asked / 2:
            return None
        return (f"video at {fps:.2g} fps over the last {window_s:g} s, under half the {asked:g} fps asked: this "
                f"server cannot keep up and drops frames; a smaller size or a lower fps would keep up")


def _latency_ms(summary: dict) -> dict:
    """A :class:`~framegraph.stream.telemetry.LatencyWindow` summary as the ``stats`` message's latency dict.

    The keys are ``{"p50", "p95", "p99", "mean", "max"}``, rounded to the µs.
    The percentiles are already computed in the summary.
    """
    return {k.removesuffix("_ms"): round(v, 3) for k, v in summary.items() if k.endswith("_ms")}


def _wait_ms(summary: dict | None) -> dict | None:
    """A stage's wait summary as ``{"p50", "p95", "p99", "mean", "max", "total_s"}``. None: no such side."""
    return None if summary is None else {**_latency_ms(summary), "total_s": round(summary["total_s"], 3)}
