"""What an ``"auto"`` setting chooses among: the probe it measures first and the pool of
candidate plans (``auto_choices``), leaving out the plans an optimizer cannot run exactly
and (``usable_pool``) those whose gradients or state the training loop could see."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm import collectives
from hvd_overlap.core import autoplan
from hvd_overlap.core.choice import Auto, StockHorovod
from hvd_overlap.core.exchange import AUTO
from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, VarSpec
from hvd_overlap.core.strategy import Strategy
from hvd_overlap.keras.executors.step_state import TrainLoop


def can_defer(optimizer: Any, strategy: str = "hybrid") -> bool:
    """True if ``strategy``'s deferring plans are exact with this optimizer
    (``validate_deferring``)."""
    from hvd_overlap.keras.validation import validate_deferring

    try:
        validate_deferring(optimizer, strategy)
    except ValueError:
        return False
    return True


def can_shard(optimizer: Any) -> bool:
    """True if the sharded plans are exact with this optimizer (``validate_sharding``, and
    ``validate_deferring`` for their forward-phase all-gathers)."""
    from hvd_overlap.keras.validation import validate_deferring, validate_sharding

    try:
        validate_sharding(optimizer)
        validate_deferring(optimizer, "sharded")
    except ValueError:
        return False
    return True


def auto_choices(optimizer: Any, chosen: Strategy
                 ) -> tuple[Strategy, Callable[[autoplan.Profile], list[Strategy]], str]:
    """(the probe, the pool of candidates for a profile, a label) of an ``"auto"`` setting:

    - ``Auto()``: probe stock Horovod's fusion; pool every whole-state plan
      (``autoplan.WHOLE_STATE``; without the deferring ones if the optimizer cannot defer)
      and, where the optimizer can be sharded, every sharded one, with the dense factor
      exchange where the profile has dense layers (``AutoExecutor`` gives them only where
      the exchange may run);
    - ``bucket_bytes="auto"``: the named strategy at every bucket size (and, for ``hybrid`` and
      ``sharded_hybrid`` without a fixed ``defer``, every split); probe it at the default size.
      ``sharded`` (the user asked for sharding) pools the sharded family, ``sharded_hybrid``
      too where the optimizer can defer;
    - ``defer="auto"`` (``hybrid``, ``sharded_hybrid``): every split at the given bucket size.

    Every candidate keeps the user's other settings (``ordered``, ``gather_with``, a fixed
    ``defer``)."""
    if isinstance(chosen, Auto):
        names = autoplan.WHOLE_STATE if can_defer(optimizer) else ("horovod", "layerwise")
        if can_shard(optimizer):
            names += ("sharded",) + (("sharded_hybrid",)
                                     if can_defer(optimizer, "sharded_hybrid") else ())
        return (StockHorovod(),
                lambda prof: autoplan.candidates(prof, strategies=names, exchange=True), "auto")
    own = chosen.settings()
    fixed = {k: v for k, v in own.items() if k not in ("bucket_bytes", "defer")
             or (k == "defer" and isinstance(v, int))}

    def keeping(c: Strategy) -> Strategy:
        """``c`` with the user's fixed settings (those its class has)."""
        return replace(c, **{k: v for k, v in fixed.items() if k in c.settings()})

    probe = replace(chosen, **{k: v for k, v in (("bucket_bytes", DEFAULT_BUCKET_BYTES),
                                                 ("defer", None))
                              if own.get(k, 0) == AUTO})
    if own["bucket_bytes"] == AUTO:
        family: tuple[str, ...] = (chosen.name,)
        if chosen.name == "sharded" and can_defer(optimizer, "sharded_hybrid"):
            family = autoplan.SHARDED

        def pool(prof: autoplan.Profile) -> list[Strategy]:
            got = autoplan.candidates(prof, strategies=family)
            return list(dict.fromkeys(keeping(c) for c in got))
        return probe, pool, f"{chosen.name} (bucket_bytes='auto')"
    size = int(own["bucket_bytes"])
    return (probe, lambda prof: [keeping(c) for c in autoplan.candidates(
        prof, bucket_sizes=(size,), strategies=(chosen.name,))],
            f"{chosen.name} (defer='auto')")


def shard_blocker(loop: TrainLoop, local_refs: set) -> str | None:
    """Why ``auto``'s sharded plans cannot run in this loop (None: they can)."""
    if loop is TrainLoop.CUSTOM:
        return ("the sharded plans: in a custom loop a checkpoint restored between steps "
                "would not reach the slices (model.fit with OverlapCallback gets them)")
    if local_refs:
        return "the sharded plans: a variable is kept per rank (register_local_var)"
    return None


def exchange_blocker(loop: TrainLoop, settings: Any, local_refs: set) -> str | None:
    """Why the dense factor exchange cannot run here (None: it can)."""
    if hvd.size() < 2:
        return "the exchange: one rank"
    if loop is not TrainLoop.KERAS_FIT:
        return (f"the exchange: its dense kernels' gradients hold each rank's rows only, "
                f"which {loop.value} would see")
    if settings.compression is not hvd.Compression.none:
        return "the exchange: its exchanged activations are not compressed"
    return shard_blocker(loop, local_refs)


def usable_pool(pool: Iterable[Strategy], loop: TrainLoop, settings: Any, local_refs: set
                ) -> tuple[list[Strategy], list[str]]:
    """The candidates this run can take, and what was left out and why (said in the plan)."""
    pool = list(pool)
    if not any(c.shards for c in pool):
        return pool, []
    blocked = shard_blocker(loop, local_refs)
    if blocked is not None:
        return [c for c in pool if not c.shards], [blocked]
    if any(c.exchanges for c in pool):
        return pool, []
    return pool, [exchange_blocker(loop, settings, local_refs)
                  or "the exchange: no dense layer it can carry"]


def dense_batches(layers: Sequence[Any], specs: Sequence[VarSpec], name: str) -> dict[str, int]:
    """The batch each patched dense layer (``ExchangedDense``) saw in the steps so far, by
    kernel name: the largest over the ranks (one small allreduce, every rank at the same
    step); layers that saw none are left out."""
    built = [x for x in layers if x.kernel is not None]
    if not built:
        return {}
    seen = collectives.allreduce(tf.stack([x.batch.read_value() for x in built]), name,
                                 op=hvd.Max)
    names = {v.name for v in specs}
    kernels = [keras_api.var_name(x.kernel) for x in built]
    return {k: int(b) for k, b in zip(kernels, seen.numpy(), strict=True)
            if b > 0 and k in names}
