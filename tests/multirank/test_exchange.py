"""The dense factor exchange (``strategy="sharded", exchange=...``): a dense kernel's gradient
rows computed from exchanged inputs and output errors reach stock Horovod's weights; the local
weight-gradient GEMM is gone from the graph; the plan decides per layer.

What the exchange carried is read from what ran, not from the plan: the train functions the
steps called (the ``train_steps`` fixture records them) hold the exchange's collectives -- the
input's all-to-all ``<layer>.<call>.x``, the output errors' all-gather ``.dy`` and, with the
forward on the rows, the partial outputs' all-to-all ``.y`` -- and no reduce-scatter of the
kernel's bucket; the patched layers are active. (Horovod's op names are the names the plugin
gives, ``ignore_name_scope=True``: the same on every rank and in every trace.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from hvd_overlap.core.exchange import row_range
from hvd_overlap.core.plan import ALLREDUCE, EXCHANGE_ROWS, EXCHANGES
from tests.graphs import ancestors
from tests.multirank.helpers import (
    BATCH,
    LOSS,
    MODELS,
    OPTIMIZERS,
    ModelCheckpointInTmp,
    Result,
    assert_fit_saw_stocks_weights,
    assert_weights_close,
    max_abs_diff,
    ours,
    rank_data,
    same_on_all_ranks,
    step_for,
    stock,
    stock_reference,
    train_fit,
    train_loop,
)
from tests.multirank.test_keras_usage import RecordEvery, ResetAt, _fit_mixed

if TYPE_CHECKING:
    from tests.multirank.conftest import TrainSteps

Op = tuple[str, str]  # a Horovod op in a traced graph: (type, name)


def _plan_exchanged(opt: Any) -> list[str]:
    """The layers whose kernels the plan names for the exchange, sorted."""
    return sorted(v.name.split("/")[0] for b in opt.plan.buckets if b.collective in EXCHANGES
                  for v in b.variables)


def _plan_kept(opt: Any) -> list[str]:
    """The layers whose forward the plan puts on the rows, sorted."""
    return sorted(v.name.split("/")[0] for b in opt.plan.buckets
                  if b.collective == EXCHANGE_ROWS for v in b.variables)


def _horovod_ops(fn: Any) -> set[Op]:
    """Every Horovod op of the graphs ``fn`` (a ``tf.function``) traced, the functions nested
    in them (``tf.cond`` branches) included, named as Horovod names the tensor it negotiates
    (``ignore_name_scope=True``: the name scope cut off)."""
    out: set[Op] = set()
    for concrete in fn._list_all_concrete_functions_for_serialization():
        graph = concrete.graph.as_graph_def()
        nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
        out |= {(n.op, n.name.rsplit("/", 1)[-1]) for n in nodes if n.op.startswith("Horovod")}
    return out


@dataclass(frozen=True)
class Ran:
    """What the recorded train steps did with the patched dense layers (sorted layer names)."""

    exchanged: list[str]  # kernel gradient by the exchange in every step, never reduce-scattered
    kept: list[str]       # ...and the forward on the rows in every step
    graphs: list[set[Op]]  # each distinct train function's Horovod ops


def _bucket_names(opt: Any) -> dict[Any, str]:
    """Each variable's (ref) bucket name prefix in the executor's collectives (``<name>.b<k>``:
    ``.rs`` its reduce-scatter, ``.ag`` its gather)."""
    st, name = opt._hvdo.state, opt._hvdo.settings.name
    return {st.variables[s.index].ref(): f"{name}.b{b.bucket}" for b in st.layout.buckets
            for s in b.segments}


def _ran(opt: Any, steps: TrainSteps, since: int = 1) -> Ran:
    """Read from the train functions of ``opt``'s steps ``since`` on (the first step always
    reduce-scatters: the exchange starts at the retrace after it). A layer counts as exchanged
    if every one of them holds its input's all-to-all and its output errors' all-gather and no
    reduce-scatter of its kernel; it must then be active (and ``keep``: on the rows)."""
    fns: list[Any] = []
    for fn in steps.of(opt)[since:]:
        if not any(fn is f for f in fns):
            fns.append(fn)
    assert fns, "no train step of this optimizer was recorded"
    graphs = [_horovod_ops(fn) for fn in fns]
    bucket = _bucket_names(opt)
    exchanged, kept = [], []
    for x in opt._hvdo.exchange.layers:
        if x.kernel is None:
            continue
        scatter = f"{bucket[x.kernel.ref()]}.rs"
        if all(("HorovodAlltoall", f"{x.name}.0.x") in g and
               ("HorovodAllgather", f"{x.name}.0.dy") in g and
               not any(n == scatter for _, n in g) for g in graphs):
            assert x.active, f"{x.layer.name}: exchanged in the graph, but not active"
            exchanged.append(x.layer.name)
            if all(("HorovodAlltoall", f"{x.name}.0.y") in g for g in graphs):
                assert x.keep, f"{x.layer.name}: its forward ran on the rows, but not keep"
                kept.append(x.layer.name)
    return Ran(sorted(exchanged), sorted(kept), graphs)


def _assert_ran_as_planned(opt: Any, steps: TrainSteps, exchanged: Sequence[str],
                           kept: Sequence[str] = (), since: int = 1) -> Ran:
    """The steps exchanged the kernels of ``exchanged`` (with the forward on the rows for
    ``kept``), as the plan says."""
    ran = _ran(opt, steps, since)
    assert ran.exchanged == sorted(exchanged), (ran.exchanged, _plan_exchanged(opt))
    assert ran.kept == sorted(kept), (ran.kept, _plan_kept(opt))
    assert _plan_exchanged(opt) == ran.exchanged and _plan_kept(opt) == ran.kept
    return ran


@pytest.mark.parametrize("opt_name, forward", [
    ("sgd_momentum", "gather"), ("sgd_momentum", "rows"), ("adam", "rows"), ("rmsprop", "gather"),
])
def test_fit_matches_stock(opt_name, forward, train_steps):
    """Every trainable dense kernel by the exchange (exchange='always'), rows even and odd,
    with and without bias and activation, a frozen layer beside them; their updated rows
    gathered, or kept where they are (the forward on the rows; validation between epochs)."""
    got = train_fit("dense_mix", opt_name,
                    ours("sharded", exchange="always", exchange_forward=forward),
                    validation=True)
    ref = stock_reference("dense_mix", opt_name)
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)
    assert_fit_saw_stocks_weights(got, ref)
    every = ["logits", "nobias", "wide"]
    _assert_ran_as_planned(got.optimizer, train_steps, every, every if forward == "rows" else [])


@pytest.mark.parametrize("model, opt_name, forward", [
    ("cnn_bn", "adam", "gather"), ("cnn_bn", "sgd_momentum", "rows"),
    ("embedding", "rmsprop", "rows"),
])
def test_only_the_dense_kernels_sharded_matches_stock(model, opt_name, forward, train_steps):
    """``shard="dense"``: the convolutions, batch norms and embedding allreduced whole and
    updated on every rank, the dense kernels exchanged and sharded by rows; validation and a
    predict inside ``fit``."""
    got = train_fit(model, opt_name, ours("sharded", exchange="always", bucket_bytes=2048,
                                          exchange_forward=forward, shard="dense"),
                    validation=True)
    ref = stock_reference(model, opt_name)
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)
    assert_fit_saw_stocks_weights(got, ref)
    plan, layout = got.optimizer.plan, got.optimizer._hvdo.state.layout
    whole = [b for b in plan.buckets if b.whole]
    assert len(whole) >= 2 and {b.collective for b in whole} == {ALLREDUCE}
    assert all(b.rows for b in plan.buckets if not b.whole)
    ran = _ran(got.optimizer, train_steps)  # both dense kernels
    assert len(ran.exchanged) == 2 and ran.kept == (ran.exchanged if forward == "rows" else [])
    assert _plan_exchanged(got.optimizer) == ran.exchanged
    assert all(s.shard_size == s.total for s in layout.buckets if s.whole)


def test_kernel_regularizers_match_stock(train_steps):
    """An L2 term on a kernel adds its (local, equal on every rank) gradient to the exchanged
    rows: this rank's rows of the sum are still those of stock's average."""
    got = train_fit("dense_l2", "sgd_momentum", ours("sharded", exchange="always"))
    assert_weights_close(got, stock_reference("dense_l2", "sgd_momentum"))
    ran = _ran(got.optimizer, train_steps)
    assert len(ran.exchanged) == 2 and _plan_exchanged(got.optimizer) == ran.exchanged  # both


def test_auto_decides_per_layer_and_matches_stock(train_steps):
    """At 16 per rank on 2 ranks the exchange pays for the 144x33 kernel only."""
    got = train_fit("dense_mix", "adam", ours("sharded", exchange="auto", bucket_bytes=2048))
    assert_weights_close(got, stock_reference("dense_mix", "adam"))
    _assert_ran_as_planned(got.optimizer, train_steps, ["wide"])
    notes = "\n".join(got.optimizer.plan.notes)
    assert "wide/kernel:0 [144, 33] at 16/rank" in notes and ": exchange+allgather (" in notes
    assert "nobias/kernel:0 [33, 17] at 16/rank" in notes


@pytest.mark.parametrize("opt_name", ["adam", "legacy_adam"])
def test_kernels_the_exchange_declines_are_allreduced_whole(opt_name, train_steps):
    """``exchange="auto", shard="dense"``: the kernels the exchange declines at the batch seen
    (nobias's 33x17 and the logits' 12x10 at 16 per rank) leave the row-sliced layout after the
    first step -- their slices and slots (Adam's moments, one step old) cut again as whole
    buckets, allreduced during backprop -- and the weights are stock's."""
    wrap = ours("sharded", exchange="auto", bucket_bytes=2048, shard="dense")
    got = train_fit("dense_mix", opt_name, wrap, validation=True)
    ref = stock_reference("dense_mix", opt_name)
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)
    assert_fit_saw_stocks_weights(got, ref)
    opt = got.optimizer
    ran = _assert_ran_as_planned(opt, train_steps, ["wide"])
    layout, bucket = opt._hvdo.state.layout, _bucket_names(opt)
    assert [s.name.split("/")[0] for b in layout.buckets if not b.whole
            for s in b.segments] == ["wide"]
    declined = [v for v in opt._hvdo.state.variables
                if v.name.split("/")[0] in ("nobias", "logits") and "kernel" in v.name]
    assert len(declined) == 2
    for g in ran.graphs:  # after the first step: allreduced with a whole bucket, not scattered
        names = {n for _, n in g}
        for v in declined:
            assert ("HorovodGroupedAllreduce", bucket[v.ref()]) in g, (v.name, sorted(g))
            assert f"{bucket[v.ref()]}.rs" not in names and f"{bucket[v.ref()]}.ag" not in names


