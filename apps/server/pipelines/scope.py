"""The ``scope`` pipeline: the client's microphone → a live waveform and level picture.

The audio is echoed back in sync. It is the glass-to-glass latency probe.
"""
from __future__ import annotations

from dataclasses import dataclass

from framegraph.stream import Clock, Graph
from framegraph.stream.media import PushAudioSource

from ..stages import AudioScope
from .base import AUDIO_CHUNK, PCM16_FORMAT, Pipeline, PipelineSpec, add_video_out
from .options import Flag, Number, VideoOptions, option


@dataclass
class ScopeOptions(VideoOptions):
    window_ms: float = option(40.0, "the span of audio the waveform shows, ms", Number(5.0, 1000.0))
    gain: float = option(1.0, "how much the waveform is magnified", Number(0.01, 100.0), live=True)
    echo: bool = option(True, "send the client's audio back, in sync with the pictures", Flag())


def build(opts: ScopeOptions) -> Pipeline:
    graph = Graph(Clock("realtime"), name="scope")
    mic = graph.add(PushAudioSource(max_buffer_ms=500, name="mic"), max_in_flight=8)
    scope = graph.add(AudioScope(width=opts.width, height=opts.height, fps=opts.fps, window_ms=opts.window_ms,
                                 gain=opts.gain))
    encoder, sink = add_video_out(graph, opts, audio_chunk=AUDIO_CHUNK if opts.echo else None)
    graph.connect(mic, scope, "audio", capacity=4)
    graph.connect(scope, encoder, "video", policy="drop_oldest")
    if opts.echo:
        graph.connect(scope, sink, "audio", capacity=8)

    def configure(changes: dict) -> dict:
        scope.gain = changes["gain"]
        return {"gain": changes["gain"]}

    return Pipeline(graph, sink, encoder=encoder, audio_in=mic, configure=configure,
                    format={"video": opts.video_format(), "audio_out": PCM16_FORMAT if opts.echo else None,
                            "audio_in": PCM16_FORMAT, "pose_in": False})


PIPELINE = PipelineSpec("scope", "microphone in → live waveform / level picture + the audio echoed back in sync "
                                 "(glass-to-glass latency probe)", ScopeOptions, build)
