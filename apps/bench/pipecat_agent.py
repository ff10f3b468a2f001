"""A Pipecat agent's avatar path, run in process and measured. ``bench pipecat`` and the Pipecat tests use it.

    feeder ──TTSStartedFrame, TTSAudioRawFrame…, TTSStoppedFrame──▶ FramegraphAvatar ──▶ Recorder (sink)

The function :func:`run_agents` runs real Pipecat pipelines: ``PipelineWorker`` on a ``WorkerRunner``. Each is
fed by a script of timed frames. The function :func:`utterance` builds one from real speech. The
:class:`Recorder` at the end keeps every frame with its arrival time. Another, before the avatar, keeps the
frames coming back upstream. Those are errors.

Then :func:`analyse` turns a recording into what a viewer perceives. It gives the frame rate and the stamps. It
gives audio-to-picture sync, and the delay from a TTS frame to its picture. It gives the mouth's openness against
the sound.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
from pipecat.frames.frames import (
    Frame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from framegraph.stream.quality import pearson_by_lag

from .measure import summary_ms

TICKS = 48_000  # session clock ticks per second (pts in the frames' metadata)
FRAME_MS = 20  # a streaming TTS's frame


class Recorder(FrameProcessor):
    """Passes every frame on, keeping ``(monotonic ns, frame)`` of those going ``direction``."""

    def __init__(self, direction: FrameDirection = FrameDirection.DOWNSTREAM, **kwargs):
        super().__init__(**kwargs)
        self.direction = direction
        self.got: list[tuple[int, Frame]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self.got.append((time.monotonic_ns(), frame))
        await self.push_frame(frame, direction)
        await asyncio.sleep(0)  # a burst queued here (a sentence at once) must not hold the loop: it measures


def utterance(samples: np.ndarray, rate: int, context_id: str, frame_ms: int = FRAME_MS) -> list[Frame]:
    """A TTS response as a TTS service pushes it.

    It is started, then ``int16`` ``samples`` at ``rate`` Hz, then stopped. The samples go in ``frame_ms`` audio
    frames."""
    step = rate * frame_ms // 1000
    audio = [TTSAudioRawFrame(audio=samples[i:i + step].tobytes(), sample_rate=rate, num_channels=1,
                              context_id=context_id) for i in range(0, len(samples), step)]
    return [TTSStartedFrame(context_id=context_id), *audio, TTSStoppedFrame(context_id=context_id)]


@dataclass
class Agent:
    """One pipeline: its avatar, the recorders after it (``sink``) and before it (``upstream``)."""

    avatar: FrameProcessor
    sink: Recorder = field(default_factory=Recorder)
    upstream: Recorder = field(default_factory=lambda: Recorder(FrameDirection.UPSTREAM))
    worker: PipelineWorker | None = None
    fed: list[tuple[int, Frame]] = field(default_factory=list)  # (monotonic ns, frame) as queued


async def play(agent: Agent, script: list) -> None:
    """Queue ``script`` into the agent's pipeline. Each entry is one of:

    - a frame;
    - a number: seconds to wait;
    - ``"pictures"``: wait for the avatar's first picture at the sink, so its graph runs;
    - ``("realtime", frames)``: audio frames queued at their own pace. A TTS streaming at real time does that."""
    for step in script:
        if isinstance(step, (int, float)):
            await asyncio.sleep(step)
            continue
        if step == "pictures":
            while not any(isinstance(f, OutputImageRawFrame) for _, f in agent.sink.got):
                await asyncio.sleep(0.01)
            continue
        if isinstance(step, tuple) and step[0] == "realtime":
            t0 = time.monotonic()
            played = 0.0
            for frame in step[1]:
                if isinstance(frame, TTSAudioRawFrame):
                    delay = t0 + played - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    played += frame.num_frames / frame.sample_rate
                agent.fed.append((time.monotonic_ns(), frame))
                await agent.worker.queue_frame(frame)
            continue
        agent.fed.append((time.monotonic_ns(), step))
        await agent.worker.queue_frame(step)


async def run_agents(agents: list[Agent], scripts: list[list], *, audio_out_sample_rate: int = 24_000,
                     timeout_s: float = 120.0) -> None:
    """Run one pipeline per agent on one ``WorkerRunner``, each played its script.

    A pipeline is ``upstream`` recorder → avatar → ``sink`` recorder. A script should end with an ``EndFrame`` or
    a ``CancelFrame``."""
    runner = WorkerRunner(handle_sigint=False)
    for a in agents:
        a.worker = PipelineWorker(Pipeline([a.upstream, a.avatar, a.sink]), enable_rtvi=False,
                                  params=PipelineParams(audio_out_sample_rate=audio_out_sample_rate))
    await runner.add_workers(*[a.worker for a in agents])
    feeders = [asyncio.create_task(play(a, s)) for a, s in zip(agents, scripts, strict=True)]
    try:
        await asyncio.wait_for(runner.run(), timeout_s)
    finally:
        for f in feeders:
            f.cancel()
        await asyncio.gather(*feeders, return_exceptions=True)


def run(agents: list[Agent], scripts: list[list], **kwargs) -> None:
    """:func:`run_agents` on a fresh event loop."""
    asyncio.run(run_agents(agents, scripts, **kwargs))


# ---- what a recording shows ------------------------------------------------------------------------------
@dataclass
class Recording:
    """A sink's frames split: images ``[(arrival ns, frame)]``, audio out, other frames, and their order."""

    images: list
    audio: list
    others: list
    order: list  # every frame, in arrival order


