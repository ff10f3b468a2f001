"""``framegraph demo``: the live demo in the browser.

It is a Gradio page with our low-latency WebSocket player."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import webbrowser

from framegraph.apps.argtypes import check_port_free

from .app import serve_demo_in_thread
from .context import DemoConfig


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    video = {k: v for k, v in (("size", args.size), ("codec", args.codec)) if v}
    if args.max_sessions <= 0:
        raise ValueError(f"--max-sessions must be positive, got {args.max_sessions}")
    return DemoConfig(host=args.host, port=args.port, pipeline=args.pipeline, max_sessions=args.max_sessions,
                      takes_dir=args.takes_dir, video=video, runtime=args.runtime)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)
    check_port_free(config.host, config.port)  # before Gradio and the pipeline load: a sentence, exit 2
    print("framegraph demo: starting (loading Gradio and the pipeline)…", file=sys.stderr, flush=True)
    demo = serve_demo_in_thread(config).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ctx = demo.ctx
    print(f"framegraph demo: {demo.url}  (pipeline {ctx.choice.name}; takes in {ctx.takes_dir}"
          f"{'' if args.takes_dir else ', deleted on exit'}; Ctrl-C stops)",
          flush=True)
    if ctx.choice.name != "avatar":
        print(f"framegraph demo: note: {ctx.choice.note.replace('**', '')}", file=sys.stderr, flush=True)
    if not args.no_browser:
        threading.Thread(target=webbrowser.open, args=(demo.url,), daemon=True).start()
    try:
        while not stop.wait(0.5):
            if demo._thread is None or not demo._thread.is_alive():
                print("framegraph demo: the web server stopped", file=sys.stderr)
                return 1
    finally:
        print("framegraph demo: shutting down", file=sys.stderr, flush=True)
        demo.stop()
    return 0
