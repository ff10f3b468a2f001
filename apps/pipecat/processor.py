"""``FramegraphAvatar``: a framegraph avatar as a Pipecat frame processor, between the TTS and the transport.

    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts,
                         FramegraphAvatar("assets/avatars/astronaut", runtime="onnx"),
                         transport.output(), assistant_agg])

It is a thin layer over :class:`~framegraph.apps.avatar_session.AvatarSession`:

- ``TTSAudioRawFrame`` → ``push_audio``.
  The frame is consumed: the speech leaves again with its pictures.
  Audio is taken at most ``AHEAD_S`` ahead of what is heard.
  A reply sent at once waits in the processor's queue.
  There is one segment per TTS context, ``context_id``, split on ``TTSStartedFrame`` and ``TTSStoppedFrame``.
  The started and stopped frames are held.
  They are pushed on when the segment's first audio leaves, and after its last audio leaves.
  So the transport's "bot speaking" follows what is heard.
- out: ``OutputImageRawFrame`` at the output fps, always. Between utterances it shows the idle or listening face.
  Also ``TTSAudioRawFrame`` with the speech.
  Both are stamped from the session's one audio clock. ``pts`` is in ns on the pipeline's clock.
  They are pushed in presentation order: an image, then the audio of its frame period.
  Each carries ``metadata["framegraph"]``: session pts in 48 kHz ticks, speech or not, and more.
- ``InterruptionFrame`` → ``clear``. Queued speech is dropped. The next picture is the face at rest.
- ``UserStartedSpeakingFrame`` and ``UserStoppedSpeakingFrame`` turn the listening face on and off.
- ``StartFrame`` starts the graph.
  ``EndFrame`` lets queued speech play out, then ends it.
  ``CancelFrame`` and ``cleanup`` stop it at once. No thread is left.
  Other frames pass through untouched.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time

from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from framegraph.apps.avatar_session import AudioOut, AvatarSession, SegmentEvent, VideoOut

AHEAD_S = 0.5  # TTS audio is taken in at most this far ahead of what is heard; the rest waits in Pipecat's queue
AHEAD_POLL_S = 0.02
END_GRACE_S = 10.0  # EndFrame: the graph may take this long beyond the queued speech to finish
CANCEL_WAIT_S = 10.0


async def _in_thread(fn, *args):
    """Run ``fn(*args)`` in a one-shot thread and await its result. The thread ends with the call."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(result, error) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(result)

    def run():
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed while the call ran
            pass

    thread = threading.Thread(target=run, daemon=True, name="framegraph-pipecat-call")
    thread.start()
    try:
        return await done
    finally:
        thread.join()  # it has handed its result over: it ends now


