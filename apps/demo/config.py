"""What ``framegraph demo`` can set, :class:`DemoConfig`, with nothing heavy to import.

So the command's front can show its defaults."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DemoConfig:
    """What ``framegraph demo`` can set.

    Attributes:
        host / port: where the demo listens. The default host is 127.0.0.1. Port 0 picks a free one.
        pipeline: ``"auto"`` or a pipeline name. ``"auto"`` is ``avatar`` when the server has it, else ``scope``.
        max_sessions: concurrent live sessions, meaning tabs, plus headless takes.
        takes_dir: where take MP4s go. The default is a fresh temporary folder.
        video: start options for the video: size, fps, codec. Otherwise the pipeline's defaults.
        runtime: where the avatar's models compute: ``"torch"``, ``"onnx"`` or ``"onnx-int8"``. It is the
            avatar's ``runtime`` start option.
        transport: the player's: ``"webrtc"``, falling back to the WebSocket, or ``"websocket"``.
    """

    host: str = "127.0.0.1"
    port: int = 7860
    pipeline: str = "auto"
    max_sessions: int = 8
    takes_dir: str | None = None
    video: dict = field(default_factory=dict)
    runtime: str = "torch"
    transport: str = "webrtc"
