"""Ports and frames: what travels along an edge of a stage graph.

A :class:`PortSpec` declares what one port carries. That is a tensor of fixed ``shape``, ``dtype`` and
``device``. A :class:`Frame` is one slot of a ring. It holds the tensor, allocated once when the graph starts.
It also holds the metadata the runtime carries from stage to stage. That is the sequence number, the
presentation time in session-clock ticks, the capture time, per-stage timings and flags.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch


class Flag(enum.IntFlag):
    """Per-frame flags."""

    NONE = 0
    END_OF_STREAM = 1
    DISCONTINUITY = 2  # pts jumps (a source skipped frames, a seek, a reset)
    INTERRUPTED = 4  # produced right after a barge-in / reset
    REPEATED = 8  # a fallback repeated an earlier frame instead of computing a new one
    KEYFRAME = 16  # an encoded video packet that decodes on its own


@dataclass(frozen=True)
class PortSpec:
    """What one port carries.

    Args:
        shape: tensor shape of one frame. ``(H, W, 3)`` is an RGB image. ``(320,)`` is 20 ms of 16 kHz
            audio. For variable-length payloads such as encoded bytes, this is the capacity. The frame's
            ``length`` then says how much of dim 0 is valid.
        dtype: ``torch.dtype`` of the tensor.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        variable: True when only ``frame.length`` elements along dim 0 are meaningful.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    variable: bool = False

    def __post_init__(self):
        shape = tuple(int(s) for s in self.shape)
        if any(s <= 0 for s in shape):
            raise ValueError(f"PortSpec shape must have positive sizes, got {self.shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "device", str(torch.device(self.device)))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * torch.empty((), dtype=self.dtype).element_size()

    def describe(self) -> str:
        kind = " variable" if self.variable else ""
        return f"{list(self.shape)} {str(self.dtype).replace('torch.', '')} on {self.device}{kind}"


class Frame:
    """One slot of a ring: a preallocated tensor and the metadata that travels with it.

    Attributes:
        data: the payload tensor, with the shape, dtype and device of the port's :class:`PortSpec`.
            Stages write into it in place. It is never reallocated while the graph runs.
        length: valid elements along dim 0. It is ``data.shape[0]`` unless the port is variable-length
            or a source ended mid-chunk.
        seq: sequence number given by the source this frame descends from, counting 0, 1, 2 and on.
        origin: index of that source in the graph.
        pts: presentation time in integer ticks of the session clock, a :class:`~.clock.Clock`.
        capture_ns: ``time.monotonic_ns()`` when the source captured or produced the data.
        stage_ns: ``int64 [n_stages, 2]`` enter and exit monotonic ns of each stage. Only stages this
            frame's lineage went through are set. The rest are 0.
        flags: :class:`Flag` bits.
        ready_event: on CUDA, the event recorded on the producer's stream after it wrote ``data``.
            The consumer's stream waits on it. There is no device-wide synchronize.
        done_event: on CUDA, the event recorded on the consumer's stream when it released the slot.
            The producer's stream waits on it before writing the slot again.
    """

    __slots__ = ("data", "length", "seq", "origin", "pts", "capture_ns", "stage_ns", "flags",
                 "ready_event", "done_event", "index")

    def __init__(self, spec: PortSpec, n_stages: int, index: int = 0):
        self.data = torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)
        self.index = index
        self.stage_ns = np.zeros((max(n_stages, 1), 2), dtype=np.int64)
        self.ready_event = self.done_event = None
        if self.data.is_cuda:
            self.ready_event, self.done_event = torch.cuda.Event(), torch.cuda.Event()
        self.reset_meta()

    def make_download(self) -> None:
        """Make this slot receive a CUDA stage's output on the host.

        Its memory is pinned, so the producer's copy into it is asynchronous. It gets a ``ready_event``. The
        producer's stream records it after the copy. The host waits for it before the consumer reads, in
        :class:`~.node.Node`. The producer never waits for its own GPU work. The host consumer waits only for
        the copy it needs.
        """
        if self.data.is_cuda or self.ready_event is not None:
            return
        self.data = self.data.pin_memory()
        self.ready_event = torch.cuda.Event()

    def reset_meta(self) -> None:
        self.length = self.data.shape[0] if self.data.dim() else 1
        self.seq = -1
        self.origin = -1
        self.pts = 0
        self.capture_ns = 0
        self.stage_ns[:] = 0
        self.flags = Flag.NONE

    def copy_meta_from(self, other: Frame) -> None:
        """Carry lineage metadata from an input frame to an output frame. The payload is not copied."""
        self.seq = other.seq
        self.origin = other.origin
        self.pts = other.pts
        self.capture_ns = other.capture_ns
        np.copyto(self.stage_ns, other.stage_ns)
        self.flags = other.flags & ~Flag.END_OF_STREAM

    @property
    def valid(self) -> torch.Tensor:
        """``data[:length]``: the meaningful part of a variable-length payload."""
        return self.data[: self.length]

    def __repr__(self) -> str:
        return (f"Frame(seq={self.seq}, pts={self.pts}, length={self.length}, "
                f"flags={self.flags!r}, data={tuple(self.data.shape)})")
