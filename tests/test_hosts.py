"""Emulated hosts: namespaces on a switch, shaped both ways, removed afterwards; a Horovod Gloo
job launched on them through the rendezvous, as horovodrun launches one on several hosts.

These need root and iproute2 (CI has both): as root a missing tool fails them; without root they
are skipped, and the skip says why, so the summary line shows the multi-host path went untested."""

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.hostrun import rank_env, run_on_hosts
from benchmarks.netns import (
    NETNS_ETC,
    NetnsError,
    emulated_hosts,
    namespaces,
)
from tests.netns_required import require_netns


@pytest.fixture(autouse=True)
def _root_and_iproute2() -> None:
    require_netns()


def _qdisc(ns: str, dev: str) -> str:
    return subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                          capture_output=True, text=True).stdout


def test_hosts_are_created_shaped_both_ways_and_removed():
    with emulated_hosts(3, "500mbit", tag="hvdotest") as hosts:
        assert set(hosts.namespaces) | {hosts.switch} <= set(namespaces())
        assert hosts.addresses == ("10.77.0.1", "10.77.0.2", "10.77.0.3")
        for k, ns in enumerate(hosts.namespaces):
            assert "tbf" in _qdisc(ns, "eth0") and "rate 500Mbit" in _qdisc(ns, "eth0")
            assert "rate 500Mbit" in _qdisc(hosts.switch, f"p{k}")  # switch -> host
            etc_hosts = (NETNS_ETC / ns / "hosts").read_text()
            assert f"{hosts.addresses[k]} {os.uname().nodename}" in etc_hosts
        # host 0 reaches host 2 through the switch: a connection to a closed port there is
        # refused by host 2's kernel (unreachable would time out)
        probe = ("import socket; s = socket.socket(); s.settimeout(5)\n"
                 "try: s.connect((%r, 9))\nexcept ConnectionRefusedError: print('refused')")
        reach = subprocess.run(["ip", "netns", "exec", hosts.namespaces[0], sys.executable, "-c",
                                probe % hosts.addresses[2]], capture_output=True, text=True)
        assert reach.stdout.strip() == "refused", reach.stdout + reach.stderr
        mine = subprocess.run(["ip", "netns", "exec", hosts.namespaces[1], sys.executable, "-c",
                               "import socket; print(socket.gethostbyname(socket.gethostname()))"],
                              capture_output=True, text=True).stdout.strip()
        assert mine == hosts.addresses[1]
    left = set(namespaces())
    assert not left & {*hosts.namespaces, hosts.switch}
    assert not any((NETNS_ETC / ns).exists() for ns in hosts.namespaces)


def test_link_bytes_sent_counts_a_hosts_own_link():
    """What the bench reads per timed step: inside a host's namespace, its own link's counter,
    which grows by what it sends to another host."""
    send = ("import socket, sys\n"
            "from benchmarks.netns import link_bytes_sent\n"
            "before = link_bytes_sent()\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "for _ in range(100): s.sendto(bytes(1000), (sys.argv[1], 9))\n"
            "print(before, link_bytes_sent())")
    with emulated_hosts(2, None, tag="hvdotest4") as hosts:
        out = subprocess.run(["ip", "netns", "exec", hosts.namespaces[0], sys.executable, "-c",
                              send, hosts.addresses[1]], capture_output=True, text=True)
    before, after = map(int, out.stdout.split())
    assert 100 * 1000 <= after - before < 100 * 1200, out.stdout  # payload plus headers


_RECEIVER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5555))
s.listen(1)
c, _ = s.accept()
while n := int.from_bytes(c.recv(8, socket.MSG_WAITALL), "little"):
    while n:
        n -= len(c.recv(n))
    c.sendall(b"k")
"""

_SENDER = """
import socket, sys, time
size, host = int(sys.argv[1]), sys.argv[2]
for _ in range(50):  # the receiver may still be starting
    try:
        c = socket.create_connection((host, 5555))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Gloo's pairs
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
took = []
for _ in range(7):
    time.sleep(0.05)  # idle: the bucket refills (at 20 Mbit/s, 64 KiB of it in 26 ms); shorter
    # than TCP's retransmission timeout (200 ms), after which it would slow-start again
    t = time.perf_counter()
    c.sendall(size.to_bytes(8, "little") + bytes(size))
    c.recv(1)
    took.append(time.perf_counter() - t)
