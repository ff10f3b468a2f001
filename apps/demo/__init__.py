"""The live demo: ``framegraph demo`` (``make demo``).

A Gradio page that is a thin shell over the framegraph WebSocket server: the live picture is the
low-latency WebSocket player of ``apps/web`` (``player.html``) in an iframe, fed by the microphone, typed
text spoken by eSpeak NG, or an uploaded file; portrait and state choice, interrupt; FPS / latency
readouts; every take recorded to a downloadable MP4. The ``avatar`` pipeline when the server has it,
else the microphone ``scope``, with a note saying which runs.

Modules: ``app`` (the process: server + relay + Gradio on one port), ``context`` (configuration, the
pipeline choice, what handlers and routes share), ``ui`` (the Gradio page and its
API), ``relay`` (player ↔ server, recording), ``clips`` (text / file → 16 kHz PCM), ``config`` (``DemoConfig``),
``cli`` (the command's implementation; its options: ``apps/commands/demo.py``). The names below load from their
modules on first use, so ``config`` imports alone.
"""
from framegraph.apps import exports

__all__ = ["DemoConfig", "DemoHandle", "choose_pipeline", "serve_demo_in_thread"]
__getattr__ = exports(__name__, {"DemoConfig": ".config", "DemoHandle": ".app", "serve_demo_in_thread": ".app",
                                 "choose_pipeline": ".context"})
