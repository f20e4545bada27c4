"""Measured per-layer compute, and the hybrid split chosen from it.

``profile_layers`` times each layer's forward and backward on a sample batch (a model whose
layers run one after another, like ``tf.keras.Sequential``). ``choose_defer`` then simulates one
step for every possible split of the plan -- output-side buckets reduced during backprop,
``k`` input-side buckets deferred into the next forward -- on an ideal link of the given
bandwidth (``hvd_overlap.core.sim``'s step builder and event loop), and returns the ``k`` with
the shortest step. Pass it as ``DistributedOptimizer(..., strategy="hybrid", defer=k)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hvd_overlap.core.plan import BACKWARD, FORWARD, Plan
from hvd_overlap.core.sim.cluster import Cluster
from hvd_overlap.core.sim.cluster import parse_rate as parse_bandwidth
from hvd_overlap.core.sim.events import run_step
from hvd_overlap.core.sim.plans import StepBucket
from hvd_overlap.core.sim.profile import Layer, Profile
from hvd_overlap.core.sim.steps import step_of

_TIE = 1e-12  # relative: simulated steps this close are the same step (rounding)


@dataclass(frozen=True)
class LayerTime:
    """Seconds one layer takes forward and backward on the profiled batch."""

    layer: str
    forward: float
    backward: float


def simulate_step(plan_bytes: list[int], bucket_layers: list[list[str]],
                  times: dict[str, LayerTime], forward_order: list[str], defer: int,
                  bandwidth: float) -> float:
    """Seconds of one steady-state step when the last ``defer`` buckets (backward order) are
    deferred, by the core simulator (``hvd_overlap.core.sim``) on an ideal link: a bucket takes
    ``bytes / bandwidth`` (a ring allreduce at 2 ranks, no latency, cycles or negotiation) and
    buckets travel one at a time; a deferred bucket must arrive before its layers' forward; the
    others travel as backprop completes them and must arrive before the step ends."""
    pos = {layer: i for i, layer in enumerate(forward_order)}
    missing = sorted({la for layers in bucket_layers for la in layers} - set(pos))
    if missing or not all(bucket_layers):
        raise ValueError(f"every bucket needs layers of forward_order (not in it: {missing})")
    profile = Profile("profiled", 1, tuple(
        Layer(la, times[la].forward if la in times else 0.0,
              times[la].backward if la in times else 0.0) for la in forward_order))
    n = len(plan_bytes)
    buckets = [StepBucket(i, tuple(sorted({pos[la] for la in bucket_layers[i]})), nbytes, 1, 0.0,
                          FORWARD if i >= n - defer else BACKWARD)
               for i, nbytes in enumerate(plan_bytes)]
    # backprop's buckets in backward order, then the deferred ones in forward order
    ordered = [b for b in buckets if b.phase == BACKWARD] + \
        [b for b in reversed(buckets) if b.phase == FORWARD]
    link = Cluster(ranks=2, bandwidth=bandwidth, cycle_s=0.0)
    tasks, reqs = step_of(profile, ordered, link, "allreduce")
    return run_step(tasks, reqs, link)["end"]


def choose_defer(plan: Plan, times: list[LayerTime], bandwidth: str | float) -> int:
    """The number of input-side buckets to defer that gives the shortest simulated step (the
    smallest such number on a tie)."""
    bw = parse_bandwidth(bandwidth)
    by_layer = {t.layer: t for t in times}
    forward_order = [t.layer for t in times]
    buckets = sorted(plan.buckets, key=lambda b: b.index)  # backward order
    sizes = [b.nbytes for b in buckets]
    layers = [list(b.layers) for b in buckets]
    for b in buckets:
        for lay in b.layers:
            if lay not in by_layer:
                raise ValueError(f"layer {lay!r} of the plan is not in the profile")
    costs = [simulate_step(sizes, layers, by_layer, forward_order, k, bw)
             for k in range(len(buckets) + 1)]
    best = min(costs)  # ties (to rounding: the event loop's sums) go to the smallest k
    return next(k for k, c in enumerate(costs) if c <= best * (1 + _TIE))


def _profiled_layers(model) -> list:
    """The layers ``profile_layers`` times, in forward order (no ``InputLayer``)."""
    import tensorflow as tf

    return [la for la in model.layers if not isinstance(la, tf.keras.layers.InputLayer)]


def profile_layers(model, sample_x, repeats: int = 5) -> list[LayerTime]:
    """Median forward and backward seconds of each layer of ``model`` on ``sample_x``.

    A ``Sequential`` model feeds each layer the previous one's output; any other Keras model
    (ResNet-style branches) is run once to read every layer's real input. Variables are named
    after their layer's name scope, which is what the plan groups by.
    """
    import tensorflow as tf

    out: list[LayerTime] = []
    x = tf.convert_to_tensor(sample_x)
    kept = [v.numpy() for v in model.non_trainable_variables]  # BN statistics move in training
    layers = _profiled_layers(model)
    feed = None
    if not isinstance(model, tf.keras.Sequential):
        feed = tf.keras.Model(model.inputs, [la.input for la in layers])(x, training=False)
    for j, layer in enumerate(layers):
        if feed is not None:
            x = feed[j]
        fwd = tf.function(lambda inp, layer=layer: layer(inp, training=True))

        def bwd(inp, layer=layer):
            with tf.GradientTape() as tape:
                tape.watch(inp)
                y = layer(inp, training=True)
            return tape.gradient(y, tf.nest.flatten(inp) + layer.trainable_variables)

        bwd = tf.function(bwd)
        y = fwd(x)
        bwd(x)  # trace
        f, b = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fwd(x).numpy()
            t1 = time.perf_counter()
            [g.numpy() for g in bwd(x) if g is not None]
            t2 = time.perf_counter()
            f.append(t1 - t0)
            b.append(max(t2 - t1 - (t1 - t0), 0.0))  # the tape replays the forward
        name = layer.trainable_variables[0].name.rsplit("/", 1)[0] if layer.trainable_variables \
            else layer.name
        out.append(LayerTime(name, sorted(f)[repeats // 2], sorted(b)[repeats // 2]))
        x = y
    for v, value in zip(model.non_trainable_variables, kept, strict=True):
        v.assign(value)
    return out


def measure_step(model, sample_x, repeats: int = 5) -> tuple[float, float]:
    """Median seconds of a whole local training step (forward, backward, SGD-momentum update)
    and of the update alone. The model's weights change."""
    import tensorflow as tf

    x = tf.convert_to_tensor(sample_x)
    variables = model.trainable_variables
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        return tape.gradient(loss, variables)

    @tf.function
    def update(gs):
        opt.apply_gradients(zip(gs, variables, strict=True))
        return opt.iterations

    @tf.function
    def step():
        return update(grads())

    gs = grads()
    timings: dict[str, list[float]] = {"step": [], "update": []}
    for _ in range(repeats + 1):
        for key, fn in (("step", step), ("update", lambda: update(gs))):
            t0 = time.perf_counter()
            fn().numpy()
            timings[key].append(time.perf_counter() - t0)
    med = {k: sorted(v[1:])[repeats // 2] for k, v in timings.items()}  # first: tracing
    return med["step"], med["update"]


def measured_profile(model, sample_x, repeats: int = 5, name: str | None = None):
    """A ``hvd_overlap.core.simulate.Profile`` of ``model`` measured here on ``sample_x``:
    per-layer forward/backward medians, exact gradient bytes, the update time, the whole step's
    time."""
    import numpy as np
    import tensorflow as tf

    from hvd_overlap.keras.flops import dense_kernel

    times = profile_layers(model, sample_x, repeats)
    step_s, update_s = measure_step(model, sample_x, repeats)
    layers = []
    for t, layer in zip(times, _profiled_layers(model), strict=True):
        ws = layer.trainable_weights
        layers.append(Layer(t.layer, t.forward, t.backward,
                            sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in ws),
                            ws[0].dtype.name if ws else "float32", len(ws),
                            dense=dense_kernel(layer)))
    profile = Profile(model=name or model.name, batch_size=int(np.shape(sample_x)[0]),
                      layers=tuple(layers), update_s=update_s)
    profile.meta.update({"source": "measured", "step_s": step_s,
                         "layer_sum_s": profile.compute_s, "repeats": repeats})
    return profile


def hybrid_defer(model, sample_x, bandwidth: str | float,
                 bucket_bytes: int | None = None, repeats: int = 5) -> int:
    """Profile ``model`` on ``sample_x`` and return the ``defer`` for ``strategy="hybrid"``:
    ``DistributedOptimizer(opt, strategy="hybrid", defer=hybrid_defer(model, x, "1gbit"))``.

    Run it on every rank with the same arguments only if the result cannot differ, or run it
    on rank 0 and broadcast the number: every rank must use the same plan.
    """
    from hvd_overlap.comm.planner import var_specs
    from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, build_layerwise_plan

    plan = build_layerwise_plan(var_specs(model.trainable_variables),
                                bucket_bytes or DEFAULT_BUCKET_BYTES)
    return choose_defer(plan, profile_layers(model, sample_x, repeats), bandwidth)
