"""Helpers for the real-browser tests: find Chromium, launch it headless through Playwright with a fake
microphone that plays a WAV we generate, open the served page, read what the page measured.

Needs the system package ``chromium`` (Debian/Ubuntu: ``apt-get install -y chromium``; or set
``FRAMEGRAPH_CHROMIUM`` to a Chromium/Chrome binary) and the PyPI package ``playwright`` (its Python
driver only: ``playwright install`` is not needed, the system Chromium is used). When either is missing
the browser tests FAIL with a message saying what to install: they are not skipped.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import time
import wave

import numpy as np
import pytest

INSTALL_HINT = ("the browser tests need Chromium and Playwright's Python driver: "
                "`apt-get install -y chromium` (or set FRAMEGRAPH_CHROMIUM to a Chromium binary) and "
                "`pip install playwright` (no `playwright install`: the system Chromium is used)")

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
]


def chromium_path() -> str:
    """The Chromium binary to drive, or a test failure that says how to install one."""
    chosen = os.environ.get("FRAMEGRAPH_CHROMIUM")
    if chosen and not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
        pytest.fail(f"FRAMEGRAPH_CHROMIUM={chosen!r} is not an executable file. {INSTALL_HINT}", pytrace=False)
    candidates = [chosen, "/usr/bin/chromium", "/usr/bin/chromium-browser",
                  shutil.which("chromium"), shutil.which("chromium-browser")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    pytest.fail(f"Chromium not found. {INSTALL_HINT}", pytrace=False)


def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright as sp
    except ImportError:
        pytest.fail(f"the Python package `playwright` is not installed. {INSTALL_HINT}", pytrace=False)
    return sp()


def write_speech_wav(path, seconds: float = 2.0, rate: int = 48_000) -> np.ndarray:
    """A speech-like test signal for Chromium's fake microphone (it loops the file): voiced bursts
    (a 140→180 Hz glide with harmonics, syllable-shaped envelope) of 160–320 ms, separated by silences of
    120–220 ms. Returns the int16 samples."""
    t = np.arange(int(seconds * rate)) / rate
    out = np.zeros_like(t)
    rng = np.random.default_rng(0)
    start = 0.05
    while start < seconds - 0.2:
        length = rng.uniform(0.16, 0.32)
        sel = (t >= start) & (t < start + length)
        u = (t[sel] - start) / length
        f0 = 140 + 40 * u
        phase = 2 * np.pi * np.cumsum(f0) / rate
        voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
        out[sel] = 0.35 * np.sin(np.pi * u) ** 0.5 * voiced
        start += length + rng.uniform(0.12, 0.22)
    samples = (np.clip(out, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return samples


@contextlib.contextmanager
def chromium(wav_path):
    """Headless Chromium (a fresh profile) with the fake microphone playing ``wav_path``; yields the
    Playwright ``Browser``."""
    executable = chromium_path()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, timeout=60_000,
                                     args=CHROMIUM_ARGS + [f"--use-file-for-fake-audio-capture={wav_path}"])
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """The served page in a fresh browser context; records console errors and uncaught exceptions."""

    def __init__(self, browser, url: str, viewport=(1000, 800), screenshot=None, console_errors: bool = True):
        self.screenshot_path = screenshot
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        if console_errors:
            self.page.on("console", lambda msg: self.errors.append(f"console.{msg.type}: {msg.text}")
                         if msg.type == "error" else None)
        self.page.goto(url)

    @property
    def player_frame(self):
        """Where the player (``window.fg``, ``#view``, ``#log``) runs: the page itself here; an iframe when
        a page embeds it (the Gradio demo)."""
        return self.page

    def start(self, pipeline: str, size: str = "320x240", codec: str = "jpeg") -> None:
        p = self.page
        p.wait_for_selector(f"#pipeline option[value='{pipeline}']", state="attached", timeout=10_000)
        p.select_option("#pipeline", pipeline)
        p.select_option("#size", size)
        p.select_option("#codec", codec)
        p.click("#start")

    def stats(self) -> dict:
        return self.player_frame.evaluate("window.fg.stats()")

    def wait_stats(self, predicate, timeout_s: float, what: str) -> dict:
        """Poll the page's own measurements until ``predicate(stats)``; fail with the page's log."""
        deadline = time.monotonic() + timeout_s
        while True:
            s = self.stats()
            if predicate(s):
                return s
            if time.monotonic() > deadline:
                brief = {k: v for k, v in s.items() if k not in ("server_stats", "ready")}
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; page stats: {brief}\n"
                                     f"page log:\n{self.player_frame.inner_text('#log')}\nerrors: {self.errors}")
            time.sleep(0.1)

    def canvas_rgb(self) -> np.ndarray:
        """What the canvas shows on screen (a screenshot of the element), as uint8 RGB."""
        from PIL import Image
        png = self.player_frame.locator("#view").screenshot()
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))

    def screenshot(self, path=None) -> None:
        """The whole page as PNG, to ``path`` (default: the ``screenshot`` path given at creation)."""
        self.page.screenshot(path=str(path or self.screenshot_path), full_page=True)

    def close(self) -> None:
        self.context.close()


def assert_not_blank(rgb: np.ndarray, what: str) -> None:
    """A picture, not a flat fill: enough distinct colours and contrast."""
    colours = len(np.unique(rgb.reshape(-1, 3)[::7], axis=0))
    assert rgb.std() > 8 and colours > 20, f"{what} looks blank: std {rgb.std():.1f}, {colours} colours"


def assert_shows_portrait(rgb: np.ndarray, portrait: np.ndarray, what: str, min_corr: float = 0.8) -> None:
    """``rgb`` (a canvas screenshot, any size) shows ``portrait`` (``uint8 [H, W, 3]``): their grey levels
    correlate above ``min_corr``, the picture cut from the screenshot's letterbox (the canvas is drawn
    ``object-fit: contain``) and scaled to the portrait's size."""
    from PIL import Image

    grey = portrait.astype(np.float64).mean(axis=2)
    (h, w), (H, W) = rgb.shape[:2], grey.shape
    scale = min(w / W, h / H)
    x0, y0 = round((w - W * scale) / 2), round((h - H * scale) / 2)
    picture = rgb[y0:h - y0, x0:w - x0]
    shown = np.asarray(Image.fromarray(picture).convert("L").resize((W, H)), dtype=np.float64)
    corr = np.corrcoef(shown.ravel(), grey.ravel())[0, 1]
    assert corr > min_corr, f"{what} is not the portrait: correlation {corr:.2f}, expected above {min_corr}"
