"""Limits the server holds every session to: the largest picture, a rate with bursts.

A leaf module: sessions, the camera input and the pipelines' options all read it.
"""
from __future__ import annotations

import time

MAX_PIXELS = 1920 * 1080  # the largest session size or camera picture, in pixels


class TokenBucket:
    """At most ``rate`` messages per second on average, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = float(rate), float(burst)
        self.tokens = float(burst)
        self.t = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
