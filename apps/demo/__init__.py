"""The live demo: ``framegraph demo`` (``make demo``).

A Gradio page that is a thin shell over the framegraph WebSocket server: the live picture is the
low-latency WebSocket player of ``apps/web`` (``player.html``) in an iframe, fed by the microphone, typed
text spoken by eSpeak NG, or an uploaded file; portrait and state choice, interrupt; FPS / latency
readouts; every take recorded to a downloadable MP4. The ``avatar`` pipeline when the server has it,
else the microphone ``scope``, with a note saying which runs.

Modules: ``app`` (the process: server + relay + Gradio on one port), ``context`` (configuration, the
pipeline choice, what handlers and routes share), ``ui`` (the Gradio page and its
API), ``relay`` (player ↔ server, recording), ``clips`` (text / file → 16 kHz PCM), ``cli``.
"""
from .app import DemoHandle, serve_demo_in_thread
from .cli import add_arguments, run
from .context import DemoConfig, choose_pipeline

__all__ = ["DemoConfig", "DemoHandle", "choose_pipeline", "serve_demo_in_thread", "add_arguments", "run"]
