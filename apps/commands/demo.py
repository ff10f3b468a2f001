"""``framegraph demo``: the live demo in the browser. It is a Gradio page with our low-latency WebSocket player."""
from __future__ import annotations

import argparse

from framegraph.apps.argtypes import add_config_argument, add_runtime_argument, port
from framegraph.apps.demo.config import DemoConfig

IMPLEMENTATION = "framegraph.apps.demo.cli"  # its run(args) runs the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DemoConfig()
    p.add_argument("--host", default=d.host, help=f"address to listen on (default {d.host}: this machine only)")
    p.add_argument("--port", type=port, default=d.port, help=f"port (default {d.port}; 0 picks a free one)")
    p.add_argument("--pipeline", default=d.pipeline,
                   help="pipeline to run: auto (the avatar when available, else the microphone scope), "
                        "avatar, scope (default auto)")
    p.add_argument("--size", help="video WIDTHxHEIGHT (default: the pipeline's; scope 320x240)")
    p.add_argument("--codec", choices=["jpeg", "h264"], help="video codec to the player (default jpeg)")
    add_config_argument(p, "--max-sessions", d, "max_sessions", "concurrent takes, all tabs together")
    p.add_argument("--takes-dir", help="folder for the takes' MP4 files (default: a temporary folder)")
    p.add_argument("--no-browser", action="store_true", help="do not open the page in a browser")
    add_runtime_argument(p, "(avatar) where the model stages compute: torch, or onnx (ONNX Runtime on the CPU, from "
                            "the bundle's export: `framegraph export --avatar assets/avatars/astronaut`), or "
                            "onnx-int8 (the models that export keeps in int8 run int8: `framegraph export --int8`)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
