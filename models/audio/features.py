"""Audio features per video frame, offline or streaming. Both give the same numbers.

Timing counts samples from the stream's first sample, at 16 kHz by default:

- video frame ``k`` at ``fps`` covers samples ``[start_k, end_k)`` with ``end_k = floor((k + 1) · sr / fps)``.
- its features are the encoder output at mel frame ``j_k = end_k // hop - 1 + lookahead_frames``. They use audio up to
  ``(j_k + 1) · hop ≤ end_k + lookahead`` samples, at most 80 ms after the frame's end.
- a stream of ``S`` samples has ``ceil(S · fps / sr)`` video frames. At the stream's end the missing look-ahead is
  filled with silence.

:func:`extract_features` computes all frames at once, with one STFT and one pass of the conv stack.
:class:`StreamingFeatures` takes audio chunk by chunk and keeps a rolling context.
That context is the last ``receptive_field - 1`` mel frames and the last ``win - hop`` samples.
It emits each frame as soon as its audio, look-ahead included, has arrived.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from .encoder import AudioEncoder


def as_float_audio(samples) -> torch.Tensor:
    """int16 PCM, numpy or torch → ``float32 [S]`` in [-1, 1). Float input is passed through."""
    x = torch.as_tensor(np.asarray(samples) if not isinstance(samples, torch.Tensor) else samples)
    if x.dim() != 1:
        raise ValueError(f"expected mono audio [S], got shape {tuple(x.shape)}")
    if x.dtype == torch.int16:
        return x.to(torch.float32) / 32768.0
    if not x.is_floating_point():
        raise ValueError(f"expected int16 PCM or float audio, got dtype {x.dtype}")
    return x.to(torch.float32)


@dataclass(frozen=True)
class FrameTiming:
    """Where video frames fall on the audio sample axis; see the module docstring.

    Args:
        fps: video frames per second. At most ``sample_rate / hop``: at least one mel frame per video frame.
        sample_rate: Hz.
        hop: samples per mel frame.
        lookahead_frames: mel frames read past a frame's end.
    """

    fps: Fraction
    sample_rate: int
    hop: int
    lookahead_frames: int

    @classmethod
    def of(cls, model: AudioEncoder, fps) -> FrameTiming:
        fps = Fraction(fps).limit_denominator(1001)
        c = model.config
        if not 0 < fps <= Fraction(c.sample_rate, model.hop_length):
            raise ValueError(f"fps={float(fps):g} must be in (0, {c.sample_rate / model.hop_length:g}] "
                             f"(one mel hop of {c.hop_ms} ms per video frame at most)")
        return cls(fps, c.sample_rate, model.hop_length, model.lookahead_frames)

    def end_sample(self, k: int) -> int:
        """First sample after video frame ``k``."""
        return math.floor((k + 1) * self.sample_rate / self.fps)

    def mel_index(self, k: int) -> int:
        """Mel frame whose encoder output is frame ``k``'s features."""
        return self.end_sample(k) // self.hop - 1 + self.lookahead_frames

    def required_samples(self, k: int) -> int:
        """Samples that must have arrived before frame ``k``'s features can be computed."""
        return (self.mel_index(k) + 1) * self.hop

    def n_frames(self, n_samples: int) -> int:
        """Video frames in a stream of ``n_samples``: every frame that starts before the end."""
        return math.ceil(n_samples * self.fps / self.sample_rate)

    def lookahead_ms(self, k: int) -> float:
        """How far past the end of frame ``k`` its features reach, in ms."""
        return 1000.0 * (self.required_samples(k) - self.end_sample(k)) / self.sample_rate


@torch.no_grad()
def extract_features(model: AudioEncoder, samples, fps) -> torch.Tensor:
    """Offline: features of every video frame of a whole recording.

    Args:
        model: the encoder.
        samples: int16 PCM ``[S]`` at ``model.config.sample_rate``, or float in [-1, 1].
        fps: video frame rate.
    Returns:
        ``float32 [K, feature_dim]`` with ``K = ceil(S · fps / sample_rate)``. Row ``k`` belongs to the video frame
        shown at ``k / fps`` seconds.
    """
    timing = FrameTiming.of(model, fps)
    x = as_float_audio(samples).to(model.device)
    k_total = timing.n_frames(len(x))
    if k_total == 0:
        return torch.zeros(0, model.feature_dim)
    need = timing.required_samples(k_total - 1)
    x = torch.nn.functional.pad(x, (0, max(0, need - len(x))))[:need]
    mel = torch.cat([model.silence(model.receptive_field - 1, x.device), model.mel(x)], dim=1)
    out = model(mel[None])[0]  # [D, T]
    index = torch.tensor([timing.mel_index(k) for k in range(k_total)], device=out.device)
    return out[:, index].T.contiguous().cpu()


