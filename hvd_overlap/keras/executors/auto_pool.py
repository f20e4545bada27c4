"""What an ``"auto"`` setting chooses among: the probe it measures first and the pool of
candidate plans (``auto_choices``), leaving out the plans an optimizer cannot run exactly
and (``usable_pool``) those whose gradients or state the training loop could see."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.core import autoplan
from hvd_overlap.core.autoplan import Candidate
from hvd_overlap.core.exchange import AUTO
from hvd_overlap.core.plan import VarSpec
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


def auto_choices(optimizer: Any, strategy: str, bucket_bytes: int | str, defer: int | str | None
                 ) -> tuple[Candidate, Callable[[autoplan.Profile], list[Candidate]], str]:
    """(the probe, the pool of candidates for a profile, a label) of an ``"auto"`` setting:

    - ``strategy="auto"``: probe stock Horovod's fusion; pool every whole-state plan
      (``autoplan.WHOLE_STATE``; without the deferring ones if the optimizer cannot defer)
      and, where the optimizer can be sharded, every sharded one, with the dense factor
      exchange where the profile has dense layers (``AutoExecutor`` gives them only where
      the exchange may run);
    - ``bucket_bytes="auto"``: the named strategy at every bucket size (and, for ``hybrid`` and
      ``sharded_hybrid`` without a fixed ``defer``, every split); probe it at the default size.
      ``sharded`` (the user asked for sharding) pools the sharded family, ``sharded_hybrid``
      too where the optimizer can defer;
    - ``defer="auto"`` (``hybrid``, ``sharded_hybrid``): every split at the given bucket size.
    """
    from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES

    if strategy == AUTO:
        names = autoplan.WHOLE_STATE if can_defer(optimizer) else ("horovod", "layerwise")
        if can_shard(optimizer):
            names += ("sharded",) + (("sharded_hybrid",)
                                     if can_defer(optimizer, "sharded_hybrid") else ())
        return (Candidate("horovod"),
                lambda prof: autoplan.candidates(prof, strategies=names, exchange=True), "auto")
    fixed_defer = defer if isinstance(defer, int) else None
    if bucket_bytes == AUTO:
        family: tuple[str, ...] = (strategy,)
        if strategy == "sharded" and can_defer(optimizer, "sharded_hybrid"):
            family = autoplan.SHARDED

        def pool(prof: autoplan.Profile) -> list[Candidate]:
            got = autoplan.candidates(prof, strategies=family)
            if fixed_defer is None:
                return got
            return list(dict.fromkeys(Candidate(strategy, c.bucket_bytes, fixed_defer)
                                      for c in got))
        return (Candidate(strategy, DEFAULT_BUCKET_BYTES, fixed_defer), pool,
                f"{strategy} (bucket_bytes='auto')")
    size = int(bucket_bytes)
    return (Candidate(strategy, size, None),
            lambda prof: autoplan.candidates(prof, bucket_sizes=(size,), strategies=(strategy,)),
            f"{strategy} (defer='auto')")


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


def usable_pool(pool: Iterable[Candidate], loop: TrainLoop, settings: Any, local_refs: set
                ) -> tuple[list[Candidate], list[str]]:
    """The candidates this run can take, and what was left out and why (said in the plan)."""
    pool = list(pool)
    if not any(c.strategy in autoplan.SHARDED for c in pool):
        return pool, []
    blocked = shard_blocker(loop, local_refs)
    if blocked is not None:
        return [c for c in pool if c.strategy not in autoplan.SHARDED], [blocked]
    if any(c.exchange for c in pool):
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
    seen = hvd.allreduce(tf.stack([x.batch.read_value() for x in built]), op=hvd.Max,
                         name=name, ignore_name_scope=True)
    names = {v.name for v in specs}
    return {x.kernel.name: int(b) for x, b in zip(built, seen.numpy(), strict=True)
            if b > 0 and x.kernel.name in names}
