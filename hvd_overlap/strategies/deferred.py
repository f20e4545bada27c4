"""Cross-iteration overlap: buckets deferred into the next step's forward pass.

``deferred`` keeps every bucket's local gradient in a buffer and reduces it at the start of the
next step, in forward order, each layer's forward waiting only for its own bucket's update.
``hybrid`` reduces the output-side buckets during backprop (as ``layerwise``) and defers the
input-side ones, whose gradients appear last. How a bucket travels is ``layerwise``'s; when it is
issued and applied is the optimizer's (``hvd_overlap.keras.optimizer``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hvd_overlap.plan import Plan, VarSpec, build_layerwise_plan, half_the_bytes
from hvd_overlap.strategies.layerwise import LayerwiseStrategy


class DeferredStrategy(LayerwiseStrategy):
    """Every bucket deferred into the next forward (sparse gradients excepted)."""

    name = "deferred"
    defers = True

    def build_plan(self, specs: Sequence[VarSpec]) -> Plan:
        return build_layerwise_plan(specs, self.settings.bucket_bytes, self.name, defer=-1)


class HybridStrategy(LayerwiseStrategy):
    """Output-side buckets during backprop, the last ``defer`` (input-side) ones deferred."""

    name = "hybrid"
    defers = True

    def build_plan(self, specs: Sequence[VarSpec]) -> Plan:
        defer = self.settings.defer
        if defer is None:
            plan = build_layerwise_plan(specs, self.settings.bucket_bytes)
            defer = half_the_bytes([b.nbytes for b in plan.buckets])
        return build_layerwise_plan(specs, self.settings.bucket_bytes, self.name, defer=defer)
