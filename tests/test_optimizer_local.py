"""The Keras wrapper in one process (Horovod size 1): API, errors, save/load, plain-SGD equality."""

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph

import hvd_overlap
import hvd_overlap.keras as hvdo
from hvd_overlap.comm.methods import Allreduce, CommSettings, ReduceScatterGather, SliceMethod
from tests.graphs import ancestors

hvd.init()


def small_model():
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, 3, input_shape=(8, 8, 1)), tf.keras.layers.BatchNormalization(),
        tf.keras.layers.Flatten(), tf.keras.layers.Dense(10),
    ])


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 8, 8, 1)).astype("float32"), rng.integers(0, 10, 64)


def fit(model, opt):
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvdo.OverlapCallback()])
    return model.get_weights()


@pytest.mark.parametrize("strategy", [*sorted(hvd_overlap.STRATEGIES), "auto"])
@pytest.mark.parametrize("make_opt", [
    lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: tf.keras.optimizers.legacy.Adam(0.01),
], ids=["sgd", "legacy_adam"])
def test_size_one_equals_the_plain_optimizer(strategy, make_opt):
    plain = fit(small_model(), make_opt())
    wrapped = fit(small_model(), hvdo.DistributedOptimizer(make_opt(), strategy=strategy))
    for a, b in zip(wrapped, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_wrapper_keeps_the_class_name_and_config():
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.Adam(0.01))
    assert type(opt).__name__ == "Adam"
    assert isinstance(opt, tf.keras.optimizers.Adam)
    assert opt.get_config()["learning_rate"] == pytest.approx(0.01)
    assert opt.strategy == "layerwise"


def test_saved_model_loads_without_the_plugin(tmp_path):
    model = small_model()
    fit(model, hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9)))
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    assert type(loaded.optimizer).__name__ == "SGD"
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_plan_is_printable_before_training():
    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), bucket_bytes=1024)
    with pytest.raises(RuntimeError, match="build_plan"):
        _ = opt.plan
    plan = opt.build_plan(model.trainable_variables)
    assert opt.plan is plan
    assert plan.buckets[0].layers == (model.layers[-1].name,)
    assert "conv2d" in plan.describe()


@pytest.mark.parametrize("kwargs, match", [
    ({"strategy": "fastest"}, "unknown strategy 'fastest'.*horovod.*layerwise"),
    ({"bucket_bytes": 0}, "bucket_bytes must be a positive"),
    ({"op": hvd_tf.Adasum}, "op must be hvd.Average or hvd.Sum"),
    ({"backward_passes_per_step": 0}, "backward_passes_per_step must be"),
    ({"strategy": "hybrid", "defer": -3}, "defer must be"),
    ({"strategy": "nope", "backward_passes_per_step": 2}, "unknown strategy 'nope'"),
    ({"strategy": "sharded", "bucket_bytes": "auto", "exchange": "auto"},
     "does not combine with the exchange.*exchange='never'"),
    ({"strategy": "hybrid", "bucket_bytes": "big"}, "positive int .* or 'auto'"),
    ({"strategy": "sharded", "gather_with": "broadcast"}, "gather_with='broadcast'"),
    ({"strategy": "sharded", "exchange": "sometimes"}, "exchange='sometimes'"),
    ({"strategy": "sharded+bucket=lots"}, "'lots' is not a whole number"),
    ({"strategy": "sharded+scatter"}, "unknown option 'scatter'"),
    ({"strategy": "layerwise", "backward_passes_per_step": 2, "bucket_bytes": "auto"},
     "pass a bucket size"),
])
def test_bad_arguments_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"groups": 2}, "'layerwise' has no setting 'groups'.*horovod.*bucket_bytes instead"),
    ({"strategy": "auto", "bucket_bytes": 1024}, "chooses bucket_bytes and defer itself"),
    ({"strategy": "sharded", "defer": "auto"}, "ShardedHybrid"),
    ({"strategy": "horovod", "bucket_bytes": "auto"}, "'horovod' has no setting 'bucket_bytes'"),
    ({"strategy": "layerwise", "defer": "auto"}, "applies to hybrid, sharded_hybrid"),
    ({"strategy": "layerwise", "exchange": "always"}, "applies to sharded, sharded_hybrid"),
    ({"strategy": "deferred", "gather_with": "alltoall"}, "no setting 'gather_with'"),
    ({"strategy": "sharded", "exchange_forward": "rows"}, "add exchange="),
    ({"strategy": hvdo.Layerwise(), "bucket_bytes": 1024}, r"Layerwise\(...\) itself"),
    ({"strategy": 3}, "a name or a strategy object"),
])
def test_a_setting_the_strategy_has_no_use_for_is_a_type_error(kwargs, match):
    with pytest.raises(TypeError, match=match):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), **kwargs)