@pytest.mark.parametrize("forward", ["gather", "rows"])
def test_shared_layer_and_sharded_hybrid_match_stock(forward, train_steps):
    """One Dense layer called on two inputs: two exchanges per step, their rows summed."""
    got = train_fit("shared_layer", "sgd_momentum",
                    ours("sharded_hybrid", exchange="always", bucket_bytes=2048,
                         exchange_forward=forward))
    assert_weights_close(got, stock_reference("shared_layer", "sgd_momentum"))
    ran = _ran(got.optimizer, train_steps)  # the shared layer and the output layer
    assert len(ran.exchanged) == 2 and "shared" in ran.exchanged
    assert ran.kept == (ran.exchanged if forward == "rows" else [])
    assert _plan_exchanged(got.optimizer) == ran.exchanged
    shared = next(x.name for x in got.optimizer._hvdo.exchange.layers
                  if x.layer.name == "shared")
    for g in ran.graphs:  # one exchange per call: the second call's collectives too
        assert {("HorovodAlltoall", f"{shared}.1.x"), ("HorovodAllgather", f"{shared}.1.dy")} <= g


def test_rows_gathered_by_alltoall_match_stock(train_steps):
    """gather_with='alltoall' gathers the uneven rows through an alltoall with named splits."""
    got = train_fit("dense_mix", "adam", ours("sharded", exchange="always",
                                              gather_with="alltoall"))
    assert_weights_close(got, stock_reference("dense_mix", "adam"))
    ran = _assert_ran_as_planned(got.optimizer, train_steps, ["logits", "nobias", "wide"])
    bucket = _bucket_names(got.optimizer)
    kernels = {f"{bucket[x.kernel.ref()]}.ag" for x in got.optimizer._hvdo.exchange.layers
               if x.active}
    for g in ran.graphs:  # the exchanged kernels' rows gathered by alltoall, none by allgather
        assert {("HorovodAlltoall", k) for k in kernels} <= g, sorted(g)
        assert not [n for t, n in g if t == "HorovodAllgather" and n.endswith(".ag")]


