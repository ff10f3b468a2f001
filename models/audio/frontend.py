"""The avatar's audio front end. Per video frame it gives a feature vector and a speaking / listening / idle state.

:class:`AudioFrontEnd` joins :class:`~.features.StreamingFeatures` and :class:`~.vad.VoiceActivity` on one sample
timeline.
Video frame ``k`` reports the VAD state after every 512-sample window that ends within the audio its features use.
That audio runs to the frame's end plus the look-ahead. So the state does not depend on how the audio was chunked.
:func:`extract` runs a whole recording through it at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .encoder import AudioEncoder
from .features import StreamingFeatures, as_float_audio
from .vad import IDLE, LISTENING, SPEAKING, STATE_NAMES, VoiceActivity

STATE_DIM = 4  # one-hot idle / speaking / listening, then the speech probability


def state_vector(state: int, probability: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``float32 [4]``: one-hot of ``state``, then the VAD speech probability in [0, 1].

    ``state`` is ``IDLE``, ``SPEAKING`` or ``LISTENING``. Written into ``out`` when given.
    """
    v = out if out is not None else torch.empty(STATE_DIM)
    v.zero_()
    v[state] = 1.0
    v[3] = probability
    return v


def decode_state(vector: torch.Tensor) -> tuple[str, float]:
    """Inverse of :func:`state_vector`: ``("speaking", 0.93)``."""
    return STATE_NAMES[int(torch.argmax(vector[:3]))], float(vector[3])


@dataclass
class FrameOutput:
    """What the front end produces for video frame ``index``.

    ``features`` is ``float32 [feature_dim]``. ``state`` is ``IDLE``, ``SPEAKING`` or ``LISTENING``.
    ``probability`` is the VAD's. ``interrupted`` marks the first frame after a barge-in ``reset()``.
    """

    index: int
    features: torch.Tensor
    state: int
    probability: float
    interrupted: bool = False

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]


class AudioFrontEnd:
    """Streaming features + voice activity, one :class:`FrameOutput` per video frame.

    Args:
        model: the :class:`AudioEncoder`.
        fps: video frame rate.
        vad: a :class:`VoiceActivity`, or None for no VAD. The state is then idle or listening only.
        encode: runs the conv stack; see :class:`~.features.StreamingFeatures`. Defaults to the model itself.
    """

    def __init__(self, model: AudioEncoder, fps, vad: VoiceActivity | None = None, encode=None):
        self.features = StreamingFeatures(model, fps, encode=encode)
        self.timing = self.features.timing
        self.vad = vad
        self._listening = False
        self._interrupted = False

    @property
    def listening(self) -> bool:
        return self._listening

    @listening.setter
    def listening(self, value: bool) -> None:
        """The app says the avatar is listening to the user; shows from the next frame out."""
        self._listening = bool(value)
        if self.vad is not None:
            self.vad.listening = self._listening

    def _state(self) -> tuple[int, float]:
        if self.vad is None:
            return (LISTENING if self._listening else IDLE), 0.0
        return self.vad.state, self.vad.probability

    def push(self, samples) -> list[FrameOutput]:
        """Feed int16 PCM ``[n]`` of any length and return the frames that became ready."""
        x = as_float_audio(samples)
        out: list[FrameOutput] = []
        f = self.features
        while len(x):
            need = max(1, self.timing.required_samples(f.next_frame) - f.samples_seen)
            piece, x = x[:need], x[need:]
            if self.vad is not None:
                self.vad.push(piece.numpy())
            out += self._wrap(f.push(piece))
        return out

    def flush(self) -> list[FrameOutput]:
        """End of stream: the remaining frames, their look-ahead filled with silence."""
        return self._wrap(self.features.flush())

    def reset(self) -> None:
        """Barge-in: the audio so far becomes silence. The VAD forgets and is idle or listening at once.

        The next frame out is marked ``interrupted``. Frame and sample counters go on.
        """
        self.features.reset()
        if self.vad is not None:
            self.vad.reset()
        self._interrupted = True

    def restart(self) -> None:
        """A new stream from sample 0."""
        self.features.restart()
        if self.vad is not None:
            self.vad.reset()
        self._interrupted = False

    def _wrap(self, ready) -> list[FrameOutput]:
        out = []
        state, prob = self._state()
        for k, feats in ready:
            out.append(FrameOutput(k, feats, state, prob, self._interrupted))
            self._interrupted = False
        return out


def extract(model: AudioEncoder, samples, fps, vad: VoiceActivity | None = None) -> list[FrameOutput]:
    """A whole recording at once → one :class:`FrameOutput` per video frame, ``ceil(S · fps / sr)`` of them."""
    front = AudioFrontEnd(model, fps, vad)
    if vad is not None:
        vad.reset()
    return front.push(samples) + front.flush()


__all__ = ["STATE_DIM", "IDLE", "SPEAKING", "LISTENING", "STATE_NAMES", "state_vector", "decode_state",
           "FrameOutput", "AudioFrontEnd", "extract"]
