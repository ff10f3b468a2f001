"""Shared pytest set-up: GPU tests skip cleanly without CUDA; helpers importable from tests/; torch on one
CPU thread."""
import os
import sys

import torch

# Without a GPU, Triton kernels run through Triton's interpreter. It must be chosen before anything
# imports triton (triton sets up its language functions at import), so it is set here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

# `python -m pytest` from the checkout puts its root on sys.path, where the folder kernels/ would shadow the
# package of that name (Hugging Face's `kernels`, which transformers imports when it finds one). The package
# under test is framegraph.*, installed; the folders themselves are never imported by their own names.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]
os.environ["PYTHONSAFEPATH"] = "1"  # the same for every `python -m ...` a test starts from the checkout
sys.path.insert(0, os.path.dirname(__file__))

# The models and kernels under test are small: on a CPU shared with other jobs one intra-op thread runs
# them several times faster than many (OpenMP threads that wait for a busy core spin). Tests that need
# another setting set it themselves (and restore it).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def astronaut_talking_clip(tmp_path_factory):
    """A 12 s clip of the astronaut speaking (`framegraph avatar synth --seed 1`): its MP4 (the JSON of its
    ground truth beside it). Made once per run; skipped without espeak-ng."""
    from framegraph.apps.cli import main
    from framegraph.models.synth import espeak_available

    if not espeak_available():
        pytest.skip("needs the system package espeak-ng (apt-get install espeak-ng) to make a talking clip")
    root = tmp_path_factory.mktemp("synth")
    assert main(["avatar", "synth", "--out", str(root), "--clips", "1", "--seconds", "12", "--seed", "1"]) == 0
    return root / "clip_00000.mp4"


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """One Inductor / Triton cache for the session's compiled-runtime tests (``FRAMEGRAPH_CACHE``): what one test
    compiled (the C++ precompiled header, kernels of the same source) the next one reuses. Compilation is cold in
    every run: nothing outside the temporary folder is read."""
    from framegraph.models.compile import CACHE_ENV, use_cache_dir

    root = tmp_path_factory.mktemp("framegraph-cache")
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(root)
    use_cache_dir()
    yield root
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---- tests write only to temporary folders ------------------------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_WATCHED = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "out", "build", "dist", ".whl", ".gl"}


def _checkout_paths() -> set[str]:
    """Every file and folder of the checkout, outside what tools and the environment own."""
    found = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _NOT_WATCHED and not d.endswith(".egg-info")]
        rel = os.path.relpath(root, REPO)
        found.update(os.path.normpath(os.path.join(rel, n)) for n in dirs + files)
    return found


def pytest_sessionstart(session):
    session.config._checkout_before = _checkout_paths()


def pytest_sessionfinish(session, exitstatus):
    """A test that leaves a file or folder in the checkout fails the run: tests write to tmp only."""
    before = getattr(session.config, "_checkout_before", None)
    if before is None:
        return
    left = sorted(_checkout_paths() - before)
    if left:
        session.config.get_terminal_writer().line(
            f"tests left {len(left)} path(s) in the checkout (write to tmp_path instead): {left[:10]}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
