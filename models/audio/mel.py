"""Log-mel spectrogram in pure torch: framing, Hann window, FFT, a triangular mel filterbank, log.

Frames are **causal**. Mel frame ``j`` is computed from the ``win_length`` samples that end at sample ``(j + 1) *
hop_length``.
Samples before 0 are zeros. So frame ``j`` is ready once ``(j + 1) * hop_length`` samples have arrived.
The streaming and the offline paths frame the signal identically.
The defaults are 16 kHz, a 25 ms window and a 10 ms hop. Frame ``j`` then covers ``[(j + 1) * 10 ms - 25 ms, (j + 1) *
10 ms)``.
"""
from __future__ import annotations

import math

import torch

from framegraph.stream.media import SAMPLE_RATE


def hz_to_mel(hz):
    """HTK mel scale: ``2595 · log10(1 + f / 700)``. Works on floats and tensors."""
    if isinstance(hz, torch.Tensor):
        return 2595.0 * torch.log10(1.0 + hz / 700.0)
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def mel_to_hz(mel):
    """Inverse of :func:`hz_to_mel`."""
    if isinstance(mel, torch.Tensor):
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_center_frequencies(n_mels: int, f_min: float, f_max: float) -> torch.Tensor:
    """``float64 [n_mels]``: centre frequency in Hz of each triangular filter, equally spaced in mel."""
    mels = torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2, dtype=torch.float64)
    return mel_to_hz(mels[1:-1])


def mel_filterbank(n_mels: int, n_fft: int, sample_rate: int, f_min: float = 0.0,
                   f_max: float | None = None) -> torch.Tensor:
    """Triangular mel filterbank, ``float32 [n_mels, n_fft // 2 + 1]``.

    Filter ``m`` rises linearly from the centre of filter ``m - 1`` to its own centre.
    It falls to the centre of filter ``m + 1``.
    Centres are equally spaced on the HTK mel scale between ``f_min`` and ``f_max`` Hz.
    Each filter has unit area in Hz, Slaney-style. So a white spectrum gives about the same value in every band.
    Raises ``ValueError`` if a filter would cover no FFT bin: too many mels for the FFT size.
    """
    f_max = sample_rate / 2 if f_max is None else f_max
    if not 0 <= f_min < f_max <= sample_rate / 2:
        raise ValueError(f"mel_filterbank: need 0 <= f_min < f_max <= {sample_rate / 2} Hz, "
                         f"got f_min={f_min}, f_max={f_max}")
    edges = mel_to_hz(torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2, dtype=torch.float64))
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)  # [F]
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # [n_mels, 1]
    rising = (freqs - lo) / (mid - lo)
    falling = (hi - freqs) / (hi - mid)
    fb = torch.clamp(torch.minimum(rising, falling), min=0.0)  # [n_mels, F]
    fb = fb * (2.0 / (hi - lo))  # unit area
    empty = (fb.sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"mel_filterbank: filters {empty} cover no FFT bin: {n_mels} mel bands are too "
                         f"many for n_fft={n_fft} at {sample_rate} Hz (raise n_fft or f_min, or lower n_mels)")
    return fb.to(torch.float32)


class LogMel(torch.nn.Module):
    """Waveform → causal log-mel frames.

    Args:
        sample_rate: Hz.
        win_length / hop_length: samples. Defaults: 25 ms / 10 ms at 16 kHz.
        n_fft: FFT size, ≥ win_length. The windowed frame is zero-padded.
        n_mels, f_min, f_max: the filterbank, in Hz.
        log_floor: mel power below this is clamped before the natural log. So silence is ``log(log_floor)`` exactly.

    ``forward(wave float32 [..., S])`` → ``float32 [..., n_mels, T]`` with ``T = S // hop_length`` frames.
    The signal is zeros before sample 0. The module docstring gives the framing.
    Input amplitude is in [-1, 1], that is int16 / 32768.
    """

    def __init__(self, sample_rate: int = SAMPLE_RATE, win_length: int = 400, hop_length: int = 160, n_fft: int = 512,
                 n_mels: int = 80, f_min: float = 40.0, f_max: float | None = None, log_floor: float = 1e-6):
        super().__init__()
        if n_fft < win_length:
            raise ValueError(f"LogMel: n_fft={n_fft} must be >= win_length={win_length}")
        if hop_length > win_length:
            raise ValueError(f"LogMel: hop_length={hop_length} must be <= win_length={win_length}")
        self.sample_rate, self.win_length, self.hop_length = sample_rate, win_length, hop_length
        self.n_fft, self.n_mels, self.log_floor = n_fft, n_mels, log_floor
        self.register_buffer("window", torch.hann_window(win_length, periodic=True), persistent=False)
        self.register_buffer("filterbank", mel_filterbank(n_mels, n_fft, sample_rate, f_min, f_max),
                             persistent=False)

    @property
    def context(self) -> int:
        """Samples before a frame's hop that its window reaches back: ``win_length - hop_length``."""
        return self.win_length - self.hop_length

    @property
    def floor_value(self) -> float:
        """The log-mel value of silence: ``log(log_floor)``."""
        return math.log(self.log_floor)

    def frames(self, padded: torch.Tensor) -> torch.Tensor:
        """Log-mel of a signal that already carries its ``context`` samples in front.

        ``[..., context + T * hop]`` → ``[..., n_mels, T]``. The streaming path calls this directly.
        """
        x = padded.unfold(-1, self.win_length, self.hop_length)  # [..., T, win]
        spec = torch.fft.rfft(x * self.window, n=self.n_fft)  # [..., T, F]
        power = spec.real.square() + spec.imag.square()
        mel = power @ self.filterbank.T  # [..., T, n_mels]
        return torch.log(torch.clamp(mel, min=self.log_floor)).transpose(-1, -2)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        n = wave.shape[-1] // self.hop_length
        x = torch.nn.functional.pad(wave[..., : n * self.hop_length], (self.context, 0))
        return self.frames(x)
