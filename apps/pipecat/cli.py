"""``framegraph pipecat-demo``: the example Pipecat agent with a framegraph avatar, in the browser, all local.

    framegraph pipecat-demo                          # http://127.0.0.1:7860/ — connect, type, the avatar speaks it
    framegraph pipecat-demo --runtime onnx           # after `framegraph export --avatar assets/avatars/astronaut`

It runs ``examples/pipecat_avatar_bot.py`` of the source checkout (the same as ``python
examples/pipecat_avatar_bot.py``): Pipecat's SmallWebRTC transport and prebuilt browser client, eSpeak NG as the
TTS, ``FramegraphAvatar`` between the TTS and the transport. Needs ``pip install 'framegraph[pipecat]'``.
This module imports no Pipecat itself (the CLI's ``--help`` stays quick); the example does.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from framegraph import assets
from framegraph.models.runtime import RUNTIMES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # apps/pipecat/ is two below
EXAMPLE = os.path.join(ROOT, "examples", "pipecat_avatar_bot.py")
DEFAULT_AVATAR = str(assets.path("avatars") / "astronaut")
GREETING = "Hello! Type a sentence, and I will say it."
VIDEO_DELAY_MS = 100.0  # measured for SmallWebRTC → Chromium at 30 fps: docs/pipecat.md
WEBRTC_FPS = 30.0  # aiortc's VideoStreamTrack.next_timestamp: VIDEO_PTIME = 1/30 s per frame, whatever the rate


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The example agent's options (the example's own command line is this one)."""
    p.add_argument("--avatar", default=DEFAULT_AVATAR, help="avatar bundle folder, portrait or video kind "
                                                            "(default: the shipped astronaut)")
    p.add_argument("--runtime", default="torch", choices=RUNTIMES,
                   help="where the avatar's models compute (onnx / onnx-int8: portrait bundles, after `framegraph "
                        "export --avatar BUNDLE`; default torch)")
    p.add_argument("--onnx-dir", default=None, help="the ONNX export to use (default BUNDLE/onnx)")
    p.add_argument("--fps", type=float, default=WEBRTC_FPS,
                   help=f"video frames per second sent (default {WEBRTC_FPS:g}: aiortc, under the SmallWebRTC transport, "
                        f"stamps every video frame 1/30 s after the last, so another rate drifts from the audio; the "
                        f"avatar's own frames are re-timed to it)")
    p.add_argument("--video-delay-ms", type=float, default=VIDEO_DELAY_MS,
                   help=f"each picture leaves this long after the audio of its time, making up for the browser's "
                        f"audio jitter buffer (default {VIDEO_DELAY_MS:g}, measured: docs/pipecat.md)")
    p.add_argument("--voice", default="en-us", help="eSpeak NG voice of the TTS (default en-us)")
    p.add_argument("--greeting", default=GREETING, help="what the bot says when a browser connects ('' for nothing)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860; 0 picks a free one)")


def load_example():
    """The example agent's module (``examples/pipecat_avatar_bot.py`` of the checkout)."""
    if not os.path.isfile(EXAMPLE):
        raise FileNotFoundError(f"the example agent {EXAMPLE} is not here: it ships with framegraph's source "
                                f"checkout (run `framegraph pipecat-demo` from an editable install, `pip install -e .`)")
    spec = importlib.util.spec_from_file_location("pipecat_avatar_bot", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(args) -> int:
    if importlib.util.find_spec("pipecat") is None:
        print("framegraph pipecat-demo: error: Pipecat is not installed: pip install 'framegraph[pipecat]'",
              file=sys.stderr)
        return 2
    return load_example().serve_agent(args)
