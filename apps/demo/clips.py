"""Audio the demo streams into a take: typed text spoken by eSpeak NG, or an uploaded file.

Both become 16 kHz mono int16 PCM, the protocol's input format. :class:`ClipStore` keeps the few most recent
clips in memory under random ids. The player fetches them from ``/fg/clip/ID`` as raw PCM16 little-endian. It
streams them in real time.
"""
from __future__ import annotations

import collections
import secrets
import threading

import numpy as np

from framegraph.models.synth.espeak import EspeakError, EspeakNotFound, synthesize
from framegraph.models.synth.plan import VOICES
from framegraph.stream.media import SAMPLE_RATE, MediaError, decode_audio

MAX_CLIP_S = 60.0
MAX_TEXT_CHARS = 1000
DEFAULT_VOICE = "en-us"


class ClipError(ValueError):
    """The text or file cannot become a clip. The message says why and what would work."""


def voices() -> list[str]:
    """eSpeak NG voices offered in the demo: the ones the avatar's training clips use."""
    return list(dict.fromkeys([DEFAULT_VOICE, *VOICES]))


def speak(text: str, voice: str = DEFAULT_VOICE, rate_wpm: int = 165) -> np.ndarray:
    """``text`` spoken by eSpeak NG → int16 [S] at 16 kHz."""
    text = (text or "").strip()
    if not text:
        raise ClipError("type something to say first")
    if len(text) > MAX_TEXT_CHARS:
        raise ClipError(f"the text has {len(text)} characters; at most {MAX_TEXT_CHARS} are spoken at once")
    try:
        speech = synthesize(text, voice=voice or DEFAULT_VOICE, rate_wpm=rate_wpm, sample_rate=SAMPLE_RATE)
    except (EspeakNotFound, EspeakError) as exc:
        raise ClipError(str(exc)) from None
    return _checked(speech.samples, f"the text {text[:40]!r}")


def load(path: str) -> np.ndarray:
    """Any audio or video file FFmpeg decodes → int16 [S] mono at 16 kHz."""
    if not path:
        raise ClipError("choose an audio file first")
    try:
        samples = decode_audio(path, SAMPLE_RATE)
    except MediaError as exc:
        raise ClipError(str(exc)) from None
    return _checked(samples, path)


def _checked(samples: np.ndarray, what: str) -> np.ndarray:
    samples = np.asarray(samples, dtype=np.int16).reshape(-1)
    if samples.size == 0:
        raise ClipError(f"{what} gave no audio")
    seconds = samples.size / SAMPLE_RATE
    if seconds > MAX_CLIP_S:
        raise ClipError(f"{what} is {seconds:.1f} s long; the demo streams at most {MAX_CLIP_S:g} s at once")
    return samples


class ClipStore:
    """The last ``capacity`` clips, by random id. Thread-safe."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._clips: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, samples: np.ndarray) -> str:
        clip_id = secrets.token_urlsafe(12)
        with self._lock:
            self._clips[clip_id] = np.asarray(samples, dtype="<i2").tobytes()
            while len(self._clips) > self.capacity:
                self._clips.popitem(last=False)
        return clip_id

    def get(self, clip_id: str) -> bytes | None:
        with self._lock:
            return self._clips.get(clip_id)
