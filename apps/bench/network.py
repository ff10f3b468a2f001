"""A server process behind a network link, for the transport tests and ``framegraph bench server --transport``.

The server runs in its own network namespace. Clients in this one reach it over a link. The link may lose and
delay packets in each direction. Its byte counters are what went over the wire.

Without impairment the link is a plain veth pair. That is the kernel's own path, like loopback. The impairment
is that of ``tc netem delay D J loss L`` on each end. Every packet kept is delayed by D ± J ms, uniform. So
packets reorder when J exceeds their spacing. Each is lost with probability L. It is built in one of two ways,
whichever this kernel allows. Its :attr:`Link.method` says which:

- **netem**: the veth pair with ``tc qdisc add dev ... root netem`` on both ends.
- **relay**: for a kernel with no ``sch_netem``, such as a VM's minimal kernel. It is a pair of TUN devices,
  one in each namespace. A process moves IP packets between them. The process is :func:`relay`. It applies
  the same loss and delay.

It needs root or CAP_NET_ADMIN, and ``ip`` from iproute2. For netem it also needs ``tc``.
:class:`NamespaceUnavailable` says what is missing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import heapq
import os
import random
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator


class NamespaceUnavailable(RuntimeError):
    """No network namespace, or no impaired link into one, can be made here. The message says why."""


@dataclasses.dataclass(frozen=True)
class Impairment:
    """Per direction: each packet is lost with ``loss_percent`` %. Otherwise it is delayed by ``delay_ms`` ±
    ``jitter_ms``."""

    loss_percent: float = 2.0
    delay_ms: float = 30.0
    jitter_ms: float = 30.0

    def __post_init__(self):
        if not 0 <= self.loss_percent < 100 or self.delay_ms < 0 or not 0 <= self.jitter_ms <= self.delay_ms:
            raise ValueError(f"impairment {self}: expected 0 <= loss_percent < 100 and 0 <= jitter_ms <= delay_ms")

    def describe(self) -> str:
        return f"{self.loss_percent:g} % loss, {self.delay_ms:g} ± {self.jitter_ms:g} ms delay each way"

    def netem_args(self) -> list[str]:
        return ["delay", f"{self.delay_ms:g}ms", f"{self.jitter_ms:g}ms", "loss", f"{self.loss_percent:g}%"]


@dataclasses.dataclass
class Link:
    """A namespace ``namespace`` reachable at ``peer_address`` from this one. This end is ``host_address``."""

    namespace: str
    host_address: str
    peer_address: str
    impairment: Impairment | None
    method: str  # "veth" (no impairment), "netem" or "relay"

    def describe(self) -> str:
        if self.impairment is None:
            return "no impairment (a veth pair)"
        how = "tc netem on a veth pair" if self.method == "netem" else "a TUN pair and a relay process (no sch_netem)"
        return f"{self.impairment.describe()} ({how})"

    def wire_bytes(self) -> dict[str, int]:
        """Bytes that crossed the link so far, as IP packets with headers.

        Keys: ``server_to_client``, ``client_to_server``."""
        stats = f"/sys/class/net/{self.namespace}h/statistics"
        with open(f"{stats}/rx_bytes") as rx, open(f"{stats}/tx_bytes") as tx:
            return {"server_to_client": int(rx.read()), "client_to_server": int(tx.read())}


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS``, in ``namespace`` when given. ``ip tc ...`` runs ``tc ...``."""
    cmd = list(args[1:]) if args[0] == "tc" else ["ip", *args]
    if namespace:
        cmd = ["ip", "netns", "exec", namespace, *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    if check and done.returncode != 0:
        raise NamespaceUnavailable(f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")
    return done


@contextlib.contextmanager
def namespace_link(impairment: Impairment | None = None) -> Iterator[Link]:
    """A fresh network namespace behind a link with ``impairment``, removed on exit.

    None means no impairment; see the module docstring. Names and the /30 subnet come from this process's id.
    So concurrent runs do not collide."""
    if shutil.which("ip") is None:
        raise NamespaceUnavailable("`ip` (iproute2) is not installed: apt-get install -y iproute2")
    n = os.getpid() % 16384
    name = f"fg{os.getpid()}"
    host, peer = f"10.213.{n // 64}.{(n % 64) * 4 + 1}", f"10.213.{n // 64}.{(n % 64) * 4 + 2}"
    added = _ip("netns", "add", name, check=False)
    if added.returncode != 0:
        raise NamespaceUnavailable(f"cannot create a network namespace (`ip netns add {name}`): "
                                   f"{added.stderr.strip()} (needs root or CAP_SYS_ADMIN)")
    relay_proc = None
    try:
        _ip("link", "set", "lo", "up", namespace=name)
        if _veth(name, host, peer, impairment):
            method = "veth" if impairment is None else "netem"
        else:
            method, relay_proc = "relay", _tun_relay(name, host, peer, impairment)
        yield Link(name, host, peer, impairment, method)
    finally:
        if relay_proc is not None:
            relay_proc.terminate()
            relay_proc.wait(10)
        _ip("link", "del", f"{name}h", check=False)
        _ip("netns", "del", name, check=False)


def _veth(name: str, host: str, peer: str, impairment: Impairment | None) -> bool:
    """A veth pair into ``name``, with netem on both ends for an ``impairment``.

    Returns False when that needs netem and the kernel has none. It then leaves nothing behind."""
    _ip("link", "add", f"{name}h", "type", "veth", "peer", "name", f"{name}n")
    if impairment is not None:
        probe = subprocess.run(["tc", "qdisc", "add", "dev", f"{name}h", "root", "netem", *impairment.netem_args()],
                               capture_output=True, text=True, timeout=10) if shutil.which("tc") else None
        if probe is None or probe.returncode != 0:
            _ip("link", "del", f"{name}h")
            return False
    _ip("link", "set", f"{name}n", "netns", name)
    _ip("addr", "add", f"{host}/30", "dev", f"{name}h")
    _ip("link", "set", f"{name}h", "up")
    _ip("addr", "add", f"{peer}/30", "dev", f"{name}n", namespace=name)
    _ip("link", "set", f"{name}n", "up", namespace=name)
    if impairment is not None:
        _ip("tc", "qdisc", "add", "dev", f"{name}n", "root", "netem", *impairment.netem_args(), namespace=name)
    return True


def _tun_relay(name: str, host: str, peer: str, impairment: Impairment) -> subprocess.Popen:
    """TUN devices ``{name}h`` here and ``{name}n`` in the namespace. A relay process makes and joins them."""
    proc = subprocess.Popen([sys.executable, "-P", "-m", "framegraph.apps.bench.network", f"{name}h", f"{name}n",
                             str(impairment.loss_percent), str(impairment.delay_ms), str(impairment.jitter_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise NamespaceUnavailable(f"the TUN relay did not start: {line.strip()} {proc.stderr.read().strip()}")
    try:
        _ip("link", "set", f"{name}n", "netns", name)
        _ip("addr", "add", host, "peer", peer, "dev", f"{name}h")
        _ip("link", "set", f"{name}h", "up")
        _ip("addr", "add", peer, "peer", host, "dev", f"{name}n", namespace=name)
        _ip("link", "set", f"{name}n", "up", namespace=name)
    except NamespaceUnavailable:
        proc.kill()
        raise
    return proc


def _open_tun(name: str) -> int:
    TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def relay(host_dev: str, peer_dev: str, impairment: Impairment, seed: int = 0) -> None:
    """Make TUN devices ``host_dev`` and ``peer_dev`` and move IP packets between them until killed.

    Each packet is lost or delayed as ``impairment`` says, in netem's model. Prints ``ready`` once both exist."""
    a, b = _open_tun(host_dev), _open_tun(peer_dev)
    other = {a: b, b: a}
    print("ready", flush=True)
    rng, loss = random.Random(seed), impairment.loss_percent / 100
    queue: list[tuple[float, int, int, bytes]] = []  # (due, order, out fd, packet)
    sel = selectors.DefaultSelector()
    for fd in other:
        sel.register(fd, selectors.EVENT_READ)
    order = 0
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        for key, _ in sel.select(timeout):
            packet = os.read(key.fd, 65536)
            if rng.random() < loss:
                continue
            delay_s = (impairment.delay_ms + rng.uniform(-impairment.jitter_ms, impairment.jitter_ms)) / 1000
            order += 1
            heapq.heappush(queue, (time.monotonic() + delay_s, order, other[key.fd], packet))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, packet = heapq.heappop(queue)
            try:
                os.write(out, packet)
            except OSError:  # that side is not up (yet): the packet is lost, as on a link that is down
                pass


@dataclasses.dataclass
class ServerProcess:
    """``framegraph serve`` in a child process.

    Attributes: ``url`` (its WebSocket URL), ``token``, ``pid``, and ``log``, its stderr lines so far."""

    proc: subprocess.Popen
    url: str
    token: str | None
    log: list[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server_process(link: Link | None = None, *args: str, start_timeout_s: float = 90) -> Iterator[ServerProcess]:
    """``framegraph serve`` on loopback, or inside ``link``'s namespace at its address. SIGTERM on exit.

    Extra ``args`` are passed on. Off loopback it gets a random token, since such a server needs one."""
    token = None if link is None else os.urandom(8).hex()
    host = "127.0.0.1" if link is None else link.peer_address
    cmd = [sys.executable, "-P", "-m", "framegraph.apps.cli", "serve", "--host", host, "--port", "0", *args]
    if token:
        cmd += ["--token", token]
    if link is not None:
        cmd = ["ip", "netns", "exec", link.namespace, *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    up = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            lines.append(line)
            if "WebSocket ws://" in line:
                up.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    try:
        if not up.wait(start_timeout_s):
            raise RuntimeError(f"framegraph serve did not start within {start_timeout_s:g} s: {''.join(lines)[-2000:]}")
        url = re.search(r"WebSocket (ws://\S+)", "".join(lines)).group(1)
        yield ServerProcess(proc, url + (f"?token={token}" if token else ""), token, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":  # the relay process of _tun_relay
    relay(sys.argv[1], sys.argv[2], Impairment(*map(float, sys.argv[3:6])))
