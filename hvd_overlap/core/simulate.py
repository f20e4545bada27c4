"""Event-level model of one synchronous data-parallel training step, for every strategy.

One compute resource runs the step's work in program order; one communication channel is
Horovod's background thread, which negotiates the ready requests every cycle and runs their
collectives one at a time, at ring-algorithm cost. Stock Horovod fuses whatever is ready; the
plugin sends each bucket of the plan (``hvd_overlap.core.plan``) as one collective of its own.

This module is the simulator's front door; the model lives in ``hvd_overlap.core.sim``, one
module per concern:

- ``sim.profile``: the profile format (``Layer``, ``Profile``, ``load_profile``, the shipped
  profiles);
- ``sim.cluster``: the cost model (``Cluster``: ring costs, negotiation, CPU steal);
- ``sim.plans``: the simulator's strategy names and each strategy's plan over a profile;
- ``sim.steps``: one step as tasks and requests, one builder per plan family;
- ``sim.events``: the event loop (``run_step``);
- ``sim.run``: ``simulate`` (one step) and ``sweep``.
"""

from hvd_overlap.core.sim.cluster import CYCLE_S, FUSION_BYTES, Cluster
from hvd_overlap.core.sim.events import _EPS, Request, Task, _cost, _responses, run_step
from hvd_overlap.core.sim.plans import (
    EXCHANGE_STRATEGIES,
    RUNTIME_STRATEGIES,
    STRATEGIES,
    ExchangeChoice,
    StepBucket,
    _dense_shapes,
    _specs,
    buckets_of,
    exchange_choices,
    exchange_mode,
    plan_of,
    strategy_of,
)
from hvd_overlap.core.sim.profile import (
    PROFILE_FORMAT,
    SHIPPED,
    Layer,
    Profile,
    load_profile,
    shipped_profiles,
)
from hvd_overlap.core.sim.run import StepResult, simulate, sweep
from hvd_overlap.core.sim.steps import FAMILIES, build_step, plan_family, step_of

_Bucket = StepBucket  # its name before the split

__all__ = [
    "CYCLE_S", "EXCHANGE_STRATEGIES", "FAMILIES",
    "FUSION_BYTES", "PROFILE_FORMAT", "RUNTIME_STRATEGIES", "SHIPPED", "STRATEGIES", "Cluster",
    "ExchangeChoice", "Layer", "Profile", "Request", "StepBucket", "StepResult", "Task",
    "buckets_of", "build_step", "exchange_choices", "exchange_mode", "load_profile",
    "plan_family", "plan_of", "run_step", "shipped_profiles", "simulate", "step_of",
    "strategy_of", "sweep",
    # private names other modules and tests reach for
    "_EPS", "_Bucket", "_cost", "_dense_shapes", "_responses", "_specs",
]
