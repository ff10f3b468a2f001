"""The video avatar's base frames: the person's own frames played back and forth.

    state [4] ──▶ VideoLoop ──frame uint8 [H, W, 3]──▶ ...
                           ├──box   int32 [4]─────────────▶   (the mouth region's box in that frame)
                           └──kept_share  float32 [L, L]──▶   (the share of the box kept from the frame: below its
                                                                 jaw line; with ``jaws``)

:class:`LoopCursor` is the plan, frame by frame. It is a **ping-pong** over the loop frames ``0 .. N-1``: ``0, 1, ...,
N-1, N-2, ..., 1, 0, 1, ...``. Every step goes to a neighbouring frame of the recording. So head motion and blinks are
the person's own. No turn is a jump. While the avatar does not speak, the cursor ping-pongs inside the **idle range**
``[a, b)``. That is a stretch of the video with the mouth at rest.

The avatar may go silent outside it. Then the cursor jumps to the idle frame most like the current one. The
``nearest_idle`` table holds those: the smallest pixel difference on small copies. It cross-fades over ``fade`` frames
from the frame it left, which is held. So no step is larger than the loop's own motion plus ``1 / (fade + 1)`` of that
difference. That difference is already small. Back in speech, the cursor carries on from where it is. It covers the
whole range.
"""
from __future__ import annotations

import numpy as np
import torch

from framegraph.models.audio import SPEAKING
from framegraph.models.audio.frontend import STATE_DIM
from framegraph.stream import PortSpec, Stage

from .jaw import kept_share


def pingpong_next(i: int, step: int, lo: int, hi: int) -> tuple[int, int]:
    """One step of a ping-pong over ``lo .. hi - 1``. It starts at frame ``i``, going ``step``, +1 or -1.

    Returns the next frame and direction. It turns at the ends. A one-frame range stays put."""
    if hi - lo <= 1:
        return lo, step
    if not lo <= i < hi:
        return min(max(i, lo), hi - 1), step
    j = i + step
    if j < lo or j >= hi:
        step = -step
        j = i + step
    return j, step


def nearest_frames(thumbs: np.ndarray, candidates: range) -> np.ndarray:
    """The index in ``candidates`` most like each frame ``t`` of ``thumbs [N, h, w(, 3)]``: ``int64 [N]``.

    Most like means the smallest mean absolute difference."""
    x = thumbs.reshape(len(thumbs), -1).astype(np.float32)
    c = x[list(candidates)]
    out = np.empty(len(x), np.int64)
    for t in range(len(x)):
        out[t] = candidates[int(np.abs(c - x[t]).mean(1).argmin())]
    return out


class LoopCursor:
    """Which loop frame or frames to show next; see the module docstring.

    Args:
        n_frames: N loop frames.
        idle: ``(a, b)``, the idle range, with ``0 <= a < b <= N``.
        nearest_idle: ``int [N]``, the idle frame most like each frame. Default: the nearest in time.
        fade: frames of the cross-fade when jumping into the idle range.

    :meth:`step` (``speaking``) → ``[(frame, weight), ...]``. That is one frame with weight 1, or two during a
    cross-fade. The weights sum to 1.
    """

    def __init__(self, n_frames: int, idle: tuple[int, int], nearest_idle=None, fade: int = 4):
        a, b = int(idle[0]), int(idle[1])
        if n_frames < 1 or not 0 <= a < b <= n_frames:
            raise ValueError(f"LoopCursor: idle range {idle} must lie inside the {n_frames} loop frames")
        self.n, self.idle, self.fade = int(n_frames), (a, b), max(0, int(fade))
        if nearest_idle is None:
            nearest_idle = np.clip(np.arange(n_frames), a, b - 1)
        self.nearest_idle = np.asarray(nearest_idle, np.int64)
        self.reset()

    def reset(self, start: int = 0) -> None:
        self.i, self.dir = int(start), 1
        self.old: int | None = None  # the frame left behind, held while it fades out
        self.left = 0

    def step(self, speaking: bool) -> list[tuple[int, float]]:
        lo, hi = (0, self.n) if speaking else self.idle
        if not speaking and not lo <= self.i < hi:  # into the idle range: jump to the most similar frame
            self.old = self.i
            self.i = int(self.nearest_idle[self.i])
            self.left = self.fade
        else:
            self.i, self.dir = pingpong_next(self.i, self.dir, lo, hi)
        if self.left > 0 and self.old is not None:
            w_new = 1.0 - self.left / (self.fade + 1)
            self.left -= 1
            return [(self.i, w_new), (self.old, 1.0 - w_new)]
        self.old = None
        return [(self.i, 1.0)]