def test_shard_dense_without_the_exchange_or_on_a_whole_state_plan_is_refused():
    """``shard="dense"`` keeps the exchange's kernels sharded: without the exchange it is a
    ValueError naming the fix, on a strategy without slices a TypeError naming who takes it."""
    with pytest.raises(ValueError, match="add exchange="):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="sharded",
                                  shard="dense")
    with pytest.raises(ValueError, match="choose all or dense"):
        hvdo.Sharded(exchange=hvdo.Exchange(), shard="some")
    with pytest.raises(TypeError, match="sharded, sharded_hybrid"):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="layerwise",
                                  shard="dense")


def test_a_setting_the_strategy_object_lacks_cannot_be_written():
    with pytest.raises(TypeError):
        hvdo.Layerwise(defer=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        hvdo.Hybrid(exchange=hvdo.Exchange())  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        hvdo.Auto(bucket_bytes=1 << 20)  # type: ignore[call-arg]


@pytest.mark.parametrize("strategy, keywords", [
    (hvdo.Sharded(exchange=hvdo.Exchange(forward="rows"), gather_with="alltoall"),
     {"strategy": "sharded", "exchange": "auto", "exchange_forward": "rows",
      "gather_with": "alltoall"}),
    (hvdo.Sharded(exchange=hvdo.Exchange(), shard="dense"),
     {"strategy": "sharded", "exchange": "auto", "shard": "dense"}),
    (hvdo.Hybrid(bucket_bytes=1 << 20, defer=1, ordered=True),
     {"strategy": "hybrid", "bucket_bytes": 1 << 20, "defer": 1, "ordered": True}),
    (hvdo.ShardedHybrid(bucket_bytes="auto"), {"strategy": "sharded_hybrid",
                                              "bucket_bytes": "auto"}),
    (hvdo.StockHorovod(num_groups=2), {"strategy": "horovod", "num_groups": 2}),
    (hvdo.Auto(), {"strategy": "auto"}),
])
def test_objects_keywords_and_the_string_spelling_are_one_strategy(strategy, keywords):
    """The object, the keyword sugar and the string spelling build the same strategy, and the
    wrapped optimizer runs the plan the object describes."""
    from hvd_overlap.core.spelling import parse

    by_keywords = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), **keywords)
    by_object = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy=strategy)
    by_text = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy=strategy.spec())
    assert by_keywords.strategy_config == by_object.strategy_config == strategy
    assert by_text.strategy_config == strategy and parse(strategy.spec()) == strategy
    assert by_object.strategy == ("auto" if strategy.tuned else strategy.name)
    if not strategy.tuned:
        variables = small_model().trainable_variables
        assert by_object.build_plan(variables) == by_keywords.build_plan(variables)


@pytest.mark.parametrize("strategy, runs_as", [("deferred", "layerwise"), ("hybrid", "layerwise"),
                                                ("sharded", "layerwise"), ("auto", "horovod")])
def test_accumulation_runs_cross_step_strategies_immediate_and_says_so(strategy, runs_as):
    """``backward_passes_per_step > 1`` reduces within the pass (as Horovod): a strategy that
    would defer or shard runs as an immediate one, with one warning naming the alternative."""
    with pytest.warns(UserWarning, match=f"runs as strategy={runs_as!r}.*"
                                         "enable_gradient_accumulation"):
        opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy=strategy,
                                        backward_passes_per_step=2)
    assert opt.strategy == runs_as and not opt.defers


