"""The ``testcard`` pipeline: the stream test card, video and audio out. It is the smallest whole pipeline.

The card has moving bands and a frame counter. It flashes white each second, with a beep exactly on it.
"""
from __future__ import annotations

from dataclasses import dataclass

from framegraph.stream import Clock, Graph
from framegraph.stream.testcard import TestCardAudio, TestCardVideo

from .base import AUDIO_CHUNK, PCM16_FORMAT, Pipeline, PipelineSpec, add_video_out
from .options import Flag, Number, VideoOptions, option


@dataclass
class TestcardOptions(VideoOptions):
    seconds: float = option(600.0, "how long the card plays; the session then ends (finished)", Number(0.1, 24 * 3600))
    audio: bool = option(True, "send the card's tone (a beep on each flash)", Flag())


def build(opts: TestcardOptions) -> Pipeline:
    graph = Graph(Clock("realtime"), name="testcard")
    card = graph.add(TestCardVideo(width=opts.width, height=opts.height, fps=opts.fps, seconds=opts.seconds),
                     max_in_flight=2)
    encoder, sink = add_video_out(graph, opts, audio_chunk=AUDIO_CHUNK if opts.audio else None)
    graph.connect(card, encoder, "video", policy="drop_oldest")
    if opts.audio:
        tone = graph.add(TestCardAudio(fps=opts.fps, seconds=opts.seconds), max_in_flight=8)
        graph.connect(tone, sink, "audio", capacity=8)
    return Pipeline(graph, sink, encoder=encoder,
                    format={"video": opts.video_format(), "audio_out": PCM16_FORMAT if opts.audio else None,
                            "audio_in": None, "pose_in": False, "seconds": opts.seconds})


PIPELINE = PipelineSpec("testcard", "the stream test card: moving bands, frame counter, a flash each second with a "
                                    "beep on it", TestcardOptions, build)
