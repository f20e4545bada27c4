"""Switches for the mutant check (``scripts/mutants``, docs/testing.md): each one turns a single
mechanism off, so that the tests claiming that mechanism can be shown to fail without it.

Only the mutant check sets them, through the environment variable ``HVDO_MUTANT`` (one name);
a user's job never does. An unknown name is refused at import, so a typo in the check cannot
pass for a mutant that nothing kills. Pure Python: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import os

#: name -> the mechanism it switches off (what the tests named for it in scripts/mutants claim)
MUTANTS: dict[str, str] = {
    "deferral": "no step defers: every step lands its whole update within the step",
    "gather_order": "the next step's gathers and deferred buckets are issued all at once, "
                    "input layer last, not one after another in forward order",
    "sharded_update": "the sharded strategies update whole buckets on every rank "
                      "(allreduce) instead of this rank's slice",
    "exchange": "the dense factor exchange never activates: its kernels are reduce-scattered "
                "while the plan still names the exchange",
    "auto_never_switches": "strategy='auto' never leaves its probe plan",
    "auto_drops_state": "strategy='auto' switches plans without carrying the sharded optimizer "
                        "state over",
    "reconsider": "a batch-size growth does not make strategy='auto' choose again",
    "resume": "a sharded checkpoint's optimizer state is not restored",
    "bucket_order": "buckets in forward order (input layer first) instead of backprop order",
    "skip_agreement": "with mixed precision each rank decides alone whether to skip a step "
                      "(compute_gradients returns local gradients)",
    "nadam_refusal": "the Nadam refusal accepts tf.keras.optimizers.Nadam",
    "stall_shutdown": "the 2-rank test launcher's per-test timeout cannot end a rank left "
                      "waiting in a collective (signal method instead of thread)",
    "quiet_hold": "the quiet steps of strategy='auto' send each gradient while backprop still "
                  "runs (the compute they time holds communication)",
}

ACTIVE = os.environ.get("HVDO_MUTANT", "")
if ACTIVE and ACTIVE not in MUTANTS:
    raise ValueError(f"HVDO_MUTANT={ACTIVE!r} is not a mutant; known: {', '.join(MUTANTS)}")


def off(name: str) -> bool:
    """True if the mutant check switched mechanism ``name`` off in this process."""
    if name not in MUTANTS:
        raise KeyError(f"no mutant named {name!r}")
    return ACTIVE == name