def test_mixed_precision_with_accumulation_is_refused_naming_the_fix():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,)),
                                     tf.keras.layers.Activation("linear", dtype="float32")])
        model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                                backward_passes_per_step=2), "mse")
        with pytest.raises(ValueError, match="local gradients.*enable_gradient_accumulation"):
            model.fit(np.ones((4, 4)), np.ones((4, 3)), batch_size=2, verbose=0)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_not_an_optimizer():
    with pytest.raises(TypeError, match="Keras optimizer"):
        hvdo.DistributedOptimizer("sgd")


def test_wrapping_twice_is_refused():
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(TypeError, match="already"):
        hvdo.DistributedOptimizer(opt)


def test_importing_the_plugin_leaves_horovods_environment_alone():
    """The plugin must not change how stock Horovod runs in the same process (issue 11): a
    fresh interpreter's environment is the same before and after importing every module."""
    import subprocess
    import sys

    code = ("import os, json; before = dict(os.environ); import hvd_overlap.keras, "
            "hvd_overlap.growth.data, benchmarks.worker; "
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "{}"


def test_pure_modules_load_neither_tensorflow_nor_horovod():
    import subprocess
    import sys

    code = ("import sys, hvd_overlap, hvd_overlap.core.plan, hvd_overlap.core.sharding, "
            "hvd_overlap.core.choice, hvd_overlap.core.strategy, hvd_overlap.core.plan_builders, "
            "hvd_overlap.core.margin, hvd_overlap.core.chooser, hvd_overlap.growth.policy, "
            "hvd_overlap.core.simulate, "
            "hvd_overlap.tools.simulate_report, hvd_overlap.core.autoplan, "
            "hvd_overlap.core.exchange, "
            "hvd_overlap.core.trial, hvd_overlap.core.trials; "
            "print(sorted(m for m in ('tensorflow', 'horovod') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_cli_plan_prints_the_plan_of_a_saved_model(tmp_path):
    from click.testing import CliRunner

    from hvd_overlap.tools.cli import main

    path = str(tmp_path / "m.keras")
    model = small_model()
    model.save(path)
    result = CliRunner().invoke(main, ["plan", path, "--bucket-bytes", "1024"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("plan: strategy=layerwise bucket_bytes=1.0KiB buckets=2")
    assert f"{model.layers[-1].name}/kernel:0" in "".join(result.output.splitlines()[3:5])


def test_cli_plan_shows_the_exchange_choice_per_layer(tmp_path):
    from click.testing import CliRunner

    from hvd_overlap.tools.cli import main

    path = str(tmp_path / "m.keras")
    tf.keras.Sequential([tf.keras.layers.Dense(2048, input_shape=(1024,), name="wide"),
                         tf.keras.layers.Dense(10, name="out")]).save(path)
    args = ["plan", path, "--strategy", "sharded", "--exchange", "auto", "--np", "4",
            "--batch-size", "32"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines()
            if "exchange+rows" in line and not line.startswith("note")]
    assert len(rows) == 1 and rows[0].endswith("wide")
    assert "wide/kernel:0 [1024, 2048] at 32/rank x 1 call(s) on 4 ranks: exchange+rows" in \
        result.output
    gathered = CliRunner().invoke(main, [*args, "--exchange-forward", "gather"])
    assert gathered.exit_code == 0, gathered.output
    assert "on 4 ranks: exchange+allgather" in gathered.output
    assert "out/kernel:0 [2048, 10] at 32/rank x 1 call(s) on 4 ranks: reduce-scatter" in \
        result.output
    spelled = CliRunner().invoke(main, ["plan", path, "--strategy", "sharded+exchange+gather",
                                        "--np", "4", "--batch-size", "32"])
    assert spelled.output == gathered.output  # the one spelling, as the optimizer reads it
    bad = CliRunner().invoke(main, ["plan", path, "--exchange", "auto"])
    assert bad.exit_code != 0 and "sharded" in bad.output


def test_auto_without_the_callback_keeps_its_probe_and_names_the_fix():
    x, y = data()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    want = small_model()
    want.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), loss)
    want.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9), strategy="auto")
    model.compile(opt, loss)
    with pytest.warns(UserWarning, match="cannot time its plans.*OverlapCallback"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert opt._hvdo.measured == {} and opt._hvdo.switches == 0
    for a, b in zip(want.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_deferring_refuses_global_clipnorm():
    with pytest.raises(ValueError, match="global_clipnorm.*clipnorm"):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, global_clipnorm=1.0),
                                  strategy="deferred")


