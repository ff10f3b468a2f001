"""MuseTalk's stage: the loop frame with its face redrawn for the frame's audio context.

    context float32 [N, D] ──┐
    frame uint8 [H, W, 3] ───┼──▶ MuseTalkFace ──video uint8 [H, W, 3]──▶   (and alpha, passed on)
    index int64 [1] ─────────┘

Per frame, the stage takes the shown loop frame's latents, prepared once by :mod:`.prepare`. The UNet runs at
timestep 0 with the context as cross-attention. The VAE decodes; see :class:`~.step.MuseTalkStep`. The face is
pasted into the frame at that loop frame's box, by its blend mask. See :func:`~.face.paste_face`.
"""
from __future__ import annotations

import torch

from framegraph.stream import PortSpec, Stage
from framegraph.stream.batching import BatchClient, Missed, frame_deadline_ns

from .face import paste_face


class MuseTalkFace(Stage):
    """The loop frame with its face redrawn for the frame's audio context. See the module docstring.

    Args:
        avatar: the :class:`~.bundle.MuseTalkAvatar`. It gives the latents, boxes and masks per loop frame.
        step: what draws the face. It is the :class:`~.step.MuseTalkStep` on ``device``, or what is called as it
            is; see :mod:`.engines`. A :class:`~framegraph.stream.batching.BatchClient` from
            :func:`~.engines.batched_step` is opened at setup and closed at teardown. It gets the frame's deadline.
            A frame the batch cannot make in time is skipped.
        context_shape: ``(N, D)`` of a frame's context. N is ROWS × Whisper's layers + 1, 50 for whisper-tiny.
        dtype: the step's precision.
        device: where the step runs. The context and the frame arrive there.
        out_device: where the picture goes. The default is ``device``.
        max_lag_ms: for live streams. A frame is skipped when a newer one is behind it. So is a frame whose audio
            is older than this. See :meth:`~framegraph.stream.Stage.stale`.
        matte: the loop frame's person matte comes in on ``"alpha"``. It leaves beside the picture.

    Raises :class:`ValueError` when the context has more rows than the step takes.

    Ports: in ``"context"`` ``float32 [N, D]``, ``"frame"`` ``uint8 [H, W, 3]`` and ``"index"`` ``int64 [1]``.
    Out ``"video"`` ``uint8 [H, W, 3]``, at the frame's pts. With ``matte``, ``"alpha"`` ``uint8 [H, W]`` comes in
    and leaves too.
    """

    def __init__(self, avatar, step, context_shape: tuple[int, int], *, dtype: torch.dtype = torch.float32,
                 device: str = "cpu", out_device: str | None = None, max_lag_ms: float | None = None,
                 matte: bool = False, name: str = "musetalk_face"):
        super().__init__(name)
        out_device = out_device or device
        self.step, self.dtype, self.device, self.max_lag_ms = step, dtype, torch.device(device), max_lag_ms
        self.batched = isinstance(step, BatchClient)
        self.latents = avatar.latents.to(device, dtype)
        self.boxes = [tuple(int(v) for v in b) for b in avatar.boxes]
        self.masks = [torch.from_numpy(m).to(device) for m in avatar.masks]
        H, W = avatar.height, avatar.width
        self.context_shape = tuple(int(v) for v in context_shape)
        self.inputs = {"context": PortSpec(self.context_shape, torch.float32, device),
                       "frame": PortSpec((H, W, 3), torch.uint8, device), "index": PortSpec((1,), torch.int64, "cpu")}
        self.outputs = {"video": PortSpec((H, W, 3), torch.uint8, out_device)}
        most = getattr(step, "max_rows", None)
        if most is not None and self.context_shape[0] > most:
            raise ValueError(f"MuseTalkFace: {self.context_shape[0]} context rows; the step takes at most {most}")
        if matte:
            self.inputs["alpha"] = PortSpec((H, W), torch.uint8, device)
            self.outputs["alpha"] = PortSpec((H, W), torch.uint8, out_device)
        self.frames_skipped = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.frames_skipped = 0
        if self.batched:
            self.step.open()
            context = torch.zeros(1, *self.context_shape, dtype=self.dtype, device=self.device)
            self.step.lane.warm_once((self.latents[:1], context))  # the lane's cost per batch size, once per lane

    def teardown(self) -> None:
        if self.batched:
            self.step.close()

    def interrupt(self) -> None:
        if self.batched:
            self.step.cancel()  # a call waiting on the batch returns now

    @torch.inference_mode()
    def picture(self, context: torch.Tensor, frame: torch.Tensor, i: int) -> torch.Tensor:
        """``uint8 [H, W, 3]``: loop frame ``i`` with its face drawn for ``context``.

        ``frame`` is that loop frame as shown."""
        face = self.step(self.latents[i:i + 1], context[None].to(self.device, self.dtype))[0]
        return paste_face(frame, face, self.boxes[i], self.masks[i])

    def process(self, inputs, out):
        frame = inputs["frame"]
        if self.stale(frame, "frame", self.max_lag_ms):
            self.frames_skipped += 1
            return
        i = int(inputs["index"].data[0])
        if self.batched:  # live: the frame's deadline is its audio's arrival plus the lag it allows
            self.step.deadline_ns = frame_deadline_ns(frame, self.max_lag_ms, self.ctx.clock.mode)
        try:
            picture = self.picture(inputs["context"].data, frame.data, i)
        except Missed:
            self.frames_skipped += 1
            return
        out.write("video").data.copy_(picture, non_blocking=True)
        if "alpha" in self.outputs:
            out.write("alpha").data.copy_(inputs["alpha"].data, non_blocking=True)


__all__ = ["MuseTalkFace"]
