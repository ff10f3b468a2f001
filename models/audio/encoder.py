"""A small causal convolutional audio encoder: log-mel frames → one feature vector per mel frame.

The model is a :class:`~framegraph.models.pretrained.PretrainedModel`.
``save_pretrained(folder)`` writes ``config.json`` + ``diffusion_pytorch_model.safetensors``.
``AudioEncoder.from_pretrained(folder)`` loads it back.
The config holds the whole front end: sample rate, window, hop, mel bands.
So a saved encoder always sees the features it was trained on.

Causality: every convolution is *valid*, without padding, and looks only backwards in time.
Output frame ``t`` depends on mel frames ``t - receptive_field + 1 .. t`` only.
Callers feed ``receptive_field - 1`` silence frames, ``log(log_floor)``, in front of the stream.
That is exactly what zero audio before the start produces.
So the streaming path gives the same numbers as the offline path.
Its rolling context is the last ``receptive_field - 1`` frames.
Look-ahead is not inside the model.
A video frame reads the output ``lookahead_frames`` mel frames after its end; see :mod:`.features`.
"""
from __future__ import annotations

import torch
from torch import nn

from framegraph.stream.media import SAMPLE_RATE

from ..pretrained import PretrainedModel, register_to_config
from .mel import LogMel

MAX_LOOKAHEAD_MS = 80.0


class AudioEncoder(PretrainedModel):
    """Causal conv encoder over log-mel frames.

    Args:
        sample_rate: Hz of the input audio, 16 000.
        win_ms / hop_ms: STFT window and hop in ms, 25 / 10.
        n_fft: FFT size, 512.
        n_mels, f_min, f_max: mel filterbank. 80 bands, 40 Hz .. Nyquist when f_max is None.
        log_floor: mel power floor before the log.
        mel_offset / mel_scale: the input is normalised as ``(log_mel - mel_offset) / mel_scale``.
        channels: width of the conv stack.
        feature_dim: size of each output vector.
        kernel_size, dilations: one residual causal conv block per dilation.
        lookahead_ms: how far past the end of a video frame its features may look. At most 80 ms, a whole number of
            hops.

    ``forward(log_mel float32 [B, n_mels, T])`` → ``float32 [B, feature_dim, T - receptive_field + 1]``.
    """

    @register_to_config
    def __init__(self, sample_rate: int = SAMPLE_RATE, win_ms: float = 25.0, hop_ms: float = 10.0, n_fft: int = 512,
                 n_mels: int = 80, f_min: float = 40.0, f_max: float | None = None, log_floor: float = 1e-6,
                 mel_offset: float = -6.0, mel_scale: float = 4.0, channels: int = 128, feature_dim: int = 128,
                 kernel_size: int = 3, dilations: tuple[int, ...] = (1, 2, 4, 8), lookahead_ms: float = 40.0):
        super().__init__()
        win, hop = sample_rate * win_ms / 1000, sample_rate * hop_ms / 1000
        if win != int(win) or hop != int(hop):
            raise ValueError(f"AudioEncoder: win_ms={win_ms} / hop_ms={hop_ms} are not whole numbers of samples "
                             f"at {sample_rate} Hz")
        if not 0 <= lookahead_ms <= MAX_LOOKAHEAD_MS:
            raise ValueError(f"AudioEncoder: lookahead_ms={lookahead_ms} must be in 0..{MAX_LOOKAHEAD_MS} ms")
        if abs(lookahead_ms / hop_ms - round(lookahead_ms / hop_ms)) > 1e-9:
            raise ValueError(f"AudioEncoder: lookahead_ms={lookahead_ms} must be a multiple of hop_ms={hop_ms}")
        if kernel_size < 1 or not dilations or min(dilations) < 1:
            raise ValueError(f"AudioEncoder: kernel_size={kernel_size}, dilations={dilations} must be >= 1")
        self.mel = LogMel(sample_rate, int(win), int(hop), n_fft, n_mels, f_min, f_max, log_floor)
        self.in_proj = nn.Conv1d(n_mels, channels, 1)
        self.convs = nn.ModuleList(nn.Conv1d(channels, channels, kernel_size, dilation=d) for d in dilations)
        self.mixes = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in dilations)
        self.norm = nn.LayerNorm(channels)
        self.out_proj = nn.Linear(channels, feature_dim)

    # ---- geometry -----------------------------------------------------------------------------
    @property
    def hop_length(self) -> int:
        """Samples per mel frame."""
        return self.mel.hop_length

    @property
    def receptive_field(self) -> int:
        """Mel frames that one output frame sees: itself and the ones before it."""
        c = self.config
        return 1 + (c.kernel_size - 1) * sum(c.dilations)

    @property
    def lookahead_frames(self) -> int:
        """Mel frames a video frame's features read past its end."""
        return round(self.config.lookahead_ms / self.config.hop_ms)

    @property
    def feature_dim(self) -> int:
        return self.config.feature_dim

    def silence(self, frames: int, device=None) -> torch.Tensor:
        """``float32 [n_mels, frames]`` of the log-mel value of silence."""
        return torch.full((self.config.n_mels, frames), self.mel.floor_value, device=device)

    # ---- compute ------------------------------------------------------------------------------
    def forward(self, log_mel: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = self.in_proj((log_mel - c.mel_offset) / c.mel_scale)  # [B, C, T]
        for conv, mix in zip(self.convs, self.mixes):
            h = mix(nn.functional.gelu(conv(x)))  # [B, C, T - (k - 1) d]
            x = x[..., x.shape[-1] - h.shape[-1]:] + h
        x = self.norm(x.transpose(1, 2))  # [B, T', C]
        return self.out_proj(x).transpose(1, 2)  # [B, D, T']


def default_encoder(seed: int = 0, **config) -> AudioEncoder:
    """An untrained :class:`AudioEncoder` with weights drawn deterministically from ``seed``.

    It stands in until a trained checkpoint ships.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AudioEncoder(**config).eval()
