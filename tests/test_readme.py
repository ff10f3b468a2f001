"""The README's "Try it" block and its runtime example run exactly as written and give what they promise; its map
names every folder and every top-level module."""
import contextlib
import fnmatch
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from framegraph.stream import Clock, Graph
from framegraph.stream.media import MP4Sink, read_video, read_video_rgba
from framegraph.stream.testcard import TestCardVideo

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("stream", "kernels", "models", "renderers", "apps", "benchmarks")  # the folders whose modules are mapped


def try_it_block() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"## Try it\n.*?```sh\n(.*?)```", text, re.S)
    assert m, "README.md has no '## Try it' section with a ```sh block"
    return m.group(1)


@pytest.mark.skipif(not Path(sys.executable).parent.joinpath("activate").exists(), reason="needs a virtualenv")
@pytest.mark.timeout(480)  # eight renders, then a server and a client session
def test_try_it_block_runs_as_written(tmp_path):
    block = try_it_block()
    assert block.startswith(". .venv/bin/activate\n")
    # A copy of the repository root as the reader sees it: the shipped assets and the environment.
    os.symlink(REPO / "assets", tmp_path / "assets")
    os.symlink(Path(sys.executable).parent.parent, tmp_path / ".venv")
    (tmp_path / "out").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"  # `framegraph` is found only through the activation the block does
    # its own process group, so a server the block started in the background cannot outlive it
    proc = subprocess.Popen(["bash", "-e", "-c", block], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=420)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-2000:]
    card = read_video(tmp_path / "out" / "testcard.mp4")
    assert card["frames"].shape[0] == 50 and np.abs(card["audio"]).max() > 1000  # picture and beeps
    for name in ("toy", "ball"):
        frames = read_video(tmp_path / "out" / f"{name}.mp4")["frames"]
        assert frames.shape[0] == {"toy": 24, "ball": 50}[name]
        assert frames.astype(float).std() > 10, name  # a picture, not a blank
        assert np.abs(frames[0].astype(float) - frames[-1].astype(float)).mean() > 1, name  # it moves
    talk = read_video(tmp_path / "out" / "hello.mp4")
    assert talk["frames"].shape[1:] == (256, 256, 3)
    assert np.sqrt(np.mean(talk["audio"].astype(float) ** 2)) > 300  # the speech is in the file
    matted = read_video_rgba(tmp_path / "out" / "hello.webm")
    alpha = matted["frames"][..., 3]
    assert matted["has_alpha"] and len(alpha) == len(talk["frames"])
    assert (alpha[:, :8, :8] <= 4).all() and (alpha[:, 100:140, 110:150] >= 250).all()  # see-through corner, the face
    scene = read_video(tmp_path / "out" / "in_scene.mp4")
    assert scene["frames"].shape == (len(talk["frames"]), 180, 320, 3)  # as long as the speech, at the scene's size
    assert np.sqrt(np.mean(scene["audio"].astype(float) ** 2)) > 300
    served = read_video(tmp_path / "out" / "served.mp4")  # the client's recording of the server's avatar
    assert served["frames"].shape[1:] == (256, 256, 3) and len(served["frames"]) >= 1  # fewer than 25 fps when busy
    assert served["frames"].astype(float).std() > 20  # a face, not a blank
    assert re.search(r"session \w+ \(avatar over websocket, .*\n  time to first frame .*\n  fps +[\d.]+", stderr)


def test_readme_is_a_map_under_3000_words_whose_links_all_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.split()) <= 3000, "the README is the map; long sections belong in docs/ or benchmarks/README.md"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links its guides"
    missing = [t for t in targets if not t.startswith(("http://", "https://")) and not (REPO / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_every_command_of_the_cli_is_in_the_readme():
    from framegraph.apps.cli import COMMANDS

    text = (REPO / "README.md").read_text()
    absent = [name for name in COMMANDS if f"framegraph {name}" not in text]
    assert not absent, f"commands the README's table does not name: {absent}"


def runtime_example() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"### The runtime in one page\n+```python\n(.*?)```", text, re.S)
    assert m, "README.md has no '### The runtime in one page' section with a ```python block"
    return m.group(1)


@pytest.mark.timeout(120)
def test_runtime_example_runs_as_pasted(tmp_path):
    """Pasted into a file and run: an MP4 of the test card, inverted."""
    (tmp_path / "example.py").write_text(runtime_example())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = read_video(tmp_path / "out.mp4")["frames"]
    g = Graph(Clock("fast"))  # the same test card, not inverted
    card = g.add(TestCardVideo(width=640, height=360, fps=25, seconds=2))
    g.connect(card, g.add(MP4Sink(str(tmp_path / "card.mp4"), width=640, height=360, fps=25, audio_rate=None)))
    g.run()
    card = read_video(tmp_path / "card.mp4")["frames"]
    assert out.shape == card.shape == (50, 360, 640, 3)
    assert np.abs(255 - card.astype(float) - out.astype(float)).mean() < 8  # the negative, up to H.264's loss
    assert np.abs(card.astype(float) - out.astype(float)).mean() > 50  # not the card itself


def map_sections() -> dict[str, str]:
    """The architecture map's text per top-level folder (a line ``name/`` at column 0 opens one)."""
    text = (REPO / "README.md").read_text()
    m = re.search(r"## Architecture\n+```\n(.*?)```", text, re.S)
    assert m, "README.md has no '## Architecture' section with a map in a ``` block"
    sections, current = {}, None
    for line in m.group(1).splitlines():
        if opened := re.match(r"(\w+)/\s", line):
            current = opened.group(1)
            sections[current] = ""
        if current:
            sections[current] += line + "\n"
    return sections


def test_the_map_names_every_folder_and_every_top_level_module():
    """The rule: in its top-level folder's part of the map, every folder of modules is named (``name/``) and every
    module directly in the top-level folder is named by its file (``name.py``, or a pattern like ``webrtc*.py``).
    A folder's inner modules are its own ``__init__``'s to describe."""
    sections = map_sections()
    absent = [f"{p}/ (no part of the map)" for p in PACKAGES if p not in sections]
    for package in (p for p in PACKAGES if p in sections):
        files = set(re.findall(r"[\w*]+\.py", sections[package]))
        folders = set(re.findall(r"(\w+)/", sections[package]))
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO / package)
            if len(rel.parts) > 1 and rel.parts[-2] not in folders:
                absent.append(f"{package}/{rel.parent}/")
                folders.add(rel.parts[-2])  # said once
            elif len(rel.parts) == 1 and path.name != "__init__.py" and not any(
                    fnmatch.fnmatch(path.name, f) for f in files):
                absent.append(f"{package}/{rel}")
    assert not absent, f"the README's map (## Architecture) leaves out: {absent}"


def test_the_map_names_every_server_pipeline():
    """Each module of ``apps/server/pipelines/`` that declares a ``PIPELINE`` is in the map's list of them."""
    m = re.search(r"pipelines/: one module per pipeline \(([^)]*)\)", map_sections()["apps"])
    assert m, "the map's apps/ part has no 'pipelines/: one module per pipeline (...)' list"
    listed = set(re.split(r",\s*", " ".join(m.group(1).split())))
    declared = {p.stem for p in (REPO / "apps/server/pipelines").glob("*.py")
                if re.search(r"^PIPELINE\b", p.read_text(), re.M)}
    assert declared and listed == declared, f"the map lists {sorted(listed)}; the modules declare {sorted(declared)}"