@pytest.mark.parametrize("opt_name, forward", [("sgd_momentum", "gather"), ("adam", "gather"),
                                               ("adam", "rows")])
def test_custom_loop_matches_distributed_tape(opt_name, forward, train_steps):
    ref = train_loop("dense_mix", opt_name, lambda o: o, tape_wrap=hvd_tf.DistributedGradientTape)
    got = train_loop("dense_mix", opt_name, ours("sharded", exchange="always",
                                                 exchange_forward=forward))
    assert_weights_close(got, ref)
    every = ["logits", "nobias", "wide"]
    _assert_ran_as_planned(got.optimizer, train_steps, every, every if forward == "rows" else [])


@pytest.mark.parametrize("kept", ["rows", "gather"])
def test_online_check_between_rows_and_gather_matches_stock(kept, train_steps):
    """``exchange_forward="auto"``: the cost model puts the 1024x1024 kernel's forward on the
    rows; the online check runs that, then the gather, then keeps one (forced here, both
    ways): every switch lands the pending update first, so the weights equal stock's."""
    from hvd_overlap.keras.exchange_choice import DenseExchanges

    DenseExchanges.forced_forward = kept
    try:
        got = train_fit("dense_big", "adam", ours("sharded", exchange="auto"), validation=True)
    finally:
        DenseExchanges.forced_forward = None
    assert_weights_close(got, stock_reference("dense_big", "adam"))
    assert same_on_all_ranks(got)
    keep_opt = got.optimizer
    ex = keep_opt._hvdo.exchange
    assert ex.settled and ex.trial.measured.keys() == {"rows", "gather"}
    assert ex.trial.running == kept
    assert _ran(keep_opt, train_steps).exchanged == ["big", "first"]  # both ways exchange
    # the way kept is what the last steps ran
    _assert_ran_as_planned(keep_opt, train_steps, ["big", "first"],
                           ["big"] if kept == "rows" else [], since=-2)
    assert any("exchange_forward='auto', measured: rows" in n for n in keep_opt.plan.notes)


