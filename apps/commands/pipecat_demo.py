"""``framegraph pipecat-demo``: the example Pipecat agent with a framegraph avatar, in the browser, all local.

    framegraph pipecat-demo                          # http://127.0.0.1:7860/ — connect, type, the avatar speaks it
    framegraph pipecat-demo --runtime onnx           # after `framegraph export --avatar assets/avatars/astronaut`

It needs ``pip install 'framegraph[pipecat]'``. This front imports no Pipecat, so ``--help`` stays quick.
"""
from __future__ import annotations

import argparse

from framegraph import assets
from framegraph.apps.argtypes import AVATAR_RUNTIMES

IMPLEMENTATION = "framegraph.apps.pipecat.cli"  # its run(args) runs the command

DEFAULT_AVATAR = str(assets.path("avatars") / "astronaut")
GREETING = "Hello! Type a sentence, and I will say it."
VIDEO_DELAY_MS = 100.0  # for SmallWebRTC → Chromium at 30 fps: docs/pipecat.md
WEBRTC_FPS = 30.0  # aiortc's VideoStreamTrack.next_timestamp: VIDEO_PTIME = 1/30 s per frame, whatever the rate


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The example agent's options. The example's own command line is this one."""
    p.add_argument("--avatar", default=DEFAULT_AVATAR, help="avatar bundle folder, portrait or video kind "
                                                            "(default: the shipped astronaut)")
    p.add_argument("--runtime", default="torch", choices=AVATAR_RUNTIMES,
                   help="where the avatar's models compute (onnx: after `framegraph export --avatar BUNDLE`; "
                        "onnx-int8: portrait bundles, after `framegraph export --avatar BUNDLE --int8`; default torch)")
    p.add_argument("--onnx-dir", default=None, help="the ONNX export to use (default BUNDLE/onnx)")
    p.add_argument("--fps", type=float, default=WEBRTC_FPS,
                   help=f"video frames per second sent (default {WEBRTC_FPS:g}: aiortc, under the SmallWebRTC "
                        f"transport, stamps every video frame 1/30 s after the last, so another rate drifts from the "
                        f"audio; the avatar's own frames are re-timed to it)")
    p.add_argument("--video-delay-ms", type=float, default=VIDEO_DELAY_MS,
                   help=f"each picture leaves this long after the audio of its time, making up for the browser's "
                        f"audio jitter buffer (default {VIDEO_DELAY_MS:g}, measured: docs/pipecat.md)")
    p.add_argument("--voice", default="en-us", help="eSpeak NG voice of the TTS (default en-us)")
    p.add_argument("--greeting", default=GREETING, help="what the bot says when a browser connects ('' for nothing)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860; 0 picks a free one)")
