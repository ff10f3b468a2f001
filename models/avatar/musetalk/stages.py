"""MuseTalk's stage: the loop frame with its face redrawn for the frame's audio context.

    context float32 [N, D] ──┐
    frame uint8 [H, W, 3] ───┼──▶ MuseTalkFace ──video uint8 [H, W, 3]──▶   (and alpha, passed on)
    index int64 [1] ─────────┘

Per frame: the shown loop frame's latents (prepared once, :mod:`.prepare`), the UNet at timestep 0 with the context
as cross-attention and the VAE decode (:class:`~.step.MuseTalkStep`), the face pasted into the frame at that loop
frame's box by its blend mask (:func:`~.face.paste_face`).
"""
from __future__ import annotations

import torch

from framegraph.stream import PortSpec, Stage

from .face import paste_face


class MuseTalkFace(Stage):
    """See the module docstring.

    Args:
        avatar: the :class:`~.bundle.MuseTalkAvatar` (its latents, boxes and masks per loop frame).
        step: the :class:`~.step.MuseTalkStep` on ``device`` (an engine's, :mod:`.engines`); ``dtype`` its precision.
        context_rows: N, the rows of a frame's context (ROWS × Whisper's layers + 1: 50 for whisper-tiny).
        max_lag_ms: live streams: a frame with a newer one behind it, or whose audio is older than this, is skipped
            (:meth:`~framegraph.stream.Stage.stale`). out_device: where the picture goes (default ``device``).
        matte: the loop frame's person matte comes in on ``"alpha"`` and leaves beside the picture.

    Ports: in ``"context"`` ``float32 [N, D]``, ``"frame"`` ``uint8 [H, W, 3]``, ``"index"`` ``int64 [1]`` (and
    ``"alpha"`` ``uint8 [H, W]``); out ``"video"`` ``uint8 [H, W, 3]`` (and ``"alpha"``), at the frame's pts.
    """

    def __init__(self, avatar, step, context_rows: int, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 out_device: str | None = None, max_lag_ms: float | None = None, matte: bool = False,
                 name: str = "musetalk_face"):
        super().__init__(name)
        out_device = out_device or device
        self.step, self.dtype, self.device, self.max_lag_ms = step, dtype, torch.device(device), max_lag_ms
        self.latents = avatar.latents.to(device, dtype)
        self.boxes = [tuple(int(v) for v in b) for b in avatar.boxes]
        self.masks = [torch.from_numpy(m).to(device) for m in avatar.masks]
        H, W = avatar.height, avatar.width
        rows, width = step.code.shape[0], step.unet.config.cross_attention_dim
        self.inputs = {"context": PortSpec((context_rows, width), torch.float32, device),
                       "frame": PortSpec((H, W, 3), torch.uint8, device), "index": PortSpec((1,), torch.int64, "cpu")}
        self.outputs = {"video": PortSpec((H, W, 3), torch.uint8, out_device)}
        if context_rows > rows:
            raise ValueError(f"MuseTalkFace: {context_rows} context rows; the step's code holds {rows}")
        if matte:
            self.inputs["alpha"] = PortSpec((H, W), torch.uint8, device)
            self.outputs["alpha"] = PortSpec((H, W), torch.uint8, out_device)
        self.frames_skipped = 0

    @torch.inference_mode()
    def picture(self, context: torch.Tensor, frame: torch.Tensor, i: int) -> torch.Tensor:
        """``uint8 [H, W, 3]``: loop frame ``i`` (``frame``, as shown) with its face drawn for ``context``."""
        face = self.step(self.latents[i:i + 1], context[None].to(self.device, self.dtype))[0]
        return paste_face(frame, face, self.boxes[i], self.masks[i])

    def process(self, inputs, out):
        frame = inputs["frame"]
        if self.stale(frame, "frame", self.max_lag_ms):
            self.frames_skipped += 1
            return
        i = int(inputs["index"].data[0])
        out.write("video").data.copy_(self.picture(inputs["context"].data, frame.data, i), non_blocking=True)
        if "alpha" in self.outputs:
            out.write("alpha").data.copy_(inputs["alpha"].data, non_blocking=True)


__all__ = ["MuseTalkFace"]
