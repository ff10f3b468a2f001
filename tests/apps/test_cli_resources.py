"""What a newcomer's first hour hits, answered in one sentence each: a busy port, an absurd size, an output
extension no writer knows, a memory the machine lacks."""
import socket
import subprocess
import sys

import pytest

PY = sys.executable


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