c.sendall(bytes(8))
print(sorted(took)[3])
"""


_SIZES = {"b": 1, "kb": 1024, "mb": 1024**2}


def _shaper(ns: str, dev: str) -> dict[str, int]:
    """The tbf qdisc of ``dev`` in ``ns`` as ``tc -s`` shows it: its ``burst`` (bytes), and the
    bytes it ``sent`` and packets it ``dropped`` so far."""
    out = subprocess.run(["tc", "-s", "-n", ns, "qdisc", "show", "dev", dev],
                         capture_output=True, text=True).stdout
    burst = re.search(r"\bburst (\d+(?:\.\d+)?)([KMk]?b)\b", out)
    sent = re.search(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+)", out)
    assert burst and sent and "tbf" in out, out
    return {"burst": int(float(burst.group(1)) * _SIZES[burst.group(2).lower()]),
            "sent": int(sent.group(1)), "dropped": int(sent.group(2))}


def test_a_message_after_an_idle_spell_takes_the_links_time():
    """A collective of a few tens of KiB, the first after a pause, as a step's first bucket:
    it crosses at the link's rate, not at the host's (with a 256 KiB bucket it took 1% of the
    link's time), and without a drop on the way (a queue too short dropped packets, and each
    drop cost a retransmission: 57-66 ms instead of 26).

    Both bounds are structural, so load cannot break them: tbf lets at most its bucket
    (``burst``) pass faster than its rate, so a message of ``size`` bytes takes at least
    ``(size - burst) / rate`` whatever the machine does (a loaded machine only makes it
    slower, hence no upper bound on the time); and the shapers on the way count their
    drops."""
    size, rate = 64 * 1024, 20e6 / 8  # 20 Mbit/s: the link's time for 64 KiB is 26 ms
    with emulated_hosts(2, "20mbit", tag="hvdotest5") as hosts:
        path = [(hosts.namespaces[1], "eth0"), (hosts.switch, "p0")]  # sender -> receiver
        before = [_shaper(ns, dev) for ns, dev in path]
        receiver = subprocess.Popen(["ip", "netns", "exec", hosts.namespaces[0],
                                     sys.executable, "-c", _RECEIVER])
        try:
            out = subprocess.run(["ip", "netns", "exec", hosts.namespaces[1], sys.executable,
                                  "-c", _SENDER, str(size), hosts.addresses[0]],
                                 capture_output=True, text=True, timeout=60)
        finally:
            receiver.kill()
            receiver.wait()
        after = [_shaper(ns, dev) for ns, dev in path]
    assert out.returncode == 0, out.stderr
    for (ns, dev), b, a in zip(path, before, after, strict=True):
        assert a["sent"] - b["sent"] >= 7 * size, (ns, dev, b, a)  # the messages went this way
        assert a["dropped"] == b["dropped"], (ns, dev, b, a)
    burst = max(s["burst"] for s in after)
    assert burst < size / 4, burst  # the bucket holds a small part of the message
    # (1% below: tc's rate table and the timer's granularity)
    assert float(out.stdout) >= 0.99 * (size - burst) / rate, (out.stdout, burst)


def test_hosts_are_removed_on_error():
    with pytest.raises(NetnsError), emulated_hosts(2, "0gbit", tag="hvdotest2"):
        pass  # tc refuses a zero rate after the namespaces exist: they must still go
    assert not [n for n in namespaces() if n.startswith("hvdotest2")]


def test_rank_environment_is_horovodruns():
    with emulated_hosts(2, None, tag="hvdotest3") as hosts:
        env = rank_env(hosts, 1, 1234)
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2"
    assert env["HOROVOD_LOCAL_SIZE"] == "1" and env["HOROVOD_CROSS_RANK"] == "1"
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == hosts.switch_address
    assert env["HOROVOD_HOSTNAME"] == hosts.names[1] and env["HOROVOD_GLOO_IFACE"] == "eth0"


JOB = textwrap.dedent("""
    import socket
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    s = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum, name="t")
    g = hvd.allgather_object(socket.gethostbyname(socket.gethostname()), name="addr")
    print(f"RESULT rank={hvd.rank()} size={hvd.size()} local_size={hvd.local_size()} "
          f"cross_size={hvd.cross_size()} sum={float(s[0])} addrs={','.join(g)}", flush=True)
""")


def test_a_gloo_job_runs_across_two_emulated_hosts():
    lines: list[str] = []
    with emulated_hosts(2, "1gbit", tag="hvdotest4") as hosts:
        code = run_on_hosts([sys.executable, "-c", JOB], hosts, timeout=120,
                            on_line=lines.append, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    results = sorted(ln.split(":", 1)[1].strip() for ln in lines if "RESULT" in ln)
    assert code == 0, "".join(lines[-30:])
    addrs = ",".join(hosts.addresses)
    assert results == [f"RESULT rank={r} size=2 local_size=1 cross_size=2 sum=3.0 addrs={addrs}"
                       for r in range(2)]
    assert any(ln.startswith("[1]<stdout>:RESULT rank=1") for ln in lines)


def test_a_failing_rank_stops_the_others():
    script = "import os, sys, time; r = int(os.environ['HOROVOD_RANK']); " \
             "sys.exit(3) if r == 1 else time.sleep(600)"
    with emulated_hosts(2, None, tag="hvdotest5") as hosts:
        t0 = time.monotonic()
        code = run_on_hosts([sys.executable, "-c", script], hosts, timeout=300,
                            on_line=lambda _line: None)
    assert code == 3 and time.monotonic() - t0 < 60


def test_the_timeout_stops_every_rank():
    with emulated_hosts(2, None, tag="hvdotest6") as hosts:
        t0 = time.monotonic()
        code = run_on_hosts([sys.executable, "-c", "import time; time.sleep(600)"], hosts,
                            timeout=2, on_line=lambda _line: None)
    assert code < 0 and time.monotonic() - t0 < 60


def test_hostrun_command_runs_one_rank_per_host():
    from click.testing import CliRunner

    from benchmarks.cli import main

    code = "import os; print('RANK', os.environ['HOROVOD_RANK'], os.environ['HOROVOD_HOSTNAME'])"
    res = CliRunner().invoke(main, ["hostrun", "--np", "2", "--net", "plain", "--timeout", "60",
                                    "--", sys.executable, "-c", code])
    assert res.exit_code == 0, res.output
    ranks = sorted(ln.split(":", 1)[1].split()[1] for ln in res.output.splitlines()
                   if "RANK" in ln)
    assert ranks == ["0", "1"]
    res = CliRunner().invoke(main, ["hostrun", "--np", "2", "--net", "plain", "--timeout", "60",
                                    "--", sys.executable, "-c", "raise SystemExit(4)"])
    assert res.exit_code == 1 and "exited with code 4" in res.output