def split(got: list[tuple[int, Frame]]) -> Recording:
    images = [(t, f) for t, f in got if isinstance(f, OutputImageRawFrame)]
    audio = [(t, f) for t, f in got if isinstance(f, TTSAudioRawFrame)]
    others = [(t, f) for t, f in got if not isinstance(f, (OutputImageRawFrame, TTSAudioRawFrame))]
    return Recording(images, audio, others, got)


def pictures(rec: Recording) -> np.ndarray:
    """``uint8 [T, H, W, 3]``: the images' pictures."""
    return np.stack([np.frombuffer(f.image, np.uint8).reshape(f.size[1], f.size[0], 3) for _, f in rec.images])


def stamp_offsets_ms(rec: Recording) -> np.ndarray:
    """Per audio frame out: its pts minus the pts of the last image pushed before it, in ms.

    Each image may be followed by the audio of its own period. The offsets then lie in [0, one frame period)."""
    out, last = [], None
    for _, f in rec.order:
        if isinstance(f, OutputImageRawFrame):
            last = f.pts
        elif isinstance(f, TTSAudioRawFrame) and last is not None:
            out.append((f.pts - last) / 1e6)
    return np.array(out)


def audio_after_image(rec: Recording) -> dict:
    """Per audio frame out, against the image of its frame period.

    That image is the one whose pts is the last at or before the audio's. Keys:

    - ``share``: of audio frames that reached the sink with or after that image;
    - ``lead_ms``: the most an audio frame came before its image; 0 when none did;
    - ``late_ms``: the most one came after it;
    - ``frames``."""
    if not rec.images or not rec.audio:
        return {"frames": len(rec.audio), "share": None, "lead_ms": None, "late_ms": None}
    pts = np.array([f.pts for _, f in rec.images], np.int64)
    arrival = np.array([t for t, _ in rec.images], np.int64)
    order = np.argsort(pts, kind="stable")
    pts, arrival = pts[order], arrival[order]
    after, lead, late = 0, 0.0, 0.0
    for t, f in rec.audio:
        k = np.searchsorted(pts, f.pts, side="right") - 1
        if k < 0:
            lead = max(lead, float("inf"))  # no image of its time ever came
            continue
        d = float(t - arrival[k]) / 1e6
        after += d >= 0
        lead, late = max(lead, -d), max(late, d)
    return {"frames": len(rec.audio), "share": after / len(rec.audio), "lead_ms": lead, "late_ms": late}


