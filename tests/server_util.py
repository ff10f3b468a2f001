"""Helpers for the tests that talk to a real server on loopback: run one, read its pictures."""
from __future__ import annotations

import asyncio
import contextlib
import io
import json

import numpy as np
from helpers import framegraph_threads, wait_for
from PIL import Image

from framegraph.apps.server import ServerConfig, serve_in_thread
from framegraph.apps.server.protocol import Kind, parse_media


@contextlib.contextmanager
def running(*, settle_s: float = 10, stats_interval_s: float = 0.5, **overrides):
    """A server on a free loopback port; on exit, every session must be gone and no graph thread left
    within ``settle_s``."""
    config = ServerConfig(port=0, stats_interval_s=stats_interval_s, **overrides)
    with serve_in_thread(config) as handle:
        yield handle
        wait_for(lambda: handle.server.session_count == 0, settle_s, "sessions to close")
    wait_for(lambda: not framegraph_threads(), settle_s, "graph threads to end")


async def jpeg_pictures(ws, n: int, *, timeout_s: float = 20, replies: list | None = None) -> list[np.ndarray]:
    """The next ``n`` JPEG pictures a session sends, as ``uint8 [H, W, 3]``; text messages in between go
    to ``replies`` (when given)."""
    got = []
    async with asyncio.timeout(timeout_s):
        while len(got) < n:
            m = await ws.recv()
            if isinstance(m, bytes):
                h, p = parse_media(m)
                assert h.kind == Kind.JPEG
                got.append(np.asarray(Image.open(io.BytesIO(bytes(p))).convert("RGB")))
            elif replies is not None:
                replies.append(json.loads(m))
    return got
