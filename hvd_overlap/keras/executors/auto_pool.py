"""What an ``"auto"`` setting chooses among: the probe it measures first and the pool of
candidate plans (``auto_choices``), leaving out the plans an optimizer cannot run exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hvd_overlap.core import autoplan
from hvd_overlap.core.autoplan import Candidate
from hvd_overlap.core.exchange import AUTO


def can_defer(optimizer: Any, strategy: str = "hybrid") -> bool:
    """True if ``strategy``'s deferring plans are exact with this optimizer
    (``validate_deferring``)."""
    from hvd_overlap.keras.validation import validate_deferring

    try:
        validate_deferring(optimizer, strategy, per_bucket=strategy != "sharded_hybrid")
    except ValueError:
        return False
    return True


def auto_choices(optimizer: Any, strategy: str, bucket_bytes: int | str, defer: int | str | None
                 ) -> tuple[Candidate, Callable[[autoplan.Profile], list[Candidate]], str]:
    """(the probe, the pool of candidates for a profile, a label) of an ``"auto"`` setting:

    - ``strategy="auto"``: probe stock Horovod's fusion; pool every whole-state plan
      (``autoplan.WHOLE_STATE``; without the deferring ones if the optimizer cannot defer);
    - ``bucket_bytes="auto"``: the named strategy at every bucket size (and, for ``hybrid`` and
      ``sharded_hybrid`` without a fixed ``defer``, every split); probe it at the default size.
      ``sharded`` (the user asked for sharding) pools the sharded family, ``sharded_hybrid``
      too where the optimizer can defer;
    - ``defer="auto"`` (``hybrid``, ``sharded_hybrid``): every split at the given bucket size.
    """
    from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES

    if strategy == AUTO:
        names = autoplan.WHOLE_STATE if can_defer(optimizer) else ("horovod", "layerwise")
        return (Candidate("horovod"), lambda prof: autoplan.candidates(prof, strategies=names),
                "auto")
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