class StreamingFeatures:
    """Chunk-by-chunk features with a rolling context.

    ``push(samples)`` → list of ``(k, float32 [feature_dim])``, one for every video frame that became computable.
    ``flush()`` fills the end of the stream with silence and returns the remaining frames.
    ``reset()`` is for barge-in. It forgets the audio heard so far, which counts as silence from then on.
    The sample and frame counters go on, so pts stay on the stream's timeline.
    ``restart()`` also sets the counters back to zero, for a new stream.

    Memory is bounded. It holds ``win - hop`` samples, less than one hop of pending samples and ``receptive_field -
    1`` mel frames.
    One push adds its own frames on top.

    ``encode`` runs the conv stack, ``float32 [1, n_mels, T] → [1, D, T - R + 1]``.
    It defaults to the model. Another runtime passes its engine here. The mel front end stays torch.
    """

    def __init__(self, model: AudioEncoder, fps, encode=None):
        self.model = model
        self.encode = model if encode is None else encode
        self.timing = FrameTiming.of(model, fps)
        self.restart()

    def restart(self) -> None:
        """A new stream: counters to zero, history silent."""
        self.samples_in = 0  # real samples received
        self.next_frame = 0  # next video frame to emit
        self.n_mel = 0  # mel frames computed so far
        self.reset()

    def reset(self) -> None:
        """Barge-in: the audio heard so far becomes silence; counters are kept."""
        m = self.model
        device = m.device
        self._tail = torch.zeros(m.mel.context, device=device)  # the samples before the pending hop
        self._pending = torch.zeros(self.samples_in - self.n_mel * m.hop_length, device=device)
        self._context = m.silence(m.receptive_field - 1, device)  # mel frames n_mel-R+1 .. n_mel-1

    @property
    def samples_seen(self) -> int:
        """Samples pushed so far, the silence that :meth:`flush` added included."""
        return self.n_mel * self.model.hop_length + len(self._pending)

    @torch.no_grad()
    def push(self, samples) -> list[tuple[int, torch.Tensor]]:
        """Feed audio and return the frames that became ready. Audio is int16 PCM ``[n]`` or float."""
        x = as_float_audio(samples).to(self.model.device)
        self.samples_in += len(x)
        return self._advance(x)

    @torch.no_grad()
    def flush(self) -> list[tuple[int, torch.Tensor]]:
        """End of stream: pad with silence until every frame of the stream is out."""
        total = self.timing.n_frames(self.samples_in)
        if self.next_frame >= total:
            return []
        need = self.timing.required_samples(total - 1)
        return self._advance(torch.zeros(max(0, need - self.samples_seen), device=self.model.device), limit=total)

    def _advance(self, x: torch.Tensor, limit: int | None = None) -> list[tuple[int, torch.Tensor]]:
        m, timing, hop = self.model, self.timing, self.model.hop_length
        pending = torch.cat([self._pending, x])
        n_new = len(pending) // hop
        if n_new:
            signal = torch.cat([self._tail, pending[: n_new * hop]])
            self._context = torch.cat([self._context, m.mel.frames(signal)], dim=1)
            self._tail = signal[len(signal) - m.mel.context:]
            self.n_mel += n_new
        self._pending = pending[n_new * hop:]
        ready = []
        while (limit is None or self.next_frame < limit) and \
                timing.mel_index(self.next_frame) < self.n_mel:
            ready.append(self.next_frame)
            self.next_frame += 1
        out = []
        first_ctx = self.n_mel - self._context.shape[1]  # mel index of context column 0
        if ready:
            r = m.receptive_field
            lo = timing.mel_index(ready[0]) - r + 1 - first_ctx
            hi = timing.mel_index(ready[-1]) + 1 - first_ctx
            y = self.encode(self._context[None, :, lo:hi])[0]  # [D, hi - lo - r + 1]
            for k in ready:
                out.append((k, y[:, timing.mel_index(k) - r + 1 - first_ctx - lo].clone()))
        keep = m.receptive_field - 1
        if self._context.shape[1] > keep:
            self._context = self._context[:, self._context.shape[1] - keep:]
        return out
