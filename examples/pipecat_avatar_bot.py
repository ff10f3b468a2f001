"""A Pipecat voice agent with a framegraph avatar, running offline: type a sentence, the avatar says it.

    python examples/pipecat_avatar_bot.py            # or: framegraph pipecat-demo
    → open http://127.0.0.1:7860/, press Connect, type in the chat box

Everything is local and needs no key: Pipecat's own SmallWebRTC transport and its prebuilt browser client
(``pipecat-ai[webrtc,runner]``), eSpeak NG as the TTS (``EspeakTTSService``), and ``FramegraphAvatar`` between the
TTS and the transport, drawing the shipped astronaut (``--avatar DIR`` for your own bundle, ``--runtime onnx``
for ONNX Runtime). Options: ``framegraph pipecat-demo --help``.

The pipeline is a voice agent's with the listening and thinking parts left out::

    transport.input() → SpeakTypedText → TTS → FramegraphAvatar → transport.output()

In a real agent, an STT and an LLM stand where ``SpeakTypedText`` is (and the context aggregators around the
LLM), any Pipecat TTS replaces eSpeak NG, and the avatar stays where it is::

    transport.input() → stt → context.user() → llm → tts → FramegraphAvatar(...) → transport.output()
        → context.assistant()

with ``audio_in_enabled=True`` on the transport and, for barge-in, a VAD / turn analyzer on its input (the
``InterruptionFrame`` it causes makes the avatar drop what it was saying and close its mouth).
"""
from __future__ import annotations

import argparse
import sys

from pipecat.frames.frames import (
    Frame,
    LLMConfigureOutputFrame,
    LLMMessagesAppendFrame,
    TTSSpeakFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.processors.frameworks.rtvi.frames import RTVISendTextFrame
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
from pipecat.workers.runner import WorkerRunner

from framegraph.apps.commands.pipecat_demo import add_arguments
from framegraph.apps.pipecat import EspeakTTSService, FramegraphAvatar
from framegraph.apps.pipecat.webrtc import Server, build_app


class SpeakTypedText(FrameProcessor):
    """Stands where the STT and the LLM go: what the user types in the browser (RTVI ``send-text``) is said as it is."""

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, RTVISendTextFrame):
            await self.push_frame(TTSSpeakFrame(frame.text))
        elif not isinstance(frame, (LLMMessagesAppendFrame, LLMConfigureOutputFrame)):  # for an LLM: none here
            await self.push_frame(frame, direction)


async def run_bot(connection, args) -> None:
    """One browser session: the pipeline on its WebRTC connection, until the browser leaves."""
    avatar = FramegraphAvatar(args.avatar, runtime=args.runtime, onnx_dir=args.onnx_dir, fps=args.fps,
                              video_delay_ms=args.video_delay_ms)
    transport = SmallWebRTCTransport(webrtc_connection=connection, params=TransportParams(
        audio_out_enabled=True, video_out_enabled=True, video_out_is_live=True,
        video_out_width=avatar.width, video_out_height=avatar.height, video_out_framerate=avatar.fps))
    tts = EspeakTTSService(voice=args.voice)
    pipeline = Pipeline([transport.input(), SpeakTypedText(), tts, avatar, transport.output()])
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_out_sample_rate=24_000))

    @transport.event_handler("on_client_connected")
    async def greet(transport, client):
        if args.greeting:
            await worker.queue_frame(TTSSpeakFrame(args.greeting))

    @transport.event_handler("on_client_disconnected")
    async def leave(transport, client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


def serve_agent(args, server: Server | None = None) -> int:
    """Load the avatar once (a missing bundle or ONNX export stops here, saying what to do), then serve browsers."""
    FramegraphAvatar(args.avatar, runtime=args.runtime, onnx_dir=args.onnx_dir)  # the bundle stays loaded
    server = server or Server(build_app(lambda connection: run_bot(connection, args)), args.host, args.port)
    try:
        server.run(on_ready=lambda url: print(f"framegraph pipecat-demo: open {url} (Ctrl-C stops)", flush=True))
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    add_arguments(parser)
    return serve_agent(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