class FramegraphAvatar(FrameProcessor):
    """A framegraph avatar bundle, of portrait or video kind, speaking the TTS audio. See the module docstring.

    Args:
        bundle: the bundle folder. It is loaded once per process. An error here names what is missing.
        runtime: ``"torch"``, ``"onnx"`` or ``"onnx-int8"``. See :mod:`framegraph.models.runtime`.
            ONNX Runtime reads the export made by ``framegraph export --avatar BUNDLE``.
            It is in ``onnx_dir`` or ``BUNDLE/onnx``. int8 is for portrait bundles.
        fps: output frames per second. The default is the avatar's.
            Set the transport's ``video_out_framerate`` to it.
            The processor's ``width``, ``height`` and ``fps`` are what to give the transport.
        steps: sampler steps of a portrait bundle. The default is the bundle's.
        start_buffer_ms: an utterance starts once this much of it has arrived, or it ended.
        video_delay_ms: each image is pushed this long after the audio of its time.
            The default 0 pushes them together.
            Some transports bring audio to the viewer later than video.
            WebRTC to a browser does, through its audio jitter buffer.
            The viewer then sees lips before their sound. This moves the pictures back to the sound.
    """

    def __init__(self, bundle, *, runtime: str = "torch", onnx_dir: str | None = None, fps: float | None = None,
                 steps: int | None = None, start_buffer_ms: float = 40.0, video_delay_ms: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self._session = AvatarSession(bundle, runtime=runtime, onnx_dir=onnx_dir, fps=fps, steps=steps,
                                      start_buffer_ms=start_buffer_ms, video_delay_ms=video_delay_ms,
                                      on_ready=self._wake, name=self.name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._pump_task: asyncio.Task | None = None
        self._epoch = 0  # bumped by each barge-in: a batch taken before it is not pushed
        self._pushing = asyncio.Lock()  # one picture or sound goes out at a time; a barge-in waits for it
        self._held: dict[tuple[str, object], Frame] = {}  # ("started" | "ended", segment) → its TTS frame
        self._segment = None  # the segment TTS audio goes to now
        self._auto = itertools.count(1)
        self._clock_offset_ns = 0  # monotonic ns − the pipeline clock's ns

    @property
    def width(self) -> int:
        return self._session.width

    @property
    def height(self) -> int:
        return self._session.height

    @property
    def fps(self) -> float:
        return self._session.fps

    @property
    def session(self) -> AvatarSession:
        return self._session

    # ---- frames in ---------------------------------------------------------------------------------------
    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if direction != FrameDirection.DOWNSTREAM:
            await self.push_frame(frame, direction)
        elif isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            await self._start()
        elif isinstance(frame, TTSAudioRawFrame):
            await self._on_tts_audio(frame)
        elif isinstance(frame, TTSStartedFrame):
            self._segment = frame.context_id if frame.context_id is not None else f"segment-{next(self._auto)}"
            self._held[("started", self._segment)] = frame
        elif isinstance(frame, TTSStoppedFrame):
            await self._on_tts_stopped(frame)
        elif isinstance(frame, InterruptionFrame):
            self._interrupt()
            # nothing of ours may follow the interruption: a picture or sound being pushed when it came is let go
            # first. Then the next processor gets a turn to take it from its input queue into its process queue,
            # where the interruption drops it; a system frame overtakes what still waits in the input queue.
            async with self._pushing:
                await asyncio.sleep(0)
                await self.push_frame(frame, direction)
        elif isinstance(frame, (UserStartedSpeakingFrame, UserStoppedSpeakingFrame)):
            self._session.set_listening(isinstance(frame, UserStartedSpeakingFrame))
            await self.push_frame(frame, direction)
        elif isinstance(frame, (EndFrame, CancelFrame)):
            await self._stop(drain=isinstance(frame, EndFrame))
            await self.push_frame(frame, direction)
        else:
            await self.push_frame(frame, direction)

    async def _on_tts_audio(self, frame: TTSAudioRawFrame) -> None:
        if frame.context_id is not None and frame.context_id != self._segment:
            self._segment = frame.context_id
        elif self._segment is None:
            self._segment = f"segment-{next(self._auto)}"
        if not self._session.running:
            why = self._session.failure or "the pipeline has not started (no StartFrame yet)"
            await self.push_error(f"{self}: TTS audio dropped: {why}")
            return
        try:
            self._session.push_audio(frame.audio, frame.sample_rate, channels=frame.num_channels,
                                     segment=self._segment)
        except ValueError as exc:  # a rate / layout the avatar cannot take: this frame is dropped, not the bot
            await self.push_error(f"{self}: {frame}: {exc}")
        # a TTS may send a whole reply at once: past AHEAD_S queued, the next frame is taken when the speech before
        # it is heard (taken back to back, they would hold the interpreter and stall the graph's threads); the rest
        # waits in this processor's queue, where a barge-in drops it
        await asyncio.sleep(0)
        while self._session.running and self._session.queued_speech_s > AHEAD_S:
            await asyncio.sleep(AHEAD_POLL_S)

    async def _on_tts_stopped(self, frame: TTSStoppedFrame) -> None:
        key = frame.context_id if frame.context_id is not None else self._segment
        self._segment = None
        if key is not None and self._session.running and self._session.end_segment(key):
            self._held[("ended", key)] = frame  # pushed after the segment's last audio
            return
        started = self._held.pop(("started", key), None)
        if started is not None:
            await self.push_frame(started)
        await self.push_frame(frame)

    def _interrupt(self) -> None:
        self._epoch += 1
        self._session.clear()
        self._held.clear()
        self._segment = None

    # ---- life cycle --------------------------------------------------------------------------------------
    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._clock_offset_ns = time.monotonic_ns() - self.get_clock().get_time()
        try:
            await _in_thread(self._session.start)
        except Exception as exc:  # noqa: BLE001 - the pipeline decides what an unusable processor means
            await self.push_error(f"{self}: the avatar could not start: {exc}", exception=exc,
                                  force_treat_as_permanent=True)
            return
        self._pump_task = self.create_task(self._pump())

    async def _stop(self, drain: bool) -> None:
        s = self._session
        if s.graph is None or not s.running:
            await self._stop_pump(drain)
            return
        if drain:
            s.close()
            try:
                await _in_thread(s.join, s.queued_speech_s + END_GRACE_S)
            except TimeoutError:
                logger.warning(f"{self}: the avatar did not finish its queued speech in time; cancelled")
                s.cancel()
        else:
            s.cancel()
        try:
            await _in_thread(s.join, CANCEL_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - a stage error at the end is reported, the pipeline ends anyway
            await self.push_error(f"{self}: the avatar graph ended with an error: {exc}")
        await self._stop_pump(drain)

    async def _stop_pump(self, drain: bool) -> None:
        if self._pump_task is not None:
            await self.cancel_task(self._pump_task)
            self._pump_task = None
        if drain:
            await self._push_items(self._session.take())

    async def cleanup(self):
        await super().cleanup()
        if self._session.running:
            self._session.cancel()
            try:
                await _in_thread(self._session.join, CANCEL_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - tearing down: said, not raised
                logger.warning(f"{self}: the avatar graph ended with an error: {exc}")
        if self._pump_task is not None:
            await self.cancel_task(self._pump_task)
            self._pump_task = None

    # ---- frames out --------------------------------------------------------------------------------------
    def _wake(self) -> None:
        """From the graph's thread: items wait."""
        loop, ready = self._loop, self._ready
        if loop is not None and ready is not None:
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

    async def _pump(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            await self._push_items(self._session.take())

    async def _push_items(self, items: list) -> None:
        epoch = self._epoch
        for item in items:
            async with self._pushing:
                if self._epoch != epoch:
                    return  # a barge-in came while this batch was going out: the session has the rest
                if isinstance(item, VideoOut):
                    await self.push_frame(self._image_frame(item))
                elif isinstance(item, AudioOut):
                    await self.push_frame(self._audio_frame(item))
                elif isinstance(item, SegmentEvent):
                    held = self._held.pop((item.kind, item.segment), None)
                    if held is not None:
                        await self.push_frame(held)

    def _pts_ns(self, ticks: int) -> int:
        """Session pts in 48 kHz ticks → ns on the pipeline's clock."""
        graph = self._session.graph
        return graph.clock.deadline_ns(ticks) - self._clock_offset_ns

    def _image_frame(self, v: VideoOut) -> OutputImageRawFrame:
        frame = OutputImageRawFrame(image=v.picture.tobytes(), size=(self.width, self.height), format="RGB")
        frame.pts = self._pts_ns(v.pts)
        frame.metadata["framegraph"] = {"pts_ticks": v.pts, "speech": v.speech, "rest": v.rest,
                                        "source_pts_ticks": v.source_pts, "capture_ns": v.capture_ns,
                                        "arrival_ns": v.arrival_ns}
        return frame

    def _audio_frame(self, a: AudioOut) -> TTSAudioRawFrame:
        frame = TTSAudioRawFrame(audio=a.samples.tobytes(), sample_rate=a.sample_rate, num_channels=1,
                                 context_id=a.segment if isinstance(a.segment, str) else None)
        frame.pts = self._pts_ns(a.pts)
        frame.metadata["framegraph"] = {"pts_ticks": a.pts, "arrival_ns": a.arrival_ns}
        return frame
