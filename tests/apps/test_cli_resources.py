"""What a newcomer's first hour hits, answered in one sentence each: a busy port, an absurd size, an output
extension no writer knows, a memory the machine lacks."""
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from framegraph.apps.argtypes import SIZE_LIMIT
from framegraph.apps.cli import main
from framegraph.apps.render import check_memory

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def framegraph(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "framegraph.apps.cli", *argv], capture_output=True, text=True, timeout=timeout)


def one_sentence(done: subprocess.CompletedProcess, command: str) -> str:
    """The command failed with exit 2 and one line on stderr, no traceback; that line."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"framegraph {command}: error:")]
    assert len(lines) == 1, done.stderr[-2000:]
    return lines[0]


@pytest.fixture
def busy_port():
    """A port on loopback where a program listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_busy_port_is_one_sentence_naming_it_and_the_option(busy_port, command):
    extra = ["--no-browser"] if command == "demo" else []
    line = one_sentence(framegraph(command, "--port", str(busy_port), *extra), command)
    assert f"port {busy_port}" in line and "in use" in line and "--port" in line


@pytest.mark.parametrize("argv", [
    ["render", "--testcard", "--size", "99998x99998", "--out", "x.mp4"],
    ["render", "--scene", "assets/scenes/toy.ply", "--size", "20000x20000", "--out", "x.mp4"],
    ["generate", "--model", "M", "--prompt", "p", "--size", "99998x99998", "--out", "x.mp4"],
])
def test_a_size_past_the_limit_is_refused_with_the_limit_and_help_states_it(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"past the limit: {SIZE_LIMIT}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([argv[0], "--help"])
    assert "8192x4320" in " ".join(capsys.readouterr().out.split())


def test_a_render_the_free_memory_would_not_hold_is_refused_before_allocating():
    with pytest.raises(ValueError, match=r"--size 8192x4320: this render needs about 4\.0 GiB of memory, and 1\.0 GiB "
                                         r"is free; a smaller --size"):
        check_memory(8192, 4320, available=2**30)
    assert check_memory(640, 360, available=2**30) < 2**30


def test_an_allocation_that_fails_is_one_sentence(tmp_path):
    def small_address_space():  # room for Python and torch, not for the rings of 8192x4320 frames
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))

    done = subprocess.run([PY, "-m", "framegraph.apps.cli", "render", "--testcard", "--seconds", "0.4", "--size",
                           "8192x4320", "--out", str(tmp_path / "x.mp4")], preexec_fn=small_address_space,
                          capture_output=True, text=True, timeout=300)
    assert "out of memory" in one_sentence(done, "render")


@pytest.mark.slow
def test_ctrl_c_twice_inside_a_long_frame_stops_cleanly(tmp_path):
    # Ctrl-C at its default in the child (a suite started in the background ignores SIGINT, and a child inherits it)
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([PY, "-m", "framegraph.apps.cli", "render", "--scene", "assets/scenes/toy.ply",
                                 "--size", "2048x1152", "--seconds", "20", "--fps", "2", "--device", "cpu", "--out",
                                 str(tmp_path / "long.mp4")], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, ignored)
    deadline = time.monotonic() + 240
    while not (tmp_path / "long.partial.mp4").exists() and time.monotonic() < deadline:  # the graph is set up
        time.sleep(0.2)
    assert (tmp_path / "long.partial.mp4").exists()
    time.sleep(3)  # inside the first frame, which takes far longer on a CPU
    proc.send_signal(signal.SIGINT)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    t = time.monotonic()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]  # not 134 / -6 (SIGABRT)
    assert "terminate called" not in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert "aborted" in stderr and time.monotonic() - t < 10
