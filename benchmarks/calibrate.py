"""The calibration on this machine's emulated networks: ``hvd_overlap.tools.collective_costs``
(what ``hvd-overlap calibrate`` runs on a real cluster) in ranks on this host's loopback, one
shaped loopback, or emulated hosts, pinned as the benchmark's ranks are.

``python -m benchmarks calibrate --net plain --net 1gbit --json FILE`` (``--np 2 --np 3 --np
4``: the same at each rank count, ranks beyond the cores sharing them as the benchmark's do; how
the costs grow with the ranks is then fitted, ``hvd_overlap.core.sim.laws``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any


def calibrate(net: str, timeout: float = 600.0, net_model: str = "hosts", ranks: int = 2,
              repeats: int = 9) -> dict[str, Any]:
    """``measure_cycles`` (``{"fit", "short_cycle", "default_cycle"}``) of ``ranks`` ranks on
    ``net``: this machine's loopback, one shaped loopback (``plain`` or a tc rate of
    ``net_model``), or ``ranks`` emulated hosts, as the benchmark runs them; each timing is the
    median of ``repeats`` collectives (fewer: quicker on a slow link)."""
    from benchmarks.hostrun import run_on_hosts
    from benchmarks.launch import (
        ENV_DEFAULTS,
        BenchError,
        horovodrun_command,
        run_logged,
    )
    from benchmarks.netns import (
        HOSTS,
        emulated_hosts,
        exec_prefix,
        parse_net,
        shaped_namespace,
    )

    rate = parse_net(net)
    env = dict(ENV_DEFAULTS)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hvdo-cal-")))
        worker = [sys.executable, "-m", "benchmarks.calibrate", str(tmp / "out.json"), str(repeats)]
        if rate is not None and net_model == HOSTS:
            hosts = stack.enter_context(emulated_hosts(ranks, rate))
            with open(tmp / "log", "w") as log:
                code = run_on_hosts(worker, hosts, timeout=timeout, on_line=log.write,
                                    env={**os.environ, **env})
        else:
            cmd = horovodrun_command(ranks, worker)
            if rate is not None:
                cmd = exec_prefix(stack.enter_context(shaped_namespace(rate))) + cmd
            code = run_logged(cmd, tmp / "log", timeout, lambda _line: None, env=env)
        out = tmp / "out.json"
        if code != 0 or not out.exists():
            tail = "\n".join((tmp / "log").read_text().splitlines()[-20:])
            raise BenchError(f"calibration of {ranks} ranks on net {net} failed (exit {code}):"
                             f"\n{tail}")
        return json.loads(out.read_text())


if __name__ == "__main__":  # a rank of the launch: pinned as the bench's ranks, then measured
    from benchmarks.worker import pin_rank
    from hvd_overlap.tools.collective_costs import measure_cycles

    pin_rank()
    result = measure_cycles(int(sys.argv[2]) if len(sys.argv) > 2 else 9)
    if result is not None:
        Path(sys.argv[1]).write_text(json.dumps(result, indent=2))
