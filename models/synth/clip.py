"""Write a synthetic talking clip: MP4 through a real stage graph, plus JSON.

The MP4 holds H.264 video and AAC audio at 16 kHz.

    FaceSource (renders FaceParams → uint8 [H, W, 3], pts from the frame index) ──video──▶ MP4Sink
    ArrayAudioSource (int16 [320] chunks, pts from sample counts)             ──audio──▶ MP4Sink

The JSON next to the MP4 holds the ground truth of every frame.
That is the mouth parameters, blink, head pose offsets and state label.
It also holds the segments, the phoneme / word events and the portrait's geometry.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from framegraph.stream import Clock, EndOfStream, Graph, PortSpec, Stage
from framegraph.stream.files import write_json
from framegraph.stream.media import SAMPLE_RATE, MP4Sink, chunk_samples

from .plan import ClipPlan, plan_clip
from .portrait import Portrait
from .render import PortraitRenderer
from .truth import save_portrait_image

FORMAT_VERSION = 1


class FaceSource(Stage):
    """Source: renders ``plan.faces[i]`` on the portrait → ``"video"`` ``uint8 [H, W, 3]``.

    Frame ``i`` gets ``pts = clock.ticks_from_frame(i, fps)``.
    """

    def __init__(self, renderer: PortraitRenderer, plan: ClipPlan, *, torch_threads: int | None = 1,
                 name: str = "face"):
        super().__init__(name)
        self.renderer, self.plan, self.torch_threads = renderer, plan, torch_threads
        self.outputs = {"video": PortSpec((renderer.h, renderer.w, 3), torch.uint8, "cpu")}
        self.index = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.index = 0

    def process(self, inputs, out):
        if self.index >= self.plan.n_frames:
            raise EndOfStream
        frame = out.write("video")
        frame.data.copy_(self.renderer.render(self.plan.faces[self.index]))
        frame.pts = self.ctx.clock.ticks_from_frame(self.index, self.plan.fps)
        self.index += 1


class ArrayAudioSource(Stage):
    """Source: an int16 array as ``"audio"`` ``int16 [chunk]`` chunks. Pts come from sample counts.

    The last chunk is zero-padded, with ``length`` set to its real samples.
    """

    def __init__(self, samples: np.ndarray, *, sample_rate: int = SAMPLE_RATE, chunk_ms: int = 20, name: str = "audio"):
        super().__init__(name)
        self.samples = np.ascontiguousarray(samples, dtype=np.int16)
        self.sample_rate = sample_rate
        self.chunk = chunk_samples(sample_rate, chunk_ms)
        self.outputs = {"audio": PortSpec((self.chunk,), torch.int16, "cpu")}
        self.sent = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.sent = 0

    def process(self, inputs, out):
        n = min(self.chunk, len(self.samples) - self.sent)
        if n <= 0:
            raise EndOfStream
        frame = out.write("audio")
        frame.data.zero_()
        frame.data[:n] = torch.from_numpy(self.samples[self.sent:self.sent + n])
        frame.length = n
        frame.pts = self.ctx.clock.ticks_from_samples(self.sent, self.sample_rate)
        self.sent += n


@dataclass
class ClipJob:
    """One clip to write: its plan, graph and output paths; see :func:`prepare_clip`."""

    plan: ClipPlan
    graph: Graph
    sink: MP4Sink
    video_path: str
    json_path: str
    meta: dict

    def write_ground_truth(self) -> None:
        """Write the JSON ground truth, after the graph has run."""
        gt = {"format_version": FORMAT_VERSION, **self.meta, "video": os.path.basename(self.video_path),
              "width": self.sink.width, "height": self.sink.height, **self.plan.ground_truth()}
        write_json(self.json_path, gt, indent=1)


def clip_seed(seed: int, index: int) -> np.random.Generator:
    """The random generator of clip ``index`` of a run with ``seed``. The streams are independent."""
    return np.random.default_rng([int(seed), int(index)])


def prepare_clip(out_dir: str, index: int, *, seconds: float, fps: int, portrait: Portrait, seed: int,
                 renderer: PortraitRenderer | None = None, preset: str = "offline") -> ClipJob:
    """Plan clip ``index`` and build the graph that writes ``out_dir/clip_{index:05d}.mp4``.

    Run it with ``job.graph.run()`` or a progress runner, then ``job.write_ground_truth()``.
    """
    plan = plan_clip(seconds, fps, clip_seed(seed, index))
    renderer = renderer or PortraitRenderer(portrait)
    stem = os.path.join(out_dir, f"clip_{index:05d}")
    graph = Graph(Clock("fast"), name=f"synth clip {index}")
    face = graph.add(FaceSource(renderer, plan))
    audio = graph.add(ArrayAudioSource(plan.audio, sample_rate=plan.sample_rate))
    sink = graph.add(MP4Sink(stem + ".mp4", width=renderer.w, height=renderer.h, fps=fps,
                             audio_rate=plan.sample_rate, preset=preset))
    graph.connect(face, sink, "video")
    graph.connect(audio, sink, "audio", capacity=8)
    meta = {"clip": index, "seed": int(seed), "portrait": portrait.to_json()}
    save_portrait_image(out_dir, portrait)  # the exact image drawn on: frames can be redrawn without the codec
    return ClipJob(plan, graph, sink, stem + ".mp4", stem + ".json", meta)


def make_clip(out_dir: str, index: int = 0, *, seconds: float = 4.0, fps: int = 25, portrait: Portrait,
              seed: int = 0, renderer: PortraitRenderer | None = None) -> ClipJob:
    """Plan, render and write one clip, MP4 + JSON, without a progress bar. Returns the job."""
    os.makedirs(out_dir, exist_ok=True)
    job = prepare_clip(out_dir, index, seconds=seconds, fps=fps, portrait=portrait, seed=seed, renderer=renderer)
    job.graph.run()
    job.write_ground_truth()
    return job
