"""Run a command as a Horovod Gloo job on emulated hosts, started the way ``horovodrun`` starts
one: a rendezvous server (``horovod.runner.http.http_server.RendezvousServer`` with the host
assignment of ``-H host0:1,host1:1,...``) and, per rank, the command with the environment
``horovodrun --gloo`` gives it (rendezvous address and port, ``HOROVOD_RANK``/``SIZE``/
``LOCAL_*``/``CROSS_*``, ``HOROVOD_HOSTNAME``, ``HOROVOD_GLOO_IFACE``), one rank per host.
``horovodrun`` itself would reach other hosts over ssh; emulated hosts have no sshd, so the
rendezvous is started here, inside the switch namespace every host reaches.

Each rank's output lines are tagged ``[k]<stdout>:`` as ``horovodrun`` tags them. If a rank
exits non-zero, the others are stopped (as ``horovodrun`` does); so is everything at the timeout.

    python -m benchmarks hostrun --np 2 --net 1gbit -- python train.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from benchmarks import importable
from benchmarks.netns import Hosts, exec_prefix

RENDEZVOUS_READY = "hvdo-rendezvous-port "


def rank_env(hosts: Hosts, rank: int, port: int) -> dict[str, str]:
    """What ``horovodrun --gloo -H host0:1,...`` sets for ``rank`` (one slot per host)."""
    size = len(hosts.names)
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": hosts.switch_address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": hosts.iface, "NCCL_SOCKET_IFNAME": hosts.iface,
        "HOROVOD_HOSTNAME": hosts.names[rank],
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": str(rank), "HOROVOD_CROSS_SIZE": str(size),
        "PYTHONUNBUFFERED": "1",
    }


def serve_rendezvous(names: Sequence[str]) -> None:
    """Run the rendezvous server for one slot on each host in ``names`` until stdin closes
    (the launcher's end of the pipe); print its port first."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    server.init(get_host_assignments(parse_hosts(",".join(f"{n}:1" for n in names)),
                                     len(names)))
    print(f"{RENDEZVOUS_READY}{port}", flush=True)
    sys.stdin.read()  # returns when the launcher exits or closes the pipe
    server.stop()


def stop_all(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM the process group of every process still running (each was started in a session
    of its own), SIGKILL what is left after 15 s."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for p in live:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass


def _start_rendezvous(hosts: Hosts) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [*exec_prefix(hosts.switch), sys.executable, "-m", "benchmarks.hostrun",
         "--serve-rendezvous", *hosts.names], env=importable(dict(os.environ)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(RENDEZVOUS_READY):
            return proc, int(line[len(RENDEZVOUS_READY):])
    stop_all([proc])
    raise RuntimeError("the rendezvous server did not start (is Horovod installed?)")


def run_on_hosts(cmd: Sequence[str], hosts: Hosts, *, timeout: float,
                 on_line: Callable[[str], None], pin: bool = True,
                 env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` as rank k on host k for every host; each tagged output line goes to
    ``on_line``. Returns 0, the first non-zero exit code, or -15 if stopped at ``timeout``.
    ``pin``: rank k runs on core ``k mod cores`` (``taskset``), as ``scripts/pin-rank`` pins
    ranks that share a machine."""
    base = importable(dict(os.environ if env is None else env))
    cores = sorted(os.sched_getaffinity(0))
    rendezvous, port = _start_rendezvous(hosts)
    procs: list[subprocess.Popen] = []
    lock = threading.Lock()

    def pump(rank: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                on_line(f"[{rank}]<stdout>:{line}")

    readers = []
    try:
        for k, ns in enumerate(hosts.namespaces):
            pin_cmd = ["taskset", "-c", str(cores[k % len(cores)])] if pin else []
            p = subprocess.Popen([*exec_prefix(ns), *pin_cmd, *cmd],
                                 env={**base, **rank_env(hosts, k, port)},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
            procs.append(p)
            readers.append(threading.Thread(target=pump, args=(k, p), daemon=True))
            readers[-1].start()
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                code = failed[0] if failed else 0
                break
            if time.monotonic() > deadline:
                code = -signal.SIGTERM
                break
            time.sleep(0.2)
    finally:
        stop_all(procs)
        for r in readers:
            r.join(5)
        if rendezvous.stdin:
            rendezvous.stdin.close()
        stop_all([rendezvous])
    return code


def main(argv: Sequence[str]) -> None:
    """The rendezvous server's process (``_start_rendezvous``); ``python -m benchmarks hostrun``
    is the command."""
    if argv[:1] == ["--serve-rendezvous"]:
        serve_rendezvous(argv[1:])
        return
    raise SystemExit("usage: python -m benchmarks hostrun --np N --net RATE -- COMMAND")


if __name__ == "__main__":
    main(sys.argv[1:])

