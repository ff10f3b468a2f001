"""The served web page in real headless Chromium plays the ``generate`` pipeline (a tiny Wan folder from the
server's model folder): generated frames are presented on the canvas, and a prompt change sent by the page
(``fg.config``) reaches the model, which uses it from a later chunk without a restart.

Needs ``chromium`` (apt) and ``playwright`` (pip): see browser_util.py. A screenshot is saved under tmp_path.
"""
import json
import urllib.parse

import numpy as np
import pytest
from browser_util import Page, assert_not_blank
from helpers import tiny_generate_folder, tiny_prompt_embeds, wait_for
from server_util import running


@pytest.fixture
def server(tmp_path, monkeypatch):
    wan = tiny_generate_folder(tmp_path / "models" / "tiny-wan", "wan")
    tiny_prompt_embeds(wan / "a.safetensors", seed=1)
    tiny_prompt_embeds(wan / "b.safetensors", seed=2)
    monkeypatch.setenv("FRAMEGRAPH_MODELS", str(tmp_path / "models"))
    with running(settle_s=15) as handle:
        yield handle


def test_page_shows_generated_frames_and_changes_the_prompt_live(browser, server, tmp_path):
    options = {"size": "96x64", "chunk_frames": 2, "timesteps": [1000, 500], "prompt_embeds": "a.safetensors"}
    url = f"{server.http_url}?options={urllib.parse.quote(json.dumps(options))}"
    page = Page(browser, url, screenshot=tmp_path / "page.png")
    try:
        page.start("generate")
        s = page.wait_stats(lambda s: s["presented"] >= 10, 60, "10 generated frames presented")
        assert s["pipeline"] == "generate" and s["video"]["width"] == 96 and s["ready"]["family"] == "wan"
        first = page.canvas_rgb()
        assert_not_blank(first, "the generated video")
        session = next(iter(server.server.sessions.values()))
        denoiser = next(st for st in session.pipeline.graph.stages if st.name == "denoiser")
        page.page.evaluate("window.fg.config({prompt_embeds: 'b.safetensors'})")
        wait_for(lambda: len(denoiser.prompts_used) == 2, 20, "the model to use the new prompt")
        (start, _), (switched_at, prompt) = denoiser.prompts_used
        assert start == 0 and switched_at >= 1 and prompt.endswith("b.safetensors")
        shown = page.stats()["presented"]
        page.wait_stats(lambda s: s["presented"] >= shown + 10, 30, "frames after the prompt change")
        later = page.canvas_rgb()
        page.screenshot()
        assert_not_blank(later, "the generated video after the prompt change")
        assert np.abs(later.astype(int) - first.astype(int)).mean() > 1  # the picture moves on
        page.page.click("#stop")
        s = page.wait_stats(lambda s: s["closed"] is not None, 15, "the session to end")
        assert s["ended"] == "stopped" and not page.errors, (s["ended"], page.errors)
    finally:
        page.close()