@pytest.mark.parametrize("strategy", ["deferred", "hybrid", "sharded"])
def test_without_the_callback_the_step_falls_back_exactly_and_names_the_fix(strategy):
    """No pre-forward phase (fit without OverlapCallback, train_on_batch): the update lands
    within the step -- the plain optimizer's weights -- with one warning naming the fix."""
    x, y = data()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    want = small_model()
    want.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), loss)
    want.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    for entry in ("fit", "train_on_batch"):
        model = small_model()
        model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                                strategy=strategy, bucket_bytes=64), loss)
        with pytest.warns(UserWarning, match="OverlapCallback"):
            if entry == "fit":
                model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
            else:
                for k in range(0, len(x), 16):
                    model.train_on_batch(x[k:k + 16], y[k:k + 16])
        assert not model.optimizer.pending
        for a, b in zip(want.get_weights(), model.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=entry)


def test_a_step_without_the_pre_forward_phase_refuses_a_pending_update():
    """An update left pending (no flush after make_train_step) cannot be silently skipped."""
    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="deferred")
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    train = opt.make_train_step(step)
    for k in range(0, 48, 16):
        train(x[k:k + 16], y[k:k + 16])
    assert opt.pending
    with pytest.warns(UserWarning), pytest.raises(tf.errors.InvalidArgumentError,
                                                  match="opt.flush"):
        model.train_on_batch(x[:16], y[:16])
    opt.flush()
    assert not opt.pending
    model.train_on_batch(x[:16], y[:16])  # after the flush it runs


def test_overlap_callback_flushes_before_evaluate_and_leaves_fit_clean():
    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                    strategy="deferred")
    fit(model, opt)
    assert int(opt.iterations.numpy()) == 8          # 2 epochs x 4 steps, all applied
    assert not opt.pending
    assert "train_step" not in vars(model)           # the patch is removed after fit


@pytest.mark.parametrize("strategy", ["auto", "deferred"])
def test_a_plan_that_defers_nothing_traces_one_train_function(strategy):
    """OverlapCallback's second train function (the one that lands at an epoch's end) is one
    more trace; while the plan running defers nothing (auto on stock's fusion) it is the same."""
    functions = {}

    class Seen(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            functions[id(self.model.train_function)] = self.model.train_function

    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy=strategy)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[hvdo.OverlapCallback(), Seen()])
    traced = [f for f in functions.values() if f.experimental_get_tracing_count()]
    assert (len(traced) == 1) if strategy == "auto" else (len(traced) >= 2)


def test_sharded_keras_file_resumes_before_the_first_step(tmp_path):
    """A .keras file saved by a sharded optimizer, loaded into a fresh sharded optimizer before
    training (state kept until the slices exist), resumes as if never interrupted; without the
    optimizer state the run ends elsewhere."""
    x, y = data()

    def run(opt, epochs, initial_epoch=0, load=None, save=None, drop_state=False):
        model = small_model()
        model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if load:
            model.load_weights(load)
            if drop_state:
                opt._hvdo.state.checkpoint.pending_plain = None
        model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch,
                  shuffle=False, verbose=0, callbacks=[hvdo.OverlapCallback()])
        if save:
            model.save(save)
        return model.get_weights()

    def sharded():
        return hvdo.DistributedOptimizer(tf.keras.optimizers.Adam(0.01), strategy="sharded")

    whole = run(tf.keras.optimizers.Adam(0.01), epochs=3)
    path = str(tmp_path / "m.keras")
    run(sharded(), epochs=2, save=path)
    resumed = run(sharded(), epochs=3, initial_epoch=2, load=path)
    for a, b in zip(resumed, whole, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    fresh = run(sharded(), epochs=3, initial_epoch=2, load=path, drop_state=True)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(fresh, whole, strict=True)) > 1e-3


