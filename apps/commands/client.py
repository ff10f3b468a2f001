"""``framegraph client``: stream to a ``framegraph serve`` server, record what comes back, and measure latency."""
from __future__ import annotations

import argparse
import os

from framegraph.apps.server.config import ServerConfig

IMPLEMENTATION = "framegraph.apps.client_webrtc"  # its run(args) runs the command, over either transport

DEFAULT_URL = f"ws://{ServerConfig.host}:{ServerConfig.port}/ws"  # where `framegraph serve` listens by default


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help=f"server WebSocket URL (default {DEFAULT_URL}); with "
                                                      f"--transport webrtc the offer goes to /webrtc/offer there")
    p.add_argument("--transport", choices=["websocket", "webrtc"], default="websocket",
                   help="websocket (default) or webrtc (aiortc: Opus up, H.264/VP8 + Opus down, control on a "
                        "data channel; needs pip install 'framegraph[webrtc]')")
    p.add_argument("--pipeline", default="testcard", help="pipeline to start: testcard, scope, ... (default testcard)")
    p.add_argument("--audio", help="audio file to stream in real time (any format FFmpeg reads; sent as "
                                   "16 kHz mono PCM16); needed by pipelines with audio input")
    p.add_argument("--camera", metavar="VIDEO",
                   help="send this video file's frames as the camera (JPEG at the session fps, once; a chunk "
                        "of pictures at a time, each when the frames of the one before came back, so none is "
                        "lost to a slow model), e.g. --pipeline generate --option input=camera --option "
                        "strength=0.5; the returned stream is recorded as usual")
    p.add_argument("--seconds", type=float, help="stop after this long (default: end of the audio; testcard: 5)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to this long for the server to answer (its /healthz), e.g. right after starting "
                        "`framegraph serve &` (default 0: connect at once)")
    p.add_argument("--out", help="record the returned video and audio to this MP4")
    p.add_argument("--size", help="WIDTHxHEIGHT requested (default: the pipeline's)")
    p.add_argument("--fps", type=float, help="frames per second requested")
    p.add_argument("--codec", choices=["jpeg", "h264", "png", "webp"],
                   help="video codec requested (default jpeg; png / webp: pictures with alpha, the avatar's background "
                        "transparent — recorded without it)")
    p.add_argument("--quality", type=int, help="JPEG quality 1..100")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another pipeline option; VALUE is parsed as JSON when it can be (repeatable)")
    p.add_argument("--token", default=os.environ.get("FRAMEGRAPH_TOKEN"),
                   help="server token (default $FRAMEGRAPH_TOKEN)")
    p.add_argument("--scene", metavar="NAME",
                   help="shortcut for --pipeline scene: a .ply/.splat file name in the server's scene folder "
                        "(e.g. toy.ply), or 'random' for a random scene")
    p.add_argument("--orbit", type=float, nargs="?", const=30.0, default=None, metavar="DEG_PER_S",
                   help="(with --scene) orbit the camera by sending poses, at DEG_PER_S (default 30)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
