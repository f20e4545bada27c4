"""The reference: stock Horovod behaviour (one allreduce per gradient, fused by readiness)."""

from __future__ import annotations

from collections.abc import Sequence

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.plan import Bucket, Plan, VarSpec, check_dtypes
from hvd_overlap.strategies.base import Grad, Strategy


class HorovodStrategy(Strategy):
    """Exactly what ``horovod.tensorflow.keras.DistributedOptimizer`` does: the same Horovod
    gradient function, so its results are the stock ones."""

    name = "horovod"

    def build_plan(self, specs: Sequence[VarSpec]) -> Plan:
        check_dtypes(specs)
        ordered = sorted(specs, key=lambda v: -v.index)  # gradients appear output layer first
        return Plan(
            strategy=self.name,
            bucket_bytes=0,
            buckets=tuple(Bucket(index=i, variables=(v,)) for i, v in enumerate(ordered)),
            notes=("one allreduce per gradient; Horovod fuses whatever is ready each cycle "
                   "(HOROVOD_CYCLE_TIME, HOROVOD_FUSION_THRESHOLD), in the order it negotiates",),
        )

    def reduce(self, grads: Sequence[Grad], variables: Sequence[tf.Variable],
               plan: Plan) -> list[Grad]:
        s = self.settings
        fn = hvd._make_allreduce_grads_fn(  # the function stock Horovod uses
            s.name, s.device_dense, s.device_sparse, s.compression, s.sparse_as_dense, s.op,
            s.gradient_predivide_factor, s.groups, process_set=hvd.global_process_set)
        return list(fn(list(grads), list(variables)))
