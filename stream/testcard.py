"""The test card: procedural video and audio whose sync can be measured from the output file.

The video has moving colour bands and a frame counter. The first frame of every second is a full white
**flash**. The audio is a quiet 220 Hz tone. A loud 1 kHz **beep** starts exactly at each flash frame's pts.
It lasts one frame period. A decoder finds the flashes as bright frames and the beep onsets as loud audio. It
checks that they coincide. That measures A/V sync end to end.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from .frame import PortSpec
from .media.audio import SAMPLE_RATE, chunk_samples
from .stage import EndOfStream, Stage

TONE_HZ, TONE_AMP = 220.0, 0.1
BEEP_HZ, BEEP_AMP = 1000.0, 0.8

# 7-segment digits: segments a b c d e f g (top, top-right, bottom-right, bottom, bottom-left, top-left,
# middle).
_SEGMENTS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def flash_frames(fps, n_frames: int) -> list[int]:
    """Indices of the flash frames: the first frame at or after each whole second."""
    fps = Fraction(fps).limit_denominator(1001)
    return [i for i in range(n_frames) if i == 0 or math.floor(i / fps) > math.floor((i - 1) / fps)]


def _digit_masks(h: int) -> torch.Tensor:
    """``bool [10, h, w]`` seven-segment glyphs of height ``h`` and width h/2."""
    w, t = max(3, h // 2), max(1, h // 8)
    masks = torch.zeros(10, h, w, dtype=torch.bool)
    mid = h // 2
    boxes = {"a": (0, t, 0, w), "d": (h - t, h, 0, w), "g": (mid - t // 2, mid - t // 2 + t, 0, w),
             "f": (0, mid, 0, t), "b": (0, mid, w - t, w), "e": (mid, h, 0, t), "c": (mid, h, w - t, w)}
    for d, segs in enumerate(_SEGMENTS):
        for s in segs:
            y0, y1, x0, x1 = boxes[s]
            masks[d, y0:y1, x0:x1] = True
    return masks


class TestCardVideo(Stage):
    """Source: ``uint8 [H, W, 3]`` test-card frames at ``fps`` for ``seconds``.

    The pts comes from the frame index.
    """

    __test__ = False  # not a pytest class

    def __init__(self, *, width: int, height: int, fps: float, seconds: float, device: str = "cpu",
                 name: str = "testcard_video"):
        super().__init__(name)
        self.width, self.height = width, height
        self.fps = Fraction(fps).limit_denominator(1001)
        self.n_frames = round(seconds * self.fps)
        self.flashes = set(flash_frames(self.fps, self.n_frames))
        self.outputs = {"video": PortSpec((height, width, 3), torch.uint8, device)}
        self.index = 0

    def setup(self, ctx):
        super().setup(ctx)
        dev = ctx.device
        self.index = 0
        y = torch.linspace(0, 1, self.height, device=dev).view(-1, 1)
        x = torch.linspace(0, 1, self.width, device=dev).view(1, -1)
        self._x, self._y = x, y
        self._digit_h = max(8, self.height // 8)
        self._digits = _digit_masks(self._digit_h).to(dev)

    def process(self, inputs, out):
        i = self.index
        if i >= self.n_frames:
            raise EndOfStream
        frame = out.write("video")
        img = frame.data
        if i in self.flashes:
            img.fill_(255)
        else:
            phase = i / float(self.fps) * 0.5
            two_pi = 2 * math.pi
            for c, (fx, fy, off) in enumerate(((2.0, 0.5, 0.0), (1.0, 1.5, 2.1), (0.5, 2.0, 4.2))):
                band = torch.sin(two_pi * (fx * self._x + fy * self._y - phase) + off)
                img[..., c] = (96 + 80 * band).to(torch.uint8)
            self._draw_counter(img, i)
        frame.pts = self.ctx.clock.ticks_from_frame(i, self.fps)
        self.index += 1

    def _draw_counter(self, img: torch.Tensor, n: int) -> None:
        h = self._digit_h
        w = self._digits.shape[2]
        x = h // 4
        for ch in str(n):
            if x + w > self.width:
                break
            region = img[h // 4:h // 4 + h, x:x + w]
            region[self._digits[int(ch)]] = 255
            x += w + max(2, w // 3)


class TestCardAudio(Stage):
    """Source: ``int16 [chunk]`` mono PCM — a 220 Hz tone with a 1 kHz beep at each flash frame."""

    __test__ = False

    def __init__(self, *, fps: float, seconds: float, sample_rate: int = SAMPLE_RATE, chunk_ms: int = 20,
                 device: str = "cpu", name: str = "testcard_audio"):
        super().__init__(name)
        self.fps = Fraction(fps).limit_denominator(1001)
        self.sample_rate = sample_rate
        self.chunk = chunk_samples(sample_rate, chunk_ms)
        self.n_samples = round(seconds * sample_rate)
        n_frames = round(seconds * self.fps)
        beep_len = round(sample_rate / self.fps)
        self.beeps = [(round(i * sample_rate / self.fps), beep_len) for i in flash_frames(self.fps, n_frames)]
        self.outputs = {"audio": PortSpec((self.chunk,), torch.int16, device)}
        self.sent = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.sent = 0
        self._t = torch.arange(self.chunk, dtype=torch.float64, device=ctx.device)

    def process(self, inputs, out):
        start = self.sent
        if start >= self.n_samples:
            raise EndOfStream
        n = min(self.chunk, self.n_samples - start)
        idx = self._t + start
        t = idx / self.sample_rate
        wave = TONE_AMP * torch.sin(2 * math.pi * TONE_HZ * t)
        for b0, blen in self.beeps:
            if b0 < start + self.chunk and b0 + blen > start:
                on = (idx >= b0) & (idx < b0 + blen)
                wave = torch.where(on, BEEP_AMP * torch.sin(2 * math.pi * BEEP_HZ * t), wave)
        frame = out.write("audio")
        frame.data.copy_((wave * 32767).round().to(torch.int16))
        frame.data[n:] = 0
        frame.length = n
        frame.pts = self.ctx.clock.ticks_from_samples(start, self.sample_rate)
        self.sent += n