def test_rows_stay_on_their_rank_until_flush(train_steps):
    """With the forward on the rows, training steps never write a kernel: after steps in a
    custom loop it is as the first step (before the decision) left it, each rank's rows --
    the slice its forward reads and its optimizer updates -- equal stock Horovod's, and
    ``flush`` brings in the whole kernel."""
    tf.keras.utils.set_random_seed(5)
    model = MODELS["dense_mix"]()
    opt = hvdo.DistributedOptimizer(OPTIMIZERS["adam"](), strategy="sharded",
                                    exchange="always", exchange_forward="rows")
    tf.keras.utils.set_random_seed(5)
    ref_model = MODELS["dense_mix"]()
    ref_opt = hvd.DistributedOptimizer(OPTIMIZERS["adam"]())
    x, y = rank_data("dense_mix", BATCH * 6)
    run = opt.make_train_step(step_for(model, opt), model)
    ref_run = tf.function(step_for(ref_model, ref_opt))
    for i in range(6):
        run(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
        ref_run(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
        if i == 0:  # the decision is taken after the first step, with every update landed
            first = model.get_layer("wide").kernel.numpy()
            np.testing.assert_allclose(first, ref_model.get_layer("wide").kernel.numpy(),
                                       rtol=1e-5, atol=1e-6)
    every = ["logits", "nobias", "wide"]
    _assert_ran_as_planned(opt, train_steps, every, every)
    assert opt.pending
    start, stop = row_range(144, hvd.size(), hvd.rank())
    kernel = model.get_layer("wide").kernel
    want = ref_model.get_layer("wide").kernel.numpy()
    np.testing.assert_array_equal(kernel.numpy(), first)
    assert np.abs(want - first).max() > 1e-4  # (stock's did move)
    st = opt._hvdo.state
    [rows] = [st.params[b.bucket].numpy() for b in st.layout.buckets
              if st.variables[b.segments[0].index] is kernel]
    np.testing.assert_allclose(rows.reshape(stop - start, -1), want[start:stop],
                               rtol=1e-5, atol=1e-6)
    opt.flush()
    assert not opt.pending
    assert_weights_close(Result(model), Result(ref_model))


def _fit_recording(wrap, callbacks=()):
    tf.keras.utils.set_random_seed(3)
    model = MODELS["dense_mix"]()
    model.compile(wrap(OPTIMIZERS["sgd_momentum"]()), LOSS)
    x, y = rank_data("dense_mix", BATCH * 12)
    record = RecordEvery(5)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[record, *callbacks])  # the recorder first: before the flush
    return record.seen, model.predict(x[:BATCH], verbose=0), model.optimizer


def test_rows_forward_weights_read_mid_epoch_and_predict_are_current(train_steps):
    """A landing step (``OverlapCallback(flush_every=N)``) gathers the kept kernels at its end,
    so a callback reading weights there sees stock's; ``predict`` after fit too."""
    want, want_pred, _ = _fit_recording(stock)
    got, pred, opt = _fit_recording(ours("sharded", exchange="always", exchange_forward="rows"),
                                    [hvdo.OverlapCallback(flush_every=5)])
    every = ["logits", "nobias", "wide"]
    _assert_ran_as_planned(opt, train_steps, every, every)
    assert len(got) == len(want) == 4
    for step_want, step_got in zip(want, got, strict=True):
        for a, b in zip(step_want, step_got, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pred, want_pred, rtol=1e-5, atol=1e-6)


def test_rows_forward_with_different_batches_per_rank_matches_stock(train_steps):
    """The all-to-alls carry each rank's batch: rank 0 trains on 16 rows, rank 1 on 12."""
    def run(wrap):
        tf.keras.utils.set_random_seed(3)
        model = MODELS["dense_mix"]()
        model.compile(wrap(OPTIMIZERS["adam"]()), LOSS)
        batch = 16 if hvd.rank() == 0 else 12
        x, y = rank_data("dense_mix", batch * 6)
        model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvdo.OverlapCallback()])
        return Result(model)
    got = run(ours("sharded", exchange="always", exchange_forward="rows"))
    every = ["logits", "nobias", "wide"]
    _assert_ran_as_planned(got.optimizer, train_steps, every, every)
    assert_weights_close(got, run(stock))