# -- the per-bucket interface (issue 12): a method can be swapped, and is used in plan order --

def _traced_function(graph):
    """The outermost function graph around ``graph`` (a tf.cond branch is a graph of its own)."""
    while isinstance(getattr(graph, "outer_graph", None), FuncGraph):
        graph = graph.outer_graph
    return graph


class RecordingAllreduce(Allreduce):
    """Allreduce that records, at trace time, which bucket it was asked to send, and which
    buckets it sent inside a branch (a ``tf.cond``: the next step's pre-forward phase runs each
    deferred bucket under the flag saying the previous step left it pending)."""

    def __init__(self, settings, scale=1.0):
        super().__init__(settings)
        self.calls: list[tuple[int, int]] = []  # (traced graph, bucket)
        self.in_branch: list[int] = []  # buckets sent inside a branch of the traced graph
        self.scale = scale

    def reduce(self, bucket, grads, variables):
        graph = tf.compat.v1.get_default_graph()
        self.calls.append((id(_traced_function(graph)), bucket.index))
        if _traced_function(graph) is not graph:
            self.in_branch.append(bucket.index)
        out = super().reduce(bucket, grads, variables)
        return {i: g * self.scale for i, g in out.items()}


class RecordingSlices(ReduceScatterGather):
    def __init__(self, settings):
        super().__init__(settings)
        self.scattered: list[int] = []
        self.gathered: list[int] = []

    def scatter(self, bucket, grads):
        self.scattered.append(bucket.bucket)
        return super().scatter(bucket, grads)

    def gather(self, bucket, piece):
        self.gathered.append(bucket.bucket)
        return super().gather(bucket, piece)


def _settings(name):
    return CommSettings(name=name, op=hvd_tf.Average, compression=hvd_tf.Compression.none)


def _fits_like_plain_sgd(method, **options):
    """A wrapped SGD with momentum, ``method`` registered, fitted beside the plain optimizer:
    the weights agree to 1e-6. Returns the wrapped optimizer."""
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9), **options)
    opt.register_bucket_method(method)
    plain = fit(small_model(), tf.keras.optimizers.SGD(0.1, momentum=0.9))
    got = fit(small_model(), opt)
    for a, b in zip(plain, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    return opt


@pytest.mark.parametrize("strategy", ["layerwise", "deferred", "hybrid"])
def test_a_registered_bucket_method_sends_every_bucket_in_plan_order(strategy):
    method = RecordingAllreduce(_settings("rec" + strategy))
    opt = _fits_like_plain_sgd(method, strategy=strategy, bucket_bytes=64)  # an allreduce: exact
    plan = opt.plan
    backward = [b.index for b in plan.phase_buckets("backward")]
    forward = [b.index for b in plan.phase_buckets("forward")]
    assert len(plan.buckets) > 2 and method.calls
    # per traced graph: the first one reduces every bucket in plan order (backward phase,
    # then the forward phase in forward order); later train steps bring the forward phase in
    # first (pre-forward), then the backward phase -- and the epoch's last step (whose weights
    # someone reads) its own forward phase again at its end; a flush runs the forward phase
    allowed = {tuple(backward + forward), tuple(forward + backward), tuple(forward),
               tuple(forward + backward + forward)}
    per_graph: dict = {}
    for graph, index in method.calls:
        per_graph.setdefault(graph, []).append(index)
    seen = [tuple(calls) for calls in per_graph.values()]
    assert all(calls in allowed for calls in seen), (seen, backward, forward)
    # deferred and hybrid defer buckets (layerwise none), and a later step's graph brings
    # them in, under the pending flag, before its own backward phase: the deferral happened
    assert bool(forward) == (strategy != "layerwise"), (strategy, forward)
    assert sorted(set(method.in_branch)) == sorted(forward), (method.in_branch, forward)
    if strategy != "layerwise":
        assert tuple(forward + backward) in seen, seen


def test_a_bucket_method_that_is_wrong_shows_in_the_weights():
    """Negative control: the registered method is really the one used."""
    plain = fit(small_model(), tf.keras.optimizers.SGD(0.1))
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="layerwise")
    opt.register_bucket_method(RecordingAllreduce(_settings("wrong"), scale=2.0))
    got = fit(small_model(), opt)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(plain, got, strict=True)) > 1e-3