class VideoLoop(Stage):
    """The loop frames as a stream: one base frame and its region box per incoming state.

    Args:
        frames: ``uint8 [N, H, W, 3]``, the loop frames at source resolution.
        boxes: ``int [N, 4]``, (x, y, w, h) px of the mouth region in each frame. Width and height are the same for all.
        idle / nearest_idle / fade: see :class:`LoopCursor`.
        mattes: ``uint8 [N, H, W]``, each frame's person matte, or None. Given, the matte of the frame shown
            leaves on an ``"alpha"`` port. In a cross-fade it is blended as the frames are.
        jaws: ``float [N, M, 2]``, each frame's jaw line in px of the frame, or None. Given, a ``"kept_share"`` port
            sends the frame's kept share of the box. It is :func:`~.jaw.kept_share` of the jaw line, blended as the
            frames are. It is made here on the CPU. So the device path reads no value back. It is made once per loop
            frame and kept in ``kept_shares``. A frame shown again sends the same share. A cross-fade's share is made
            as it comes.
        kept_shares: where the drawn shares are kept: (loop frame, its box) -> ``float32 [L, L]``. Default: this
            stage's own dict. A bundle passes its own. So a later session finds the shares an earlier one drew.
        index: also send which loop frame is shown. It goes on an ``"index"`` port, ``int64 [1]`` on the CPU. In a
            cross-fade it is the one of larger weight. It serves a model that keeps something per loop frame.

    Ports: in ``"state"`` ``float32 [4]`` on the CPU. It means speaking when its one-hot says so. Out go
    ``"frame"`` ``uint8 [H, W, 3]`` and ``"box"`` ``int32 [4]``. With their options, ``"alpha"`` ``uint8 [H, W]``
    and ``"kept_share"`` ``float32 [L, L]`` go out too. Outputs are on ``device`` and keep the state's pts and flags.
    The loop frames stay on the CPU; each is uploaded as it is picked.

    A stream starts at the idle range's first frame. Streams start silent, so no cross-fade into it delays the
    first frame. A barge-in (``reset()``) leaves the cursor where it is. The silence that follows eases it into
    the idle range. A jump back to the start would show as a cut.
    """

    def __init__(self, frames: torch.Tensor, boxes, idle: tuple[int, int], *, nearest_idle=None, fade: int = 4,
                 mattes: torch.Tensor | None = None, jaws=None, kept_shares: dict[tuple, torch.Tensor] | None = None,
                 index: bool = False, device: str = "cpu", name: str = "loop"):
        super().__init__(name)
        self.frames = torch.as_tensor(frames)
        if self.frames.dtype != torch.uint8 or self.frames.dim() != 4 or self.frames.shape[3] != 3:
            raise ValueError(f"VideoLoop: frames must be uint8 [N, H, W, 3], got {self.frames.dtype} "
                             f"{list(self.frames.shape)}")
        self.boxes = torch.as_tensor(np.asarray(boxes), dtype=torch.float32)
        if tuple(self.boxes.shape) != (len(self.frames), 4):
            raise ValueError(f"VideoLoop: boxes are {list(self.boxes.shape)}; expected [{len(self.frames)}, 4]")
        self.cursor = LoopCursor(len(self.frames), idle, nearest_idle, fade)
        H, W = self.frames.shape[1:3]
        self.inputs = {"state": PortSpec((STATE_DIM,), torch.float32, "cpu")}
        self.outputs = {"frame": PortSpec((H, W, 3), torch.uint8, device), "box": PortSpec((4,), torch.int32, device)}
        self.mattes = None
        if mattes is not None:
            if mattes.dtype != torch.uint8 or tuple(mattes.shape) != (len(self.frames), H, W):
                raise ValueError(f"VideoLoop: mattes are {mattes.dtype} {list(mattes.shape)}; expected uint8 "
                                 f"[{len(self.frames)}, {H}, {W}]")
            self.mattes = mattes
            self.outputs["alpha"] = PortSpec((H, W), torch.uint8, device)
        self.jaws = None  # float32 [N, M, 2] on the host: the kept share is drawn there (numpy, OpenCV)
        if jaws is not None:
            self.jaws = np.asarray(jaws, np.float32)
            if self.jaws.ndim != 3 or len(self.jaws) != len(self.frames) or self.jaws.shape[2] != 2:
                raise ValueError(f"VideoLoop: jaws are {list(self.jaws.shape)}; expected [{len(self.frames)}, M, 2]")
            L = int(round(float(self.boxes[0, 2])))
            self.outputs["kept_share"] = PortSpec((L, L), torch.float32, device)
        # (loop frame, box) -> its kept share (drawing one takes ms)
        self._kept_shares = {} if kept_shares is None else kept_shares
        if index:
            self.outputs["index"] = PortSpec((1,), torch.int64, "cpu")

    def setup(self, ctx):
        super().setup(ctx)
        self.cursor.reset(start=self.cursor.idle[0])

    def process(self, inputs, out):
        speaking = int(torch.argmax(inputs["state"].data[:3])) == SPEAKING
        picks = self.cursor.step(speaking)
        frame, box = out.write("frame"), out.write("box")
        alpha = out.write("alpha") if self.mattes is not None else None
        if self.jaws is not None:
            out.write("kept_share").data.copy_(self.kept_share(picks), non_blocking=True)
        if "index" in self.outputs:
            out.write("index").data.fill_(max(picks, key=lambda p: p[1])[0])
        if len(picks) == 1:
            i = picks[0][0]
            frame.data.copy_(self.frames[i])
            box.data.copy_(self.boxes[i].round().to(torch.int32))
            if alpha is not None:
                alpha.data.copy_(self.mattes[i])
            return
        (i, wi), (j, wj) = picks
        frame.data.copy_(_blend(self.frames, picks))
        box.data.copy_((self.boxes[i] * wi + self.boxes[j] * wj).round().to(torch.int32))
        if alpha is not None:
            alpha.data.copy_(_blend(self.mattes, picks))

    def kept_share(self, picks: list[tuple[int, float]]) -> torch.Tensor:
        """``float32 [L, L]``: :func:`~.jaw.kept_share` of the blended jaw line at the blended box.

        It is blended as the frame of ``picks``, the cursor's ``(i, w)``, is blended."""
        box = np.round(sum(self.boxes[i].numpy() * w for i, w in picks))
        key = (picks[0][0], *box.astype(int).tolist())  # a frame's share at its box (a copy may move the boxes)
        if len(picks) == 1 and key in self._kept_shares:
            return self._kept_shares[key]
        share = kept_share(sum(self.jaws[i] * w for i, w in picks), box)
        if len(picks) == 1:
            self._kept_shares[key] = share
        return share


def _blend(images: torch.Tensor, picks: list[tuple[int, float]]) -> torch.Tensor:
    """``uint8`` ``sum(w · images[i])`` over the ``(i, w)`` of a cross-fade, rounded."""
    blended = sum(images[i].float() * w for i, w in picks)
    return blended.round_().clamp_(0, 255).to(torch.uint8)


__all__ = ["pingpong_next", "nearest_frames", "LoopCursor", "VideoLoop"]
