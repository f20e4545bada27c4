"""``bench --regime R``: choose the emulated link rate from the measured compute-only step, so
that stock Horovod's gradient traffic takes R times that step on the wire.

The regime R = stock's wire time per step / the compute-only step is what decides whether
overlap or fewer bytes can help (BRIEF.md, "regimes, not link rates"); a fixed link rate is a
different regime on every day this machine's speed changes. The bench first measures the
``local`` strategy (no communication) on the plain loopback, then picks the rate with
``regime_rate`` and runs the requested strategies on the emulated network at that rate.

Stock's traffic is a ring allreduce of every gradient: each rank sends ``2 (P-1)/P`` times the
gradient bytes per step (``hvd_overlap.tools.models.gradient_bytes``); on one shared shaped
loopback every rank's traffic passes the same queue. The emulated link carries less than its
nominal rate (TCP/IP headers, ``tbf``'s bursts, Horovod's own pauses between collectives):
``LINK_EFFICIENCY`` is the measured share of the rate stock's allreduces achieve, and the rate is
raised by it so that the achieved regime lands near the one asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from benchmarks.config import LOCAL, STOCK, BenchConfig
from hvd_overlap.core.sim.cluster import parse_rate

#: Share of the nominal ``tbf`` rate stock's allreduces achieve on the emulated hosts: its bytes
#: / rate against its timeline wire time, measured on vgg 32/rank at R = 2 (0.950 and 0.955 in
#: two runs at ~155 Mbit/s; uncorrected, R = 2 came out as 2.10 and 2.11); see docs/bench.md.
LINK_EFFICIENCY = 0.95


def ring_bytes(grad_bytes: float, ranks: int) -> float:
    """Bytes each rank sends per step for a ring allreduce of ``grad_bytes``."""
    return 2 * (ranks - 1) / ranks * grad_bytes


def regime_rate(regime: float, compute_s: float, grad_bytes: float, ranks: int,
                shared: bool = False, efficiency: float = LINK_EFFICIENCY) -> str:
    """The tc rate (``"83200kbit"``) at which stock's ring allreduce of ``grad_bytes`` per step
    takes ``regime`` times ``compute_s`` on the wire: its bytes per rank (times ``ranks`` when
    all ranks share one queue, ``shared``) / (regime x compute_s x efficiency). Rounded to whole
    kbit/s; ``parse_rate`` reads it back. Raises ValueError for a non-positive input or a
    single rank (no traffic)."""
    if regime <= 0 or compute_s <= 0 or grad_bytes <= 0 or not 0 < efficiency <= 1:
        raise ValueError("a regime needs a positive regime, compute step and gradient size, "
                         "and an efficiency in (0, 1]")
    if ranks < 2:
        raise ValueError("a regime needs 2 or more ranks: one rank sends nothing")
    on_queue = ring_bytes(grad_bytes, ranks) * (ranks if shared else 1)
    bits_per_s = 8 * on_queue / (regime * compute_s * efficiency)
    return f"{max(1, round(bits_per_s / 1e3))}kbit"


def measure_compute_only(cfg: BenchConfig, on_progress: Callable[[str], None]) -> dict[str, Any]:
    """The compute-only step of ``cfg``'s model, batch and ranks: one launch of ``local`` on
    the plain loopback (same warm-up, steps and pinning). Its raw result (``launch.merge``)."""
    from benchmarks import launch

    probe = replace(cfg, strategies=(LOCAL,), net="plain", rounds=1, history=0, regime=None,
                    whole_fit=0)
    raw = launch.run_bench(probe, on_progress)
    if raw is None:
        raise ValueError("--regime measures its compute-only step in a launch of its own: run "
                         "the bench outside horovodrun")
    return raw


def link_rate(raw: dict[str, Any]) -> float | None:
    """The run's link rate in bytes/s (None on the plain loopback)."""
    from benchmarks.netns import parse_net

    net = parse_net(raw["config"]["net"])
    return None if net is None else parse_rate(net)


def compute_only_s(raw: dict[str, Any], steps: dict[str, float]) -> float | None:
    """The compute-only step: this run's ``local`` if it ran one, else the probe's."""
    if LOCAL in steps:
        return steps[LOCAL]
    return (raw.get("regime") or {}).get("probe_compute_s")


def achieved(raw: dict[str, Any], steps: dict[str, float]) -> float | None:
    """Stock's wire time per step (its timeline) / the compute-only step; None without one."""
    wire = (raw.get("wire_time_per_step_s") or {}).get(STOCK)
    compute = compute_only_s(raw, steps)
    return wire / compute if wire and compute else None


def bound(compute_s: float | None, sent_bytes: float | None, rate: float | None,
          queue_share: int = 1) -> float | None:
    """The physical bound of a step: max(compute-only step, bytes the rank sent / link rate),
    the bytes times ``queue_share`` when ranks share one queue. None if a figure is missing."""
    if compute_s is None or rate is None or sent_bytes is None:
        return None
    return max(compute_s, sent_bytes * queue_share / rate)
