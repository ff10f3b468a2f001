"""Plan a synthetic talking clip: what is said when, and the face's state on every frame.

A clip is a sequence of segments filling ``seconds``:

- ``idle``: the mouth at rest.
- ``speech``: one sentence from eSpeak NG in a random voice, rate and pitch.
- ``listening``: the mouth closed in a slight smile, with nods.

The segments give the audio track, 16 kHz mono int16, and one :class:`FaceParams` per video frame.
Those hold mouth parameters from the phoneme events, blinks, and a small, smooth head motion; see :mod:`.visemes`.
Everything is drawn from one ``numpy.random.Generator``. So a seed gives the same clip every time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from framegraph.stream.media import SAMPLE_RATE

from .espeak import PhonemeEvent, synthesize
from .render import FaceParams
from .visemes import mouth_curves

VOICES = ("en-us", "en", "en-us+f3", "en+f2", "en-us+m3", "en-gb-x-rp+f4", "en-gb-scotland", "en-029+m2",
          "en-us-nyc+f1")

_SUBJECTS = ["the pilot", "my sister", "a small robot", "our team", "the old captain", "every student",
             "the weather", "this camera", "a quiet voice", "the mission", "your friend", "the blue whale"]
_VERBS = ["checked", "found", "will bring", "always moves", "could see", "wants to build", "is painting",
          "measured", "forgot", "shared", "followed", "might open"]
_OBJECTS = ["the bright orange moon", "seven wooden boxes", "a map of the bay", "three cups of tea",
            "the launch window", "a few quick photos", "the broken fence", "a loud new song",
            "the hidden path", "our morning schedule", "that purple jacket", "the cool ocean breeze"]
_TAILS = ["before noon", "with great care", "again today", "right away", "under the bridge", "at the station",
          "in the spring", "without a word", "for the first time", "by the window"]
_OPENERS = ["Well,", "So,", "Honestly,", "Look,", "Yes,", "Okay,", ""]


def make_sentence(rng: np.random.Generator, max_words: int | None = None) -> str:
    """A random, pronounceable English sentence with varied phonemes."""
    parts = [rng.choice(_OPENERS), rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
    if rng.random() < 0.6:
        parts.append(rng.choice(_TAILS))
    text = " ".join(p for p in parts if p)
    words = text.split()
    if max_words is not None and len(words) > max_words:
        words = words[:max(2, max_words)]
    text = " ".join(words).rstrip(",")
    text = text[0].upper() + text[1:]
    return text + rng.choice([".", ".", "!", "?"])


@dataclass
class Segment:
    """A stretch of the clip. ``kind`` is ``"idle"``, ``"speech"`` or ``"listening"``. Times are in s.

    Speech segments also carry what was said and how.
    """

    kind: str
    start_s: float
    end_s: float
    text: str = ""
    voice: str = ""
    rate_wpm: int = 0
    pitch: int = 0

    def to_json(self) -> dict:
        d = {"kind": self.kind, "start_s": round(self.start_s, 4), "end_s": round(self.end_s, 4)}
        if self.kind == "speech":
            d.update(text=self.text, voice=self.voice, rate_wpm=self.rate_wpm, pitch=self.pitch)
        return d


@dataclass
class ClipPlan:
    """Everything about a clip except its pixels.

    Attributes:
        fps / sample_rate / n_frames: video rate, audio rate in Hz, frame count.
        audio: ``int16 [n_frames · sample_rate / fps]`` mono.
        segments: the clip's :class:`Segment` list, in time order, covering [0, n_frames / fps).
        events: eSpeak phoneme and word events, times in ms from the start of the clip.
        faces: one :class:`FaceParams` per frame.
        states: one of idle / speaking / listening per frame.
    """

    fps: int
    sample_rate: int
    n_frames: int
    audio: np.ndarray
    segments: list[Segment] = field(default_factory=list)
    events: list[PhonemeEvent] = field(default_factory=list)
    faces: list[FaceParams] = field(default_factory=list)
    states: list[str] = field(default_factory=list)

    def ground_truth(self) -> dict:
        """The JSON-ready ground truth: per-frame parameters, segments and events."""
        frames = []
        for i, (f, s) in enumerate(zip(self.faces, self.states)):
            d = f.to_json()
            frames.append({"index": i, "time_s": round(i / self.fps, 4), "state": s, "jaw_open": d["jaw_open"],
                           "lip_width": d["lip_width"], "lip_round": d["lip_round"], "teeth": d["teeth"],
                           "blink": d["blink"], "head": {"dx": d["head_dx"], "dy": d["head_dy"],
                                                         "roll_deg": d["head_roll_deg"], "scale": d["head_scale"]}})
        return {"fps": self.fps, "sample_rate": self.sample_rate, "n_frames": self.n_frames,
                "audio_samples": int(len(self.audio)),
                "segments": [s.to_json() for s in self.segments],
                "events": [e.to_json() for e in self.events], "frames": frames}


def _schedule(rng, total_s: float, fps: int, sample_rate: int):
    """Segments and audio: alternate speech with idle / listening pauses until ``total_s``."""
    audio = np.zeros(int(round(total_s * sample_rate)), np.int16)
    segments, events = [], []
    t = float(rng.uniform(0.15, 0.5))
    segments.append(Segment("idle", 0.0, t))
    while t < total_s - 0.3:
        left = total_s - t
        voice = str(rng.choice(VOICES))
        rate = int(rng.integers(140, 230))
        pitch = int(rng.integers(30, 75))
        speech = None
        for words in (None, 6, 4, 2):  # shorter sentences until one fits
            speech = synthesize(make_sentence(rng, words), voice=voice, rate_wpm=rate, pitch=pitch,
                                sample_rate=sample_rate)
            if speech.duration_ms / 1000 <= left:
                break
        n = min(len(speech.samples), len(audio) - int(round(t * sample_rate)))
        start = int(round(t * sample_rate))
        audio[start:start + n] = speech.samples[:n]
        dur = n / sample_rate
        segments.append(Segment("speech", t, t + dur, speech.text, voice, rate, pitch))
        events += [PhonemeEvent(e.time_ms + 1000 * t, e.kind, e.name, e.text_position)
                   for e in speech.events if e.time_ms < 1000 * dur]
        t += dur
        if t >= total_s - 0.05:
            break
        kind = "listening" if rng.random() < 0.4 else "idle"
        pause = float(rng.uniform(0.6, 1.4) if kind == "listening" else rng.uniform(0.25, 0.7))
        segments.append(Segment(kind, t, min(total_s, t + pause)))
        t += pause
    if segments[-1].end_s < total_s:
        if segments[-1].kind == "speech":
            segments.append(Segment("idle", segments[-1].end_s, total_s))
        else:
            segments[-1].end_s = total_s
    return audio, segments, events


def _blinks(rng, total_s: float, listening_spans) -> list[float]:
    """Blink start times in s: about every 2-5 s, a little more often while listening."""
    times, t = [], float(rng.uniform(0.3, 2.0))
    while t < total_s:
        times.append(t)
        rate = 1.3 if any(a <= t < b for a, b in listening_spans) else 1.0
        t += float(rng.uniform(1.8, 5.0)) / rate
    return times


def _blink_curve(starts, times_s) -> np.ndarray:
    """Lid closure 0..1 at ``times_s``: 70 ms closing, 110 ms opening."""
    out = np.zeros(len(times_s))
    for b in starts:
        d = times_s - b
        close = np.clip(d / 0.07, 0, 1)
        open_ = np.clip(1 - (d - 0.07) / 0.11, 0, 1)
        out = np.maximum(out, np.where(d < 0.07, close, open_) * (d >= 0))
    return out


def _head_motion(rng, times_s, speaking, listening) -> np.ndarray:
    """``[N, 3]``: dx and dy in px, roll in deg.

    They are sums of slow sines, livelier while speaking, with nods while listening.
    """
    out = np.zeros((len(times_s), 3))
    for axis, amp in enumerate((1.2, 0.8, 1.0)):
        for _ in range(3):
            f = rng.uniform(0.08, 0.6)
            out[:, axis] += amp / 3 * np.sin(2 * math.pi * f * times_s + rng.uniform(0, 2 * math.pi))
    energy = 0.6 + 0.6 * speaking  # smooth-ish: speaking is a 0/1 curve smoothed below
    out *= energy[:, None]
    nod = 1.2 * np.maximum(0, np.sin(2 * math.pi * 0.9 * times_s)) ** 2 * listening
    out[:, 1] += nod
    return out


def _smooth(x: np.ndarray, fps: int, seconds: float = 0.25) -> np.ndarray:
    n = max(1, int(round(seconds * fps)))
    k = np.hanning(2 * n + 1)
    k /= k.sum()
    return np.convolve(np.pad(x, n, mode="edge"), k, mode="valid")


def plan_clip(seconds: float, fps: int, rng: np.random.Generator, sample_rate: int = SAMPLE_RATE) -> ClipPlan:
    """Plan a clip of ``round(seconds · fps)`` frames; see the module docstring.

    Raises ``ValueError`` for a non-positive length.
    It also raises for an fps that does not divide the sample rate into whole samples per frame.
    25, 30, 50... are fine at 16 kHz.
    """
    if seconds <= 0:
        raise ValueError(f"plan_clip: seconds={seconds} must be positive")
    if fps <= 0 or sample_rate % fps:
        raise ValueError(f"plan_clip: fps={fps} must divide {sample_rate} Hz into whole samples per frame")
    n_frames = max(1, int(round(seconds * fps)))
    total_s = n_frames / fps
    audio, segments, events = _schedule(rng, total_s, fps, sample_rate)
    # per-frame values: averaged over 4 instants inside each frame's interval
    sub = 4
    t_sub = (np.arange(n_frames * sub) + 0.5) / (fps * sub)
    mouth = np.zeros((len(t_sub), 4), np.float32)
    for seg in segments:
        if seg.kind != "speech":
            continue
        phon = [(e.time_ms, e.name) for e in events
                if e.kind == "phoneme" and 1000 * seg.start_s <= e.time_ms < 1000 * seg.end_s]
        inside = (t_sub >= seg.start_s - 0.15) & (t_sub < seg.end_s + 0.15)
        mouth[inside] += mouth_curves(phon, 1000 * seg.end_s, 1000 * t_sub[inside])
    state_of = np.full(len(t_sub), "idle", dtype=object)
    for seg in segments:
        state_of[(t_sub >= seg.start_s) & (t_sub < seg.end_s)] = "speaking" if seg.kind == "speech" else seg.kind
    listening = (state_of == "listening").astype(float)
    mouth[:, 1] += (0.15 * _smooth(listening, fps * sub)).astype(np.float32)  # a slight listening smile
    mouth = mouth.reshape(n_frames, sub, 4).mean(axis=1)
    times = np.arange(n_frames) / fps + 0.5 / fps
    spans = [(s.start_s, s.end_s) for s in segments if s.kind == "listening"]
    blink = _blink_curve(_blinks(rng, total_s, spans), t_sub).reshape(n_frames, sub).mean(axis=1)
    frame_state = state_of.reshape(n_frames, sub)[:, sub // 2]
    speaking = _smooth((frame_state == "speaking").astype(float), fps)
    head = _head_motion(rng, times, speaking, _smooth((frame_state == "listening").astype(float), fps))
    faces = [FaceParams(float(m[0]), float(m[1]), float(m[2]), float(m[3]), float(b), float(h[0]), float(h[1]),
                        float(h[2])) for m, b, h in zip(mouth, blink, head)]
    return ClipPlan(fps, sample_rate, n_frames, audio, segments, events, faces, [str(s) for s in frame_state])