def test_sharded_bucket_method_is_swappable_and_gathers_in_forward_order():
    method = RecordingSlices(_settings("recsharded"))
    opt = _fits_like_plain_sgd(method, strategy="sharded", bucket_bytes=64)
    order = [b.index for b in opt.plan.buckets]  # all in the forward phase: forward order
    assert len(order) > 2
    # every trace reduce-scatters each bucket once (each starts when its gradient exists)
    n = len(order)
    for k in range(0, len(method.scattered), n):
        assert sorted(method.scattered[k:k + n]) == sorted(order)
    # and every trace and flush all-gathers them in forward order, input side first
    assert method.gathered == order * (len(method.gathered) // n) and method.gathered
    with pytest.raises(RuntimeError, match="before the first step"):
        opt.register_bucket_method(RecordingSlices(_settings("late")))


class DependencySlices(ReduceScatterGather):
    """Keeps, per bucket, the op of the latest trace's reduce-scatter and all-gather."""

    def __init__(self, settings):
        super().__init__(settings)
        self.scatter_ops: dict = {}
        self.gather_ops: dict = {}

    def scatter(self, bucket, grads):
        piece = super().scatter(bucket, grads)
        self.scatter_ops[bucket.bucket] = piece.op
        return piece

    def gather(self, bucket, piece):
        whole = super().gather(bucket, piece)
        self.gather_ops[bucket.bucket] = whole[0].op
        return whole


def test_sharded_hybrid_gathers_a_bucket_while_backprop_goes_on():
    """A backward-phase bucket is updated and all-gathered as soon as its own slice is reduced:
    its all-gather waits for its reduce-scatter, not for those of the buckets on its input side
    (whose gradients backprop produces later)."""
    method = DependencySlices(_settings("depsharded"))
    opt = _fits_like_plain_sgd(method, strategy="sharded_hybrid", bucket_bytes=64, defer=1)
    buckets = opt.shard_layout.buckets  # forward order
    now = [k for k, b in enumerate(buckets) if b.phase == "backward"]
    assert len(now) >= 2 and len(now) < len(buckets)
    for k in now:
        waits_for = ancestors(method.gather_ops[buckets[k].bucket])
        assert method.scatter_ops[buckets[k].bucket] in waits_for
        input_side = [method.scatter_ops[b.bucket] for b in buckets[:k]]
        assert not any(op in waits_for for op in input_side), k


def test_register_bucket_method_checks_the_kind():
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="sharded")
    with pytest.raises(TypeError, match="SliceMethod"):
        opt.register_bucket_method(Allreduce(_settings("x")))
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="layerwise")
    with pytest.raises(TypeError, match="GradientMethod"):
        opt.register_bucket_method(ReduceScatterGather(_settings("y")))
    # with the dense factor exchange, buckets may be cut by rows: only methods that send them
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="sharded",
                                    exchange="auto")

    class OwnSlices(SliceMethod):  # a method of its own, which may not know bucket.rows
        def scatter(self, bucket, grads):
            raise NotImplementedError

        def gather(self, bucket, piece):
            raise NotImplementedError

    with pytest.raises(ValueError, match="ReduceScatterGather"):
        opt.register_bucket_method(OwnSlices(_settings("z")))
    opt.register_bucket_method(RecordingSlices(_settings("ok")))


# -- issue 13: what Keras and Horovod users combine -----------------------------------------

def test_from_config_rebuilds_a_distributed_optimizer_with_the_same_options():
    """Keras's cloning (``clone_and_build_model(compile_clone=True)``) calls the class's
    ``from_config``: it gives a working distributed optimizer, as Horovod's does."""
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                    strategy="hybrid", bucket_bytes=64, defer=1)
    clone = type(opt).from_config(opt.get_config())
    assert type(clone).__name__ == "SGD" and clone.strategy == "hybrid" and clone.defers
    assert clone.get_config() == opt.get_config()
    plain = fit(small_model(), tf.keras.optimizers.SGD(0.1, momentum=0.9))
    for a, b in zip(plain, fit(small_model(), clone), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_elastic_refuses_strategies_with_state_outside_the_optimizer(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    for strategy in ("deferred", "hybrid", "sharded"):
        with pytest.raises(ValueError, match="elastic"):
            hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy=strategy)
    hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="layerwise")