def test_local_kernel_gradient_is_not_computed():
    """In the traced train step, no MatMul yields a whole kernel's gradient ([144, 33]): the
    exchange computes only this rank's rows ([72, 33] on 2 ranks)."""
    tf.keras.utils.set_random_seed(3)
    model = MODELS["dense_mix"]()
    opt = hvdo.DistributedOptimizer(OPTIMIZERS["sgd"](), strategy="sharded", exchange="always")
    model.compile(optimizer=opt, loss=LOSS)
    x, y = rank_data("dense_mix", BATCH * 3)
    cb = hvdo.OverlapCallback()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    shapes = []
    for fn in cb._functions.values():  # the traced steps of the last fit (after the decision)
        for concrete in fn._list_all_concrete_functions_for_serialization():
            shapes += [tuple(op.outputs[0].shape) for op in concrete.graph.get_operations()
                       if op.type == "MatMul"]
    rows = 144 // hvd.size()
    assert (rows, 33) in shapes, shapes
    assert (144, 33) not in shapes, shapes


@pytest.mark.parametrize("forward", ["rows", "gather"])
def test_the_step_writes_no_part_of_a_kernel_and_no_zeros(forward):
    """The exchanged kernels' gradients are their rows (``tf.IndexedSlices``): no whole-kernel
    gradient is built around them (no ``StridedSliceGrad``, no ``Pad``), and the forward on
    the rows reads the rows from the slice the optimizer updates, so no step assigns to part
    of a variable (which copies it, and every later read of it)."""
    tf.keras.utils.set_random_seed(3)
    model = MODELS["dense_mix"]()
    opt = hvdo.DistributedOptimizer(OPTIMIZERS["sgd_momentum"](), strategy="sharded",
                                    exchange="always", exchange_forward=forward)
    model.compile(optimizer=opt, loss=LOSS)
    x, y = rank_data("dense_mix", BATCH * 3)
    cb = hvdo.OverlapCallback()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    types = set()
    for fn in cb._functions.values():  # the traced steps of the last fit (after the decision)
        for concrete in fn._list_all_concrete_functions_for_serialization():
            graph = concrete.graph.as_graph_def()
            types |= {n.op for n in [*graph.node, *(n for f in graph.library.function
                                                    for n in f.node_def)]}
    assert "HorovodAlltoall" in types  # (the exchange ran)
    assert not types & {"StridedSliceGrad", "Pad", "PadV2", "ResourceStridedSliceAssign"}, \
        sorted(types)


