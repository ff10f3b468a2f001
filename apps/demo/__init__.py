"""The live demo: ``framegraph demo``, or ``make demo``.

A Gradio page that is a thin shell over the framegraph WebSocket server. The live picture is the low-latency
WebSocket player of ``apps/web``, ``player.html``, in an iframe. It is fed by the microphone, by typed text
spoken by eSpeak NG, or by an uploaded file. The page offers portrait and state choice, and interrupt. It shows
FPS and latency readouts. Every take is recorded to a downloadable MP4. The demo runs the ``avatar`` pipeline
when the server has it, else the microphone ``scope``. A note says which runs.

Modules:

- ``app``: the process, with server + relay + Gradio on one port;
- ``context``: configuration, the pipeline choice, and what handlers and routes share;
- ``ui``: the Gradio page and its API;
- ``relay``: player ↔ server, and recording;
- ``clips``: text or file → 16 kHz PCM;
- ``config``: ``DemoConfig``;
- ``cli``: the command's implementation. Its options are in ``apps/commands/demo.py``.
- ``webrtc_takes``: the player's WebRTC offer, and its takes.

The names below load from their modules on first use, so ``config`` imports alone.
"""
from framegraph.apps import exports

__all__ = ["DemoConfig", "DemoHandle", "choose_pipeline", "serve_demo_in_thread"]
__getattr__ = exports(__name__, {"DemoConfig": ".config", "DemoHandle": ".app", "serve_demo_in_thread": ".app",
                                 "choose_pipeline": ".context"})
