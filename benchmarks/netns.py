"""Emulated cluster networks, made of private network namespaces (root and iproute2 needed).

Two models:

- ``emulated_hosts(np, "1gbit")`` (the default of ``python -m benchmarks bench``): ``np``
  namespaces, one per host, each with its own ``eth0``, address (10.77.0.k+1) and host-name mapping,
  all plugged into a bridge in a switch namespace (10.77.0.254, where the rendezvous server runs).
  Both directions of every port are shaped with ``tbf``: the host's egress and the switch's egress
  towards it, so each host has a full-duplex link of that rate, like hosts on a switch.
- ``shaped_namespace("1gbit")``: one namespace whose loopback is shaped; every rank runs inside
  it, so all ranks and both directions share one queue of that rate (a half-duplex bus: one
  "1 Gbit/s" link carries what two hosts on 1 Gbit/s ports would carry at 2 x 1 Gbit/s).

Only ``tbf`` is used (``netem`` is not needed, so no added latency: a switch hop on the veth
pairs costs tens of microseconds). Its bucket holds 1 ms of traffic at the link's rate (at least
two packets): after an idle spell, no more than that passes faster than the rate, so a
collective of a few hundred KiB takes the link's time, not the host's (``BURST_S``). Its queue
holds at least 16 MiB, so that TCP's bursts are queued, not dropped (``QUEUE_S``).
Everything stays inside the namespaces made here; they and their ``/etc/netns`` files are
removed on exit, also on an error, Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from hvd_overlap.core.sim.cluster import parse_rate

PLAIN = "plain"
HOSTS = "hosts"  # network model: one namespace per rank, full-duplex shaped links
LOOPBACK = "loopback"  # network model: every rank on one shaped loopback
NET_MODELS = (HOSTS, LOOPBACK)
SUBNET = "10.77.0"
NETNS_ETC = Path("/etc/netns")
#: a shaped link's bucket, in seconds of traffic at its rate: the most that passes faster than
#: the rate after an idle spell (shorter, and tbf's timer no longer sustains Gbit/s rates here:
#: 4 KiB at 3 Gbit/s ran 1 MiB messages at a quarter of the rate)
BURST_S = 1e-3
ETHERNET_MTU = 1500  # the emulated hosts' veth links
LOOPBACK_MTU = 65536  # a namespace's lo (the loopback model)
#: a shaped link's queue, in seconds of traffic at its rate, and at least this many bytes: a
#: queue shorter than what TCP hands the link at once (up to ``tcp_limit_output_bytes`` per
#: socket: 4 MiB on this project's machines) drops packets, and each drop costs a
#: retransmission (at 20 Mbit/s with a 20 ms queue, 64 KiB messages took 57-66 ms, not 26)
QUEUE_S = 20e-3
MIN_QUEUE_BYTES = 16 * 2**20
#: tc's spelling of a rate (its value is read by the one rate parser, ``parse_rate``)
_TC_RATE = re.compile(r"^\d+(\.\d+)?(kbit|mbit|gbit)$")


class NetnsError(RuntimeError):
    """The emulated network cannot be set up here (the message names the fix)."""


def parse_net(net: str) -> str | None:
    """``"plain"`` -> None (no shaping); a tc rate like ``"1gbit"`` -> it; else ValueError."""
    net = net.strip().lower()
    if net == PLAIN:
        return None
    if not _TC_RATE.match(net):
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


def link_bytes_sent() -> int | None:
    """Bytes this network namespace's interfaces have sent (their kernel counters): the
    emulated host's own link (every non-loopback interface), or the loopback when it has no
    other (a shaped loopback that both ranks share); None where unreadable."""
    counters = {}
    for path in Path("/sys/class/net").glob("*/statistics/tx_bytes"):
        try:
            counters[path.parent.parent.name] = int(path.read_text())
        except (OSError, ValueError):
            continue
    own = [n for n in counters if n != "lo"]
    if own:
        return sum(counters[n] for n in own)
    return counters.get("lo")


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
def shaped_namespace(rate: str, name: str | None = None) -> Iterator[str]:
    """A fresh namespace with ``lo`` up and shaped to ``rate`` (tc syntax); yields its name."""
    check_requirements()
    name = name or f"hvdo-bench-{os.getpid()}"
    with raise_on_signals():
        _run(["ip", "netns", "add", name])
        try:
            _run(exec_prefix(name) + ["ip", "link", "set", "lo", "up"])
            _run(exec_prefix(name) + ["tc", "qdisc", "add", "dev", "lo", "root",
                                      *_tbf(rate, LOOPBACK_MTU)])
            yield name
        finally:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def namespaces() -> list[str]:
    """Names of the existing network namespaces (``ip netns list``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _burst(rate: str, mtu: int = ETHERNET_MTU) -> str:
    """tbf's bucket for ``rate``: ``BURST_S`` of traffic, and at least two packets of ``mtu``
    (tbf drops a packet larger than its bucket; it cuts larger GSO packets into segments).
    Measured on 2 emulated hosts, a 64 KiB message after an idle spell at 17 Mbit/s: 0.3 ms
    with a 256 KiB bucket (1% of the link's 31 ms), 31 ms with 4 KiB; with this bucket and
    queue, 1 MiB messages 1.04-1.06x the link's time at 20 Mbit/s-1 Gbit/s (the 4.6% of
    TCP/IP headers)."""
    return f"{max(2 * (mtu + 64), int(parse_rate(rate) * BURST_S))}b"


def _limit(rate: str) -> str:
    """tbf's queue: ``QUEUE_S`` of traffic at ``rate``, at least ``MIN_QUEUE_BYTES``."""
    return f"{max(MIN_QUEUE_BYTES, int(parse_rate(rate) * QUEUE_S))}b"


def _tbf(rate: str, mtu: int = ETHERNET_MTU) -> list[str]:
    """The ``tc qdisc add ... root`` arguments of a link shaped to ``rate``."""
    return ["tbf", "rate", rate, "burst", _burst(rate, mtu), "limit", _limit(rate)]


def _shape(namespace: str, dev: str, rate: str) -> None:
    _run(["tc", "-n", namespace, "qdisc", "add", "dev", dev, "root", *_tbf(rate)])


@dataclass(frozen=True)
class Hosts:
    """Emulated hosts: host k is ``names[k]`` at ``addresses[k]`` inside ``namespaces[k]``."""

    namespaces: tuple[str, ...]
    names: tuple[str, ...]
    addresses: tuple[str, ...]
    switch: str  # the bridge's namespace; reachable from every host at ``switch_address``
    switch_address: str
    rate: str | None
    iface: str = "eth0"


@contextmanager
def emulated_hosts(np: int, rate: str | None, tag: str | None = None) -> Iterator[Hosts]:
    """``np`` emulated hosts on a switch, each port shaped to ``rate`` in both directions
    (``None``: unshaped). Each host's ``/etc/hosts`` maps this machine's host name to the
    host's own address (Horovod 0.28.1 opens its process-set Gloo context on the host name)."""
    if np < 1:
        raise ValueError("emulated_hosts: np must be at least 1")
    if np > 250:
        raise ValueError("emulated_hosts: at most 250 hosts")
    check_requirements()
    tag = tag or f"hvdo{os.getpid()}"
    switch = f"{tag}-sw"
    hosts = Hosts(
        namespaces=tuple(f"{tag}-h{k}" for k in range(np)),
        names=tuple(f"{tag}-host{k}" for k in range(np)),
        addresses=tuple(f"{SUBNET}.{k + 1}" for k in range(np)),
        switch=switch, switch_address=f"{SUBNET}.254", rate=rate)
    with raise_on_signals(), ExitStack() as cleanup:
        for ns in (switch, *hosts.namespaces):
            _run(["ip", "netns", "add", ns])
            cleanup.callback(_remove_namespace, ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", switch, "addr", "add", f"{hosts.switch_address}/24", "dev", "br0"])
        _run(["ip", "-n", switch, "link", "set", "br0", "up"])
        table = "".join(f"{a} {n}\n" for a, n in zip(hosts.addresses, hosts.names, strict=True))
        for k, ns in enumerate(hosts.namespaces):
            port = f"p{k}"
            _run(["ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name",
                  hosts.iface, "netns", ns])
            _run(["ip", "-n", switch, "link", "set", port, "master", "br0"])
            _run(["ip", "-n", switch, "link", "set", port, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{hosts.addresses[k]}/24", "dev", hosts.iface])
            _run(["ip", "-n", ns, "link", "set", hosts.iface, "up"])
            if rate is not None:
                _shape(ns, hosts.iface, rate)  # host -> switch
                _shape(switch, port, rate)  # switch -> host
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(
                f"127.0.0.1 localhost\n{hosts.addresses[k]} {socket.gethostname()}\n{table}")
        yield hosts


def _remove_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
