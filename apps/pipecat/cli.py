"""``framegraph pipecat-demo``'s implementation. Its options are in ``apps/commands/pipecat_demo.py``.

It runs ``examples/pipecat_avatar_bot.py`` of the source checkout.
That is the same as ``python examples/pipecat_avatar_bot.py``.
The example uses Pipecat's SmallWebRTC transport and prebuilt browser client.
eSpeak NG is the TTS. ``FramegraphAvatar`` sits between the TTS and the transport.
It needs ``pip install 'framegraph[pipecat]'``.
This module imports no Pipecat itself, so the CLI's ``--help`` stays quick. The example does import it.
"""
from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # apps/pipecat/ is two below
EXAMPLE = os.path.join(ROOT, "examples", "pipecat_avatar_bot.py")


def load_example():
    """The example agent's module: ``examples/pipecat_avatar_bot.py`` of the checkout."""
    if not os.path.isfile(EXAMPLE):
        raise FileNotFoundError(f"the example agent {EXAMPLE} is not here: it ships with framegraph's source "
                                f"checkout (run `framegraph pipecat-demo` from an editable install, "
                                f"`pip install -e .`)")
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