def _fit_dense_mix(wrap, callbacks=(), steps=8, then=()):
    """``fit`` of ``steps`` steps with ``callbacks``, then, if ``then`` holds callbacks (or
    None), another with those."""
    tf.keras.utils.set_random_seed(3)
    model = MODELS["dense_mix"]()
    model.compile(wrap(OPTIMIZERS["sgd_momentum"]()), LOSS)
    x, y = rank_data("dense_mix", BATCH * steps)
    for cbs in [callbacks] + ([] if then == () else [then or []]):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=list(cbs))
    return Result(model)


def test_rows_forward_reads_weights_set_during_fit(train_steps):
    """``set_weights`` from a callback mid-fit (after the decision): the next forward on the
    rows reads the rows written, not the slices it kept -- as stock Horovod's steps do."""
    want = _fit_dense_mix(stock, [ResetAt(4)])
    rows = ours("sharded", exchange="always", exchange_forward="rows")
    got = _fit_dense_mix(rows, [ResetAt(4), hvdo.OverlapCallback()])
    _assert_ran_as_planned(got.optimizer, train_steps, ["logits", "nobias", "wide"],
                           ["logits", "nobias", "wide"])
    assert_weights_close(got, want)


def test_rows_forward_without_overlap_callback_matches_stock(train_steps):
    """A ``fit`` without ``OverlapCallback`` (no pre-forward phase) after one with it (which
    put the kernels on the rows): every step lands its whole update, the kernels on the rows
    gathered at its end, so the weights after it are stock's."""
    want = _fit_dense_mix(stock, then=None)
    rows = ours("sharded", exchange="always", exchange_forward="rows")
    got = _fit_dense_mix(rows, [hvdo.OverlapCallback()], then=None)
    assert _plan_kept(got.optimizer) == ["logits", "nobias", "wide"]
    assert not got.optimizer.pending
    assert_weights_close(got, want)


def _received(t: tf.Tensor, suffix: str, hops: int = 3) -> bool:
    """Whether ``t`` is (a reshape or identity of) a Horovod all-to-all named ``*suffix``."""
    op = t.op
    for _ in range(hops):
        if op.type == "HorovodAlltoall":
            return op.name.endswith(suffix)
        if op.type not in ("Reshape", "Identity") or not op.inputs:
            return False
        op = op.inputs[0].op
    return False


def _sent(op: tf.Operation, suffix: str, hops: int = 3) -> bool:
    """Whether ``op``'s output goes (through reshapes) into a Horovod all-to-all named
    ``*suffix``."""
    frontier = [op]
    for _ in range(hops):
        frontier = [c for o in frontier for t in o.outputs for c in t.consumers()]
        if any(c.type == "HorovodAlltoall" and c.name.endswith(suffix) for c in frontier):
            return True
        frontier = [c for c in frontier if c.type in ("Reshape", "Identity")]
    return False