def test_overlap_callback_gives_back_a_train_step_set_on_the_model():
    from hvd_overlap.growth.data import enable_gradient_accumulation

    model = small_model()
    model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="deferred"),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    enable_gradient_accumulation(model)
    installed = vars(model)["train_step"]
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[hvdo.OverlapCallback()])
    assert vars(model).get("train_step") is installed


class _NoGradInput(tf.keras.Model):
    """The input-side layer is built but off the loss path: its bucket has no gradient."""

    def __init__(self):
        super().__init__()
        self.unused = tf.keras.layers.Dense(3)
        self.out = tf.keras.layers.Dense(10)

    def call(self, x):
        _ = self.unused(x)
        return self.out(x)


def test_hybrid_with_no_gradient_in_the_deferred_bucket_counts_each_step_once():
    model = _NoGradInput()
    model(tf.zeros((1, 8)))
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="hybrid",
                                    bucket_bytes=64, defer=1)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 10, 64)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[hvdo.OverlapCallback()])
    assert [b.phase for b in opt.plan.buckets][-1] == "forward"
    assert not any(v.has_grad for v in opt.plan.phase_buckets("forward")[0].variables)
    assert int(opt.iterations.numpy()) == 8


def test_auto_pools_hold_only_what_the_setting_allows():
    from hvd_overlap.comm.planner import var_specs
    from hvd_overlap.core.autoplan import profile_from_specs
    from hvd_overlap.core.choice import Auto, Hybrid, Sharded, ShardedHybrid
    from hvd_overlap.keras.executors.auto_pool import auto_choices

    wide = tf.keras.Sequential([tf.keras.layers.Dense(1024, input_shape=(1024,)),
                                tf.keras.layers.Dense(1024), tf.keras.layers.Dense(10)])
    prof = profile_from_specs(var_specs(wide.trainable_variables))  # 4 MiB layers: splits exist
    sgd = tf.keras.optimizers.SGD(0.1)
    probe, pool, _ = auto_choices(sgd, Auto())
    assert probe.name == "horovod"
    every = {"horovod", "layerwise", "deferred", "hybrid", "sharded", "sharded_hybrid"}
    assert {c.name for c in pool(prof)} == every
    assert not any(c.exchanges for c in pool(prof))  # no dense batch seen: no exchange priced
    # whole-tensor clipping cannot be sharded: auto keeps to the whole-state plans
    _, pool, _ = auto_choices(tf.keras.optimizers.SGD(0.1, clipnorm=1.0), Auto())
    assert {c.name for c in pool(prof)} == every - {"sharded", "sharded_hybrid"}
    # Nadam cannot be deferred exactly: auto keeps to the plans that apply a step at once
    _, pool, _ = auto_choices(tf.keras.optimizers.Nadam(), Auto())
    assert {c.name for c in pool(prof)} == {"horovod", "layerwise"}
    probe, pool, label = auto_choices(tf.keras.optimizers.SGD(0.1),
                                     Hybrid(bucket_bytes="auto", defer=1))
    assert probe.name == "hybrid" and "bucket_bytes='auto'" in label
    assert {(c.name, c.defer) for c in pool(prof)} == {("hybrid", 1)}
    _, pool, _ = auto_choices(tf.keras.optimizers.SGD(0.1),
                              Hybrid(bucket_bytes=1024, defer="auto"))
    assert {c.bucket_bytes for c in pool(prof)} == {1024}
    # sharding asked for: the sharded family, sharded_hybrid only where the optimizer can defer
    probe, pool, _ = auto_choices(sgd, Sharded(bucket_bytes="auto"))
    assert probe == Sharded(bucket_bytes=hvd_overlap.DEFAULT_BUCKET_BYTES)
    assert {c.name for c in pool(prof)} == {"sharded", "sharded_hybrid"}
    assert len({c.bucket_bytes for c in pool(prof)}) > 1
    clipped = tf.keras.optimizers.SGD(0.1, global_clipnorm=1.0)
    _, pool, _ = auto_choices(clipped, Sharded(bucket_bytes="auto"))
    assert {c.name for c in pool(prof)} == {"sharded"}
    _, pool, _ = auto_choices(sgd, ShardedHybrid(bucket_bytes="auto"))
    assert {c.name for c in pool(prof)} == {"sharded_hybrid"}