def image_gap_ms(rec: Recording, after_ns: int = 0) -> float | None:
    """The longest wait between two images reaching the sink, in ms. Only images from ``after_ns`` on count."""
    t = np.array([a for a, _ in rec.images if a >= after_ns], np.int64)
    return float(np.diff(t).max() / 1e6) if len(t) > 1 else None


def audio_rms_per_image(rec: Recording) -> np.ndarray:
    """Per image: the RMS of the audio out over its frame period. It is in int16 units, 0 where no audio falls."""
    if not rec.images:
        return np.zeros(0)
    period = rec.images[1][1].pts - rec.images[0][1].pts if len(rec.images) > 1 else 40_000_000
    starts = np.array([f.pts for _, f in rec.images], np.int64)
    energy, count = np.zeros(len(starts)), np.zeros(len(starts))
    for _, f in rec.audio:
        x = np.frombuffer(f.audio, np.int16).astype(np.float64)
        t = f.pts + np.arange(len(x)) * (1e9 / f.sample_rate)
        k = np.searchsorted(starts, t, side="right") - 1
        ok = (k >= 0) & (t < starts[np.clip(k, 0, None)] + period)
        np.add.at(energy, k[ok], x[ok] ** 2)
        np.add.at(count, k[ok], 1)
    return np.sqrt(energy / np.maximum(count, 1))


def best_lag(openness: np.ndarray, rms: np.ndarray, max_lag: int = 4) -> tuple[int, list[float]]:
    """The lag at which the mouth's openness best follows the sound's loudness, in frames.

    Positive means the mouth after the sound. Also returns the correlation at each lag ``-max_lag..max_lag``."""
    corr = [0.0 if r is None else r for r in pearson_by_lag(openness, rms, max_lag).values()]
    return int(np.argmax(corr)) - max_lag, corr


def analyse(rec: Recording, *, steady_after_s: float = 1.0) -> dict:
    """What the sink saw:

    - ``frames``;
    - ``fps``: images per second of arrival, after ``steady_after_s``;
    - ``unique_fps``: pictures not repeated;
    - ``stamp_offset_ms``: audio pts − its image's pts, as p50 and max;
    - ``latency_ms``: image arrival − arrival of the TTS audio it speaks, for speech images;
    - ``av_push_gap_ms``: each audio frame's arrival − its image's arrival."""
    if len(rec.images) < 2:
        return {"frames": len(rec.images)}
    t = np.array([a for a, _ in rec.images], np.int64)
    keep = t >= t[0] + steady_after_s * 1e9
    ts = t[keep] if keep.sum() > 1 else t
    meta = [f.metadata["framegraph"] for _, f in rec.images]
    src = np.array([m["source_pts_ticks"] for m in meta])[keep if keep.sum() > 1 else slice(None)]
    span = (ts[-1] - ts[0]) / 1e9
    latency = [(a - m["arrival_ns"]) / 1e6 for (a, _), m in zip(rec.images, meta, strict=True) if m["arrival_ns"]]
    gaps, last = [], None
    for a, f in rec.order:
        if isinstance(f, OutputImageRawFrame):
            last = a
        elif isinstance(f, TTSAudioRawFrame) and last is not None:
            gaps.append((a - last) / 1e6)
    stamps = stamp_offsets_ms(rec)
    return {"frames": len(rec.images), "speech_frames": sum(bool(m["speech"]) for m in meta),
            "fps": (len(ts) - 1) / span if span > 0 else None,
            "unique_fps": (len(np.unique(src)) - 1) / span if span > 0 else None,
            "stamp_offset_ms": {"p50": float(np.median(stamps)), "min": float(stamps.min()),
                                "max": float(stamps.max())} if len(stamps) else None,
            "latency_ms": summary_ms(latency), "av_push_gap_ms": summary_ms(gaps)}