def test_reduce_scatters_wait_for_the_input_gradients_on_the_rows():
    """With the forward on the rows, backprop below an exchanged layer waits for its input
    gradient's all-to-all; Horovod runs one collective at a time, so the buckets ready before
    it (the biases above) are reduce-scattered after it, and the rank's kernel rows are
    computed after the input gradient (while it travels). The first layer's input gradient,
    which nothing uses, is not made to run."""
    tf.keras.utils.set_random_seed(3)
    model = MODELS["dense_mix"]()
    opt = hvdo.DistributedOptimizer(OPTIMIZERS["sgd"](), strategy="sharded", exchange="always",
                                    exchange_forward="rows", bucket_bytes=64)  # bias by bias
    model.compile(optimizer=opt, loss=LOSS)
    x, y = rank_data("dense_mix", BATCH * 3)
    cb = hvdo.OverlapCallback()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    assert len(opt.plan.buckets) > 3
    checked = 0
    for fn in cb._functions.values():  # the traced steps of the last fit (after the decision)
        for concrete in fn._list_all_concrete_functions_for_serialization():
            ops = concrete.graph.get_operations()
            dx = {op for op in ops if op.type == "HorovodAlltoall" and ".dx" in op.name}
            scatters = [op for op in ops if op.type == "HorovodReducescatter"]
            if not (dx and scatters):
                continue
            assert len(dx) == 3, sorted(op.name for op in dx)  # wide, nobias, logits
            waited = set()
            for op in scatters:
                before = ancestors(op) & dx
                assert before, op.name
                waited |= before
            assert len(waited) == 2, sorted(op.name for op in waited)  # not wide's
            # each kernel's rows (x^T dY, after the errors' all-gather) and the input gradients
            # the all-to-alls send (dY W^T): the rows wait for their layer's input gradient, but
            # wide's (its input gradient is not computed)
            dy = {op for op in ops if op.type == "HorovodAllgather" and op.name.endswith(".dy")}
            products = [op for op in ops if op.type == "MatMul" and ancestors(op) & dy]
            rows = [op for op in products if op.get_attr("transpose_a")  # x^T dY, x received
                    and _received(op.inputs[0], ".x")]
            sent = [op for op in products if op.get_attr("transpose_b")  # dY W^T, sent
                    and _sent(op, ".dx")]
            assert len(rows) == 3 and len(sent) == 3, (rows, sent)
            assert sorted(len(set(op.control_inputs) & set(sent)) for op in rows) == [0, 1, 1]
            checked += 1
    assert checked


def test_gathered_state_equals_stock_slots(train_steps):
    """A checkpoint's optimizer state with the exchange: every rank's rows joined, equal to
    stock Horovod's Adam moments (uneven rows included)."""
    opt = train_fit("dense_mix", "adam", ours("sharded", exchange="always")).optimizer
    _assert_ran_as_planned(opt, train_steps, ["logits", "nobias", "wide"])
    saved = opt._hvdo.state.checkpoint
    tf.keras.utils.set_random_seed(3)
    model = MODELS["dense_mix"]()
    ref = hvd.DistributedOptimizer(OPTIMIZERS["adam"]())
    model.compile(optimizer=ref, loss=LOSS)
    x, y = rank_data("dense_mix", BATCH * 12)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for slot, index in (("m", ref._momentums), ("v", ref._velocities)):
        for i, r in enumerate(index):
            np.testing.assert_allclose(saved.slots[slot][i], r.numpy(), rtol=1e-5, atol=1e-7,
                                       err_msg=f"{slot} {i}")


@pytest.mark.parametrize("model, shard", [("dense_mix", "all"), ("cnn_bn", "dense")])
def test_checkpoint_resume_equals_uninterrupted_run(model, shard, train_steps):
    """A checkpoint at the end of epoch 2 (rows gathered into whole arrays; ``shard="dense"``:
    the whole buckets' state as it is) resumes to the weights of 4 uninterrupted epochs."""
    wrap = ours("sharded", exchange="always", exchange_forward="rows", shard=shard)
    whole = train_fit(model, "adam", wrap, epochs=4)
    ran = _ran(whole.optimizer, train_steps)
    assert len(ran.kept) == (3 if model == "dense_mix" else 2) and ran.kept == ran.exchanged
    assert _plan_kept(whole.optimizer) == ran.kept
    ckpt = ModelCheckpointInTmp()
    train_fit(model, "adam", wrap, epochs=2, callbacks=[ckpt.callback])
    resumed = train_fit(model, "adam", wrap, epochs=4, initial_epoch=2, restore=ckpt.path)
    again = _ran(resumed.optimizer, train_steps)  # the resumed run's too (a new model: its
    assert len(again.kept) == len(ran.kept) and again.kept == again.exchanged  # own names)
    # (batch norm's moving statistics are per rank: every rank restores rank 0's, as with stock)
    assert_weights_close(resumed, whole, trainable_only=model == "cnn_bn")
    fresh = train_fit(model, "adam", wrap, epochs=4, initial_epoch=2, restore=ckpt.path,
                      restore_optimizer=False)
    assert max_abs_diff(fresh, whole) > 1e-4


