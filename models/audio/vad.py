"""Voice activity: the Silero VAD ONNX model run with onnxruntime, plus hysteresis and app states.

The model file ships inside the ``silero-vad`` PyPI wheel as ``silero_vad/data/silero_vad.onnx``, under the MIT
licence.
Nothing is downloaded. We call it directly with onnxruntime.
Each call takes one window of 512 samples, 32 ms at 16 kHz.
The last 64 samples of the previous window come before it as context.
Inputs are ``input float32 [1, 576]``, the recurrent ``state float32 [2, 1, 128]`` and ``sr int64 []``.
It returns the speech probability ``output float32 [1, 1]`` and the next ``stateN``.

:class:`VoiceActivity` turns probabilities into a state with hysteresis.
Speaking starts when the probability reaches ``on_threshold``.
It stops after ``min_silence_ms`` below ``off_threshold``.
It adds ``listening``, which the app sets while the avatar listens to the user.
``reset()`` is for barge-in: it forgets the model state and returns to idle at once.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

from framegraph.stream.media import SAMPLE_RATE

IDLE, SPEAKING, LISTENING = 0, 1, 2
STATE_NAMES = ("idle", "speaking", "listening")

WINDOW_SAMPLES = 512  # at 16 kHz
CONTEXT_SAMPLES = 64


def silero_model_path() -> Path:
    """Path of ``silero_vad.onnx`` inside the installed ``silero-vad`` package.

    The ``FRAMEGRAPH_SILERO_VAD`` environment variable overrides it.
    Raises ``FileNotFoundError`` saying what to install.
    """
    override = os.environ.get("FRAMEGRAPH_SILERO_VAD")
    if override:
        if not os.path.isfile(override):
            raise FileNotFoundError(f"FRAMEGRAPH_SILERO_VAD={override!r} is not a file; expected silero_vad.onnx")
        return Path(override)
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the Silero VAD model comes with the PyPI package `silero-vad`, which is not "
                                "installed: pip install silero-vad")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"silero-vad is installed but has no {path}; reinstall silero-vad (>= 5)")
    return path


def check_hysteresis(on_threshold: float, off_threshold: float, min_silence_ms: float) -> None:
    """Raise ``ValueError`` unless ``0 <= off_threshold <= on_threshold <= 1`` and ``min_silence_ms >= 0``."""
    if not 0 <= off_threshold <= on_threshold <= 1:
        raise ValueError(f"VAD hysteresis: need 0 <= off_threshold <= on_threshold <= 1, got "
                         f"off_threshold={off_threshold}, on_threshold={on_threshold}")
    if min_silence_ms < 0:
        raise ValueError(f"VAD hysteresis: min_silence_ms={min_silence_ms} must be >= 0")


_sessions: dict = {}  # (model path, threads) -> the onnxruntime session every SileroVAD of it shares
_sessions_lock = threading.Lock()


def _session(path: Path, threads: int):
    """The process's one onnxruntime session of ``path``.

    Its creation costs about 60 ms. ``run`` may be called from many threads at once.
    The model's state lives in each caller, not in the session.
    """
    import onnxruntime as ort

    with _sessions_lock:
        key = (str(path), threads)
        if key not in _sessions:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3  # the wheel's model has unused initialisers; don't warn on each load
            _sessions[key] = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        return _sessions[key]


class SileroVAD:
    """Silero VAD on onnxruntime, one 512-sample window per call: 32 ms at 16 kHz.

    ``__call__(window float32 [512] in [-1, 1])`` → speech probability in [0, 1].
    The recurrent state and the 64-sample context live here. :meth:`reset` clears them.
    Every instance in the process shares the onnxruntime session.
    So a new live session's voice detector starts at once.
    """

    def __init__(self, path: str | os.PathLike | None = None, threads: int = 1):
        self.path = Path(path) if path else silero_model_path()
        self.session = _session(self.path, threads)
        names = {i.name for i in self.session.get_inputs()}
        if names != {"input", "state", "sr"}:
            raise ValueError(f"{self.path}: expected a Silero VAD v5+ model with inputs input/state/sr, "
                             f"got {sorted(names)}")
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self._input = np.zeros((1, CONTEXT_SAMPLES + WINDOW_SAMPLES), np.float32)
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), np.float32)
        self._input[:] = 0.0

    def __call__(self, window: np.ndarray) -> float:
        if window.shape != (WINDOW_SAMPLES,):
            raise ValueError(f"SileroVAD: expected a window of {WINDOW_SAMPLES} samples, got shape {window.shape}")
        self._input[0, CONTEXT_SAMPLES:] = window
        prob, self._state = self.session.run(None, {"input": self._input, "state": self._state, "sr": self._sr})
        self._input[0, :CONTEXT_SAMPLES] = self._input[0, -CONTEXT_SAMPLES:]
        return float(prob.reshape(-1)[0])


class VoiceActivity:
    """Streaming speaking / listening / idle state.

    Args:
        on_threshold: speech probability at which speaking starts.
        off_threshold: probability below which silence is counted. At most ``on_threshold``: hysteresis.
        min_silence_ms: silence below ``off_threshold`` needed before speaking stops. 0 stops on the first silent
            window.
        vad: a :class:`SileroVAD`. One is created when None.

    ``push(samples float32 [n])`` runs every complete 512-sample window and returns how many ran.
    So a decision is at most 32 ms old.
    ``state`` is ``SPEAKING`` while speech is detected.
    Otherwise it is ``LISTENING`` if the app set :attr:`listening`, else ``IDLE``.
    ``probability`` is the last window's.
    """

    def __init__(self, *, on_threshold: float = 0.5, off_threshold: float = 0.35, min_silence_ms: float = 64.0,
                 vad: SileroVAD | None = None):
        check_hysteresis(on_threshold, off_threshold, min_silence_ms)
        self.on_threshold, self.off_threshold = on_threshold, off_threshold
        self.min_silence_windows = int(np.ceil(min_silence_ms * SAMPLE_RATE / 1000 / WINDOW_SAMPLES))
        self.vad = vad or SileroVAD()
        self.listening = False
        self._buf = np.zeros(WINDOW_SAMPLES, np.float32)
        self.reset()

    def reset(self) -> None:
        """Barge-in: forget the model state and pending samples. Idle or listening at once."""
        self.vad.reset()
        self._fill = 0
        self.speaking = False
        self.probability = 0.0
        self._silent_windows = 0

    @property
    def state(self) -> int:
        return SPEAKING if self.speaking else (LISTENING if self.listening else IDLE)

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    def windows_ready(self, n_samples: int) -> int:
        """Windows that would complete if ``n_samples`` more samples were pushed."""
        return (self._fill + n_samples) // WINDOW_SAMPLES

    def push(self, samples: np.ndarray) -> int:
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        done = 0
        while len(x):
            take = min(WINDOW_SAMPLES - self._fill, len(x))
            self._buf[self._fill:self._fill + take] = x[:take]
            self._fill += take
            x = x[take:]
            if self._fill == WINDOW_SAMPLES:
                self._update(self.vad(self._buf))
                self._fill = 0
                done += 1
        return done

    def _update(self, p: float) -> None:
        self.probability = p
        if p >= self.on_threshold:
            self.speaking = True
            self._silent_windows = 0
        elif p < self.off_threshold:
            self._silent_windows += 1
            if self._silent_windows >= max(1, self.min_silence_windows):
                self.speaking = False
        else:
            self._silent_windows = 0
