"""What every strategy shares: its settings, and the two things it must do (plan, reduce)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from hvd_overlap.plan import Plan, VarSpec

Grad = tf.Tensor | tf.IndexedSlices | None


@dataclass(frozen=True)
class CommSettings:
    """Horovod-compatible knobs, named as in ``hvd.DistributedOptimizer``."""

    name: str
    op: Any
    compression: Any
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    device_dense: str = ""
    device_sparse: str = ""
    bucket_bytes: int = 0
    ordered: bool = False
    defer: int | None = None  # hybrid: input-side buckets deferred (None: half the bytes)
    groups: Any = None
    gather_with: str = "allgather"  # sharded: "allgather" or "alltoall" (see collectives)


class Strategy(ABC):
    """Turns a list of trainable variables into a plan, and local gradients into global ones."""

    name: str = ""
    #: True if some buckets are deferred into the next step's forward (needs OverlapCallback)
    defers: bool = False
    #: True if each rank updates only its slice of every bucket (the sharded strategy)
    shards: bool = False

    def __init__(self, settings: CommSettings):
        self.settings = settings

    @abstractmethod
    def build_plan(self, specs: Sequence[VarSpec]) -> Plan:
        """The communication plan for these variables (pure Python, no collectives)."""

    @abstractmethod
    def reduce(self, grads: Sequence[Grad], variables: Sequence[tf.Variable],
               plan: Plan) -> list[Grad]:
        """Issue the plan's collectives; return global gradients in the order of ``grads``."""