def test_mixed_precision_does_not_exchange_and_equals_stock(train_steps):
    """Under mixed_float16 a Dense layer computes in float16 with float32 kernels: the exchange
    does not carry it (no layer is patched, no exchange collective runs). The loss-scale
    optimizer reads global gradients (``compute_gradients``, to decide on every rank alike
    whether to skip a step), so each kernel's bucket is allreduced whole in that call, as every
    bucket then is, and each rank takes its slice: not reduce-scattered. The skipped steps
    equal stock's."""
    want, want_scale, want_steps = _fit_mixed(stock)
    got, scale, steps = _fit_mixed(ours("sharded", exchange="always", bucket_bytes=2048))
    assert (scale, steps) == (want_scale, want_steps)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    (opt,) = train_steps.optimizers()  # ours (stock's fit is not recorded)
    assert not opt._hvdo.exchange.layers  # no layer eligible: none patched
    bucket = _bucket_names(opt)
    kernels = [v for v in opt._hvdo.state.variables if v.name.endswith("kernel:0")]
    assert len(kernels) == 3
    ran = _ran(opt, train_steps)
    for g in ran.graphs:  # every kernel's bucket allreduced by name; nothing exchanged
        for v in kernels:
            assert ("HorovodGroupedAllreduce", bucket[v.ref()]) in g, (v.name, sorted(g))
            assert f"{bucket[v.ref()]}.rs" not in {n for _, n in g}, (v.name, sorted(g))
        assert not [n for t, n in g if t == "HorovodAlltoall" or n.endswith(".dy")], sorted(g)
    assert ran.exchanged == ran.kept == []


def test_layer_called_on_2d_and_3d_inputs_is_refused_on_every_rank():
    """Its kernel gradient would mix exchanged rows with a local gradient: refused when the
    step that would exchange is traced (before it runs), naming exchange='never'."""
    L = tf.keras.layers
    tf.keras.utils.set_random_seed(1)
    x = L.Input((4, 6))
    shared = L.Dense(5, name="both")
    flat = L.Flatten()(shared(x))                  # 3-D input
    first = shared(L.Lambda(lambda t: t[:, 0])(x))  # 2-D input
    model = tf.keras.Model(x, L.Dense(10)(L.Concatenate()([flat, first])))
    model.compile(ours("sharded", exchange="always")(tf.keras.optimizers.SGD(0.1)), loss=LOSS)
    rng = np.random.default_rng(hvd.rank())
    with pytest.raises(ValueError, match="exchange='never'"):
        model.fit(rng.normal(size=(32, 4, 6)), rng.integers(0, 10, 32), batch_size=8,
                  verbose=0, callbacks=[hvdo.OverlapCallback()])


def test_the_exchange_on_a_strategy_without_slices_cannot_be_written():
    with pytest.raises(TypeError, match="applies to sharded, sharded_hybrid"):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="layerwise",
                                  exchange="always")


@pytest.mark.parametrize("kw, match", [
    ({"strategy": "sharded", "exchange": "sometimes"}, "exchange="),
    ({"strategy": "sharded", "exchange": "auto", "exchange_forward": "scatter"},
     "exchange_forward="),
    ({"strategy": "sharded", "exchange": "auto", "compression": hvd.Compression.fp16},
     "compression"),
])
def test_bad_exchange_options_are_refused_on_every_rank(kw, match):
    with pytest.raises(ValueError, match=match):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), **kw)