def test_auto_reports_its_state_in_the_plan_and_refuses_a_bucket_method():
    from hvd_overlap.comm.methods import Allreduce

    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="auto")
    assert opt.strategy == "auto" and opt.defers
    fit(model, opt)
    assert "auto: horovod (stock fusion)" in opt.plan.describe()
    with pytest.raises(ValueError, match="strategy='layerwise'"):
        opt.register_bucket_method(Allreduce(CommSettings(name="x", op=hvd_tf.Average,
                                                          compression=None)))


def test_auto_leaves_out_the_plans_a_loop_could_tell_apart_and_says_why():
    from hvd_overlap.core.choice import (
        Hybrid,
        Sharded,
        ShardedHybrid,
        StockHorovod,
    )
    from hvd_overlap.keras.executors.auto_pool import usable_pool
    from hvd_overlap.keras.executors.step_state import TrainLoop

    pool = [StockHorovod(), Sharded(bucket_bytes=1 << 20),
            ShardedHybrid(bucket_bytes=1 << 20, defer=1), Hybrid(bucket_bytes=1 << 20, defer=1)]
    settings = CommSettings(name="t", op=hvd.Average, compression=hvd.Compression.none)
    kept, why = usable_pool(pool, TrainLoop.CUSTOM, settings, set())
    assert kept == [StockHorovod(), Hybrid(bucket_bytes=1 << 20, defer=1)]
    assert len(why) == 1 and "custom loop" in why[0]
    kept, why = usable_pool(pool, TrainLoop.KERAS_FIT, settings, {"a ref"})
    assert "register_local_var" in why[0] and len(kept) == 2
    kept, why = usable_pool(pool, TrainLoop.KERAS_FIT, settings, set())
    assert kept == pool and why == ["the exchange: one rank"]  # (this process: one rank)
    kept, why = usable_pool(pool[:1], TrainLoop.CUSTOM, settings, set())
    assert kept == pool[:1] and why == []  # no sharded plan in the pool: nothing to say


@pytest.mark.parametrize("probe_ms, switches", [(95.0, False), (85.0, True)])
def test_auto_keeps_the_running_plan_for_a_short_batch_unless_another_is_clearly_faster(
        monkeypatch, probe_ms, switches):
    """A growth too short-lived for a check: the simulator's pick replaces the running plan
    (here hybrid, predicted 100 ms) only if predicted 10% faster than it; stock's fusion
    predicted 5% faster is not worth a switch (a trace), 15% faster is."""
    from types import SimpleNamespace

    from hvd_overlap.core import autoplan
    from hvd_overlap.core.choice import (
        Hybrid,
        StockHorovod,
    )

    probe, hybrid = StockHorovod(), Hybrid(bucket_bytes=2048, defer=2)
    ms = {probe: probe_ms, hybrid: 100.0}

    def result(c):
        return SimpleNamespace(step_s=ms[c] / 1e3)
    monkeypatch.setattr(autoplan, "at_batch", lambda profile, factor: profile)
    monkeypatch.setattr(autoplan, "rank", lambda profile, cluster, pool: sorted(
        ((c, result(c)) for c in pool), key=lambda cr: cr[1].step_s))
    monkeypatch.setattr(autoplan, "predict", lambda profile, cluster, c: result(c))
    ex = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="auto")._hvdo
    ex.current, ex.settled, ex._fitted = hybrid, True, (None, None, [probe, hybrid])
    ex.reconsider("growth", batch_factor=2.0, horizon_steps=10)
    assert ex.current == (probe if switches else hybrid), ex.reason
    assert ex.choices[-1]["chosen"] == ex.current.describe() and ex.choices[-1]["steps"] == 0
