"""An emulated cluster link: a private network namespace whose loopback is rate-limited.

``shaped_namespace("1gbit")`` creates ``hvdo-bench-<pid>``, brings its ``lo`` up, shapes it
with ``tc qdisc add dev lo root tbf rate 1gbit burst 256kb latency 20ms`` and yields its name;
run commands inside with ``exec_prefix(name) + cmd``. Everything stays on that loopback. The
namespace is deleted on exit, also on an error, Ctrl-C, SIGTERM or SIGHUP. Needs root and
iproute2 (``ip``, ``tc``); ``netem`` is not required (``tbf`` only).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PLAIN = "plain"
_RATE = re.compile(r"^\d+(\.\d+)?(kbit|mbit|gbit)$")


class NetnsError(RuntimeError):
    """The emulated network cannot be set up here (the message names the fix)."""


def parse_net(net: str) -> str | None:
    """``"plain"`` -> None (no shaping); a tc rate like ``"1gbit"`` -> it; else ValueError."""
    net = net.strip().lower()
    if net == PLAIN:
        return None
    if not _RATE.match(net):
        raise ValueError(f"--net {net!r}: use 'plain' or a rate such as 500mbit, 1gbit, 10gbit")
    return net


def check_requirements() -> None:
    """Raise NetnsError unless this process can create and shape a network namespace."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetnsError(f"{' and '.join(missing)} not found: install iproute2 "
                         "(apt-get install iproute2) to emulate a network")
    if os.geteuid() != 0:
        raise NetnsError("emulating a network needs a network namespace: run as root "
                         "(e.g. sudo), or use --net plain")


def exec_prefix(name: str) -> list[str]:
    """Prefix that runs a command inside namespace ``name``."""
    return ["ip", "netns", "exec", name]


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")


@contextmanager
def raise_on_signals() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into SystemExit while inside, so ``finally`` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def shaped_namespace(rate: str, name: str | None = None,
                     burst: str = "256kb", latency: str = "20ms") -> Iterator[str]:
    """A fresh namespace with ``lo`` up and shaped to ``rate`` (tc syntax); yields its name."""
    check_requirements()
    name = name or f"hvdo-bench-{os.getpid()}"
    with raise_on_signals():
        _run(["ip", "netns", "add", name])
        try:
            _run(exec_prefix(name) + ["ip", "link", "set", "lo", "up"])
            _run(exec_prefix(name) + ["tc", "qdisc", "add", "dev", "lo", "root", "tbf",
                                      "rate", rate, "burst", burst, "latency", latency])
            yield name
        finally:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def namespaces() -> list[str]:
    """Names of the existing network namespaces (``ip netns list``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
