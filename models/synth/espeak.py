"""Speech with timed phonemes from eSpeak NG, through ``libespeak-ng`` and ctypes.

eSpeak NG is loaded and initialised once per utterance.
So results do not depend on what was said before.
It runs in ``AUDIO_OUTPUT_SYNCHRONOUS`` mode with phoneme events on.
:func:`synthesize` speaks a text with a voice, rate and pitch.
It returns the audio as 16 kHz mono int16, resampled from eSpeak's 22 050 Hz.
It also returns the events eSpeak reports while synthesizing: one per phoneme and one per word.
Each carries its ``audio_position``, in ms from the start of the audio.

The library has process-wide state, so every call holds one lock.
When it is missing, :class:`EspeakNotFound` says how to install it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from framegraph.stream.media import SAMPLE_RATE

from .resample import resample

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_PHONEMES = 0x100  # text inside [[ ]] is eSpeak phoneme mnemonics
_POS_CHARACTER = 1
_EVENT_LIST_TERMINATED, _EVENT_WORD, _EVENT_SENTENCE, _EVENT_END, _EVENT_MSG_TERMINATED = 0, 1, 2, 5, 6
_EVENT_PHONEME = 7
_RATE, _VOLUME, _PITCH, _RANGE = 1, 2, 3, 4
RATE_MIN_WPM, RATE_MAX_WPM = 80, 450

INSTALL_HINT = ("install the system package `espeak-ng` (Debian/Ubuntu: `sudo apt-get install -y espeak-ng "
                "libespeak-ng1`)")


class EspeakNotFound(RuntimeError):
    """libespeak-ng or its voice data is not installed."""


class EspeakError(RuntimeError):
    """eSpeak NG rejected a request: an unknown voice or a synthesis failure."""


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _EventId)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


@dataclass(frozen=True)
class PhonemeEvent:
    """One eSpeak event.

    - ``time_ms``: audio position in ms from the start of the utterance.
    - ``kind``: ``"phoneme"`` or ``"word"``.
    - ``name``: the eSpeak phoneme mnemonic, e.g. ``"aI"``, ``"t"``, or ``"_"`` for a pause. For a word, the word's
      text.
    - ``text_position``: character offset, 1-based as eSpeak reports it.
    """

    time_ms: float
    kind: str
    name: str
    text_position: int = 0

    def to_json(self) -> dict:
        return {"time_ms": self.time_ms, "kind": self.kind, "name": self.name,
                "text_position": self.text_position}


@dataclass
class Speech:
    """An utterance: ``samples`` int16 [S] mono at ``sample_rate`` Hz, and its time-ordered events."""

    samples: np.ndarray
    sample_rate: int
    events: list[PhonemeEvent] = field(default_factory=list)
    text: str = ""
    voice: str = ""
    rate_wpm: int = 175
    pitch: int = 50

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.samples) / self.sample_rate

    @property
    def phonemes(self) -> list[PhonemeEvent]:
        return [e for e in self.events if e.kind == "phoneme"]

    @property
    def words(self) -> list[PhonemeEvent]:
        return [e for e in self.events if e.kind == "word"]


class _Espeak:
    """The loaded library, initialised once."""

    def __init__(self):
        self.lib = _load_library()
        lib = self.lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synchronize.restype = ctypes.c_int
        data_path = os.environ.get("ESPEAK_DATA_PATH")
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                     data_path.encode() if data_path else None,
                                     _INITIALIZE_PHONEME_EVENTS | _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise EspeakNotFound(f"libespeak-ng loaded but could not initialise (no voice data found; "
                                 f"espeak_Initialize returned {rate}): {INSTALL_HINT}")
        self.native_rate = rate
        self._pcm: list[np.ndarray] = []
        self._events: list[tuple[int, int, int, str]] = []
        self._callback = _CALLBACK(self._on_synth)  # keep a reference: C holds the pointer
        lib.espeak_SetSynthCallback(self._callback)

    def _on_synth(self, wav, n, events) -> int:
        if n > 0 and wav:
            self._pcm.append(np.ctypeslib.as_array(wav, shape=(n,)).astype(np.int16, copy=True))
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            ev = events[i]
            if ev.type == _EVENT_PHONEME:
                name = bytes(ev.id.string).split(b"\0", 1)[0].decode("utf-8", "replace")
                self._events.append((ev.audio_position, _EVENT_PHONEME, ev.text_position, name))
            elif ev.type == _EVENT_WORD:
                self._events.append((ev.audio_position, _EVENT_WORD, ev.text_position, str(ev.length)))
            i += 1
        return 0

    def synth(self, text: str, voice: str, rate_wpm: int, pitch: int, pitch_range: int,
              phonemes: bool) -> tuple[np.ndarray, list]:
        lib = self.lib
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise EspeakError(f"eSpeak NG has no voice {voice!r} (try 'en-us', 'en', 'en-us+f3'; "
                              f"`espeak-ng --voices=en` lists them)")
        for param, value in ((_RATE, rate_wpm), (_PITCH, pitch), (_RANGE, pitch_range), (_VOLUME, 100)):
            lib.espeak_SetParameter(param, int(value), 0)
        self._pcm, self._events = [], []
        data = text.encode("utf-8") + b"\0"
        flags = _CHARS_UTF8 | (_PHONEMES if phonemes else 0)
        err = lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, flags, None, None)
        if err != 0:
            raise EspeakError(f"espeak_Synth failed with code {err} for text {text[:60]!r}")
        lib.espeak_Synchronize()
        pcm = np.concatenate(self._pcm) if self._pcm else np.zeros(0, np.int16)
        return pcm, self._events


def _load_library():
    names = [os.environ.get("FRAMEGRAPH_ESPEAK_LIB"), ctypes.util.find_library("espeak-ng"),
             "libespeak-ng.so.1", "libespeak-ng.so", "libespeak-ng.dylib"]
    tried = []
    for name in names:
        if not name or name in tried:
            continue
        tried.append(name)
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise EspeakNotFound(f"eSpeak NG is not installed: could not load libespeak-ng (tried {tried}); "
                         f"{INSTALL_HINT}")


_LOCK = threading.Lock()


def _fresh_engine() -> _Espeak:
    """Load and initialise the library.

    eSpeak NG keeps state between utterances that no call resets.
    One example is the phase of its pitch flutter, a function-level static in the wave generator.
    So each utterance gets a freshly loaded library.
    The same text, voice, rate and pitch then always give the same samples.
    """
    return _Espeak()


def _unload(engine: _Espeak) -> None:
    lib = engine.lib
    lib.espeak_Terminate.restype = ctypes.c_int
    lib.espeak_Terminate()  # frees the voice and phoneme data
    try:
        import _ctypes

        _ctypes.dlclose(lib._handle)  # the next load starts from the library's initial state
    except (ImportError, AttributeError, OSError):  # pragma: no cover - not POSIX
        pass


def espeak_available() -> bool:
    """True when libespeak-ng loads and initialises."""
    try:
        with _LOCK:
            _unload(_fresh_engine())
        return True
    except EspeakNotFound:
        return False


def synthesize(text: str, *, voice: str = "en-us", rate_wpm: int = 175, pitch: int = 50,
               pitch_range: int = 50, phonemes: bool = False, sample_rate: int = SAMPLE_RATE) -> Speech:
    """Speak ``text`` and return the audio and its timed phoneme / word events.

    Args:
        text: UTF-8 text. With ``phonemes=True``, text inside ``[[ ]]`` is eSpeak phoneme mnemonics.
        voice: an eSpeak NG voice name, optionally with a variant: ``"en-us"``, ``"en-gb+f3"``.
        rate_wpm: speaking rate in words per minute, 80..450.
        pitch: base pitch 0..100; 50 is normal.
        pitch_range: 0 for monotone ..100.
        sample_rate: output rate in Hz. eSpeak's native 22 050 Hz is resampled.
    Returns:
        :class:`Speech` with ``samples`` int16 [S] and events sorted by time. Each event's ``time_ms`` is eSpeak's
        ``audio_position``, in ms from the start of the audio.
    Raises:
        EspeakNotFound: libespeak-ng is not installed.
        EspeakError: a bad voice or a failed synthesis.
        ValueError: empty text or parameters out of range.
    """
    if not text or not text.strip():
        raise ValueError("synthesize: text is empty; expected something to say")
    if not RATE_MIN_WPM <= rate_wpm <= RATE_MAX_WPM:
        raise ValueError(f"synthesize: rate_wpm={rate_wpm} outside {RATE_MIN_WPM}..{RATE_MAX_WPM}")
    if not 0 <= pitch <= 100 or not 0 <= pitch_range <= 100:
        raise ValueError(f"synthesize: pitch={pitch} and pitch_range={pitch_range} must be in 0..100")
    with _LOCK:
        engine = _fresh_engine()
        try:
            pcm, raw_events = engine.synth(text, voice, rate_wpm, pitch, pitch_range, phonemes)
        finally:
            _unload(engine)
        native = engine.native_rate
    samples = resample(pcm, native, sample_rate)
    events = []
    for pos_ms, kind, text_pos, name in raw_events:
        if kind == _EVENT_WORD:
            start = max(text_pos - 1, 0)
            name = text.encode("utf-8")[start:start + int(name)].decode("utf-8", "replace")
        events.append(PhonemeEvent(float(pos_ms), "phoneme" if kind == _EVENT_PHONEME else "word", name, text_pos))
    events.sort(key=lambda e: e.time_ms)  # stable: eSpeak's order kept within one time
    return Speech(samples, sample_rate, events, text, voice, rate_wpm, pitch)
