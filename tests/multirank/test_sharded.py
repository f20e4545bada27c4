"""The sharded strategy (reduce-scatter, update one's slice, all-gather in forward order) reaches
stock Horovod's weights after a flush; its checkpoints are complete; its slots are 1/P."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from tests.multirank.helpers import (
    BATCH,
    EPOCHS,
    LOSS,
    MODELS,
    OPTIMIZERS,
    STEPS_PER_EPOCH,
    ModelCheckpointInTmp,
    Result,
    assert_fit_saw_stocks_weights,
    assert_updates_landed_a_step_late,
    assert_weights_close,
    deferred_variables,
    max_abs_diff,
    ours,
    rank_data,
    same_on_all_ranks,
    step_pair,
    stock,
    stock_loop,
    stock_reference,
    train_fit,
    train_loop,
)

SMALL = {"bucket_bytes": 2048}  # several buckets, most with padding


def deferred_every_step(got: Result) -> None:
    """Every step but each epoch's last (a landing step: ``OverlapCallback`` lands its update
    where someone may read the weights) ended with all-gathers pending: the update waited for
    the next step."""
    assert got.pending == ([True] * (STEPS_PER_EPOCH - 1) + [False]) * EPOCHS, got.pending


@pytest.mark.parametrize("opt_name", [
    "sgd", "sgd_momentum", "sgd_nesterov", "adam", "adamw", "rmsprop", "adagrad",
    "adam_schedule", "legacy_sgd_nesterov", "legacy_adam",
])
def test_fit_matches_stock(opt_name):
    """Stock's weights at the end and at every step (each update a step late: sharded gathers
    every bucket at the next step's start), checkpoints at every epoch end, and validation and
    a callback's predictions inside ``fit`` as with stock."""
    ckpt = ModelCheckpointInTmp()
    got = train_fit("cnn_bn", opt_name, ours("sharded", **SMALL), validation=True,
                    callbacks=[ckpt.callback], record_steps=True)
    ref = stock_reference("cnn_bn", opt_name)
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)
    assert ckpt.saved() == EPOCHS
    assert_fit_saw_stocks_weights(got, ref)
    deferred_every_step(got)
    late = deferred_variables(got.optimizer)
    assert sorted(late) == sorted(got.names)  # every bucket gathered at the next step's start
    assert_updates_landed_a_step_late(got, ref, late)


@pytest.mark.parametrize("model_name, opt_name", [
    ("cnn_bn", "sgd_momentum"), ("cnn_bn", "adamw"), ("embedding", "adam"),
    ("embedding", "legacy_adam"),
])
def test_sharded_hybrid_matches_stock(model_name, opt_name):
    """Output-side buckets all-gathered in backprop, input-side ones in the next forward: at
    every step's end the input-side weights are stock's of the step before (their update
    pending), the output-side ones stock's of this step, and the step after brings the
    input side in. Validation inside ``fit`` sees stock's weights."""
    # the embedding's gradient is sparse, and a sparse bucket is never deferred (its size
    # varies per step): on that model the default split defers nothing, so one bucket per
    # layer and two deferred (the embedding's stays in backprop, the first dense layer's waits)
    split = {"bucket_bytes": 512, "defer": 2} if model_name == "embedding" else SMALL
    got = train_fit(model_name, opt_name, ours("sharded_hybrid", **split), validation=True,
                    record_steps=True)
    ref = stock_reference(model_name, opt_name)
    assert_weights_close(got, ref)
    assert_fit_saw_stocks_weights(got, ref)
    deferred_every_step(got)
    late = deferred_variables(got.optimizer)
    specs = got.optimizer.plan.variables
    now = [v.name for v in specs if v.name not in late and not v.sparse]
    assert late and now, (late, now)
    assert max(got.names.index(n) for n in late) < min(got.names.index(n) for n in now), \
        f"{late} deferred, {now} not: the deferred ones are not the input side"
    assert_updates_landed_a_step_late(got, ref, late)


@pytest.mark.parametrize("model_name", ["shared_layer", "embedding", "unused_branch",
                                        "odd_sizes"])
def test_model_kinds_match_stock(model_name):
    got = train_fit(model_name, "sgd_momentum", ours("sharded", **SMALL))
    assert_weights_close(got, stock_reference(model_name, "sgd_momentum"))


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
@pytest.mark.parametrize("strategy", ["sharded", "sharded_hybrid"])
def test_custom_loop_matches_distributed_tape(strategy, opt_name):
    ref = stock_loop("cnn_bn", opt_name)
    got = train_loop("cnn_bn", opt_name, ours(strategy, **SMALL))
    assert_weights_close(got, ref)
    # make_train_step defers every step's gathers (the last ones land in the flush)
    assert got.deferred_steps == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.parametrize("gather_with", ["allgather", "alltoall"])
def test_both_ways_of_gathering_match_stock(gather_with):
    """The all-gather (default) and the alltoall that replaces it give stock's weights."""
    got = train_fit("cnn_bn", "adam", ours("sharded", **SMALL, gather_with=gather_with))
    assert_weights_close(got, stock_reference("cnn_bn", "adam"))


def test_gather_with_is_validated():
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="sharded")
    assert opt._hvdo.settings.gather_with == "allgather"
    with pytest.raises(ValueError, match="gather_with"):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="sharded",
                                  gather_with="broadcast")


def test_horovod_knobs_match_stock():
    """op=Sum, gradient_predivide_factor and fp16 compression act on the reduce-scatter as on
    stock Horovod's allreduce."""
    knobs = {"op": hvd.Sum, "gradient_predivide_factor": 2.0,
             "compression": hvd.Compression.fp16}
    ref = train_fit("cnn_bn", "sgd_momentum", lambda o: stock(o, **knobs))
    got = train_fit("cnn_bn", "sgd_momentum", ours("sharded", **SMALL, **knobs))
    assert_weights_close(got, ref)


def test_update_waits_for_the_next_forward_and_slots_are_slices():
    """Before the flush the last update sits in this rank's slices (weights differ from stock);
    after it they are equal. The optimizer's slots exist for the slices only (1/P of the
    elements, padding included), and none of them is in ``optimizer.variables()``."""
    model, opt, ref_model, ref_opt = step_pair(
        lambda: tf.keras.optimizers.Adam(0.003), ours("sharded", **SMALL), "odd_sizes")
    assert opt.pending
    assert max_abs_diff(Result(model), Result(ref_model)) > 1e-4
    assert int(opt.iterations.numpy()) == 6
    opt.flush()
    assert int(opt.iterations.numpy()) == 6
    assert_weights_close(Result(model), Result(ref_model))

    layout = opt.shard_layout
    n = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert sum(b.total for b in layout.buckets) == n
    assert any(b.padding for b in layout.buckets), "the test should exercise padding"
    slots = opt._hvdo.state.slots
    for b in layout.buckets:
        assert sorted(slots[b.bucket]) == ["m", "v"]
        assert all(tuple(s.shape) == (b.shard_size,) for s in slots[b.bucket].values())
    ours_elems = sum(int(np.prod(s.shape)) for d in slots.values() for s in d.values())
    stock_elems = sum(int(np.prod(v.shape)) for v in ref_opt.variables()[1:])
    assert stock_elems == 2 * n
    assert ours_elems == sum(2 * b.shard_size for b in layout.buckets)
    assert ours_elems <= stock_elems / hvd.size() + 2 * len(layout.buckets) * hvd.size()
    assert [v.name for v in opt.variables()] == [opt.iterations.name]
    assert "per rank" in layout.describe()


def test_gathered_state_equals_stock_slots():
    """The optimizer state a checkpoint gets: every rank's slices joined into whole arrays,
    equal to stock Horovod's Adam moments."""
    model, opt, ref_model, ref_opt = step_pair(
        lambda: tf.keras.optimizers.Adam(0.003), ours("sharded", **SMALL), "odd_sizes")
    opt.flush()
    opt.gather_state()
    saved = opt._hvdo.state.checkpoint
    assert saved.iterations == 6
    for slot, index in (("m", ref_opt._momentums), ("v", ref_opt._velocities)):
        for i, ref in enumerate(index):
            np.testing.assert_allclose(saved.slots[slot][i], ref.numpy(),
                                       rtol=1e-5, atol=1e-7, err_msg=f"{slot} {i}")


@pytest.mark.parametrize("opt_name, strategy", [("adam", "sharded"), ("legacy_adam", "sharded"),
                                               ("adam", "sharded_hybrid")])
def test_checkpoint_resume_equals_uninterrupted_run(opt_name, strategy):
    whole = train_fit("cnn_bn", opt_name, ours(strategy, **SMALL), epochs=4)
    ckpt = ModelCheckpointInTmp()
    train_fit("cnn_bn", opt_name, ours(strategy, **SMALL), epochs=2, callbacks=[ckpt.callback])
    # the optimizer's entries: its step, its hyperparameters and the gathered state, no slices
    saved = tf.train.load_checkpoint(ckpt.path).get_variable_to_shape_map()
    shapes = {tuple(v.shape) for v in MODELS["cnn_bn"]().trainable_variables}
    sharded = [k for k in saved if "hvd_overlap_sharded_state" in k]
    assert len(sharded) == 4
    others = [k for k in saved if k.startswith("optimizer/") and k not in sharded]
    assert others and all(saved[k] == [] for k in others), others  # scalars only
    assert len(shapes) > 1
    resumed = train_fit("cnn_bn", opt_name, ours(strategy, **SMALL), epochs=4, initial_epoch=2,
                        restore=ckpt.path)
    assert_weights_close(resumed, whole, trainable_only=hvd.rank() != 0)
    # ...and it can fail: without the optimizer state (moments reset) the run ends elsewhere
    fresh = train_fit("cnn_bn", opt_name, ours(strategy, **SMALL), epochs=4, initial_epoch=2,
                      restore=ckpt.path, restore_optimizer=False)
    assert max_abs_diff(fresh, whole) > 1e-4


def test_checkpoint_without_gathered_state_is_refused_on_restore():
    """A mid-epoch checkpoint without OverlapCallback(flush_every=...) would pair new weights
    with old optimizer state: restoring it fails with the fix named, on every rank."""
    ckpt = ModelCheckpointInTmp(save_freq=5)
    train_fit("cnn_bn", "adam", ours("sharded", **SMALL), epochs=1, callbacks=[ckpt.callback])
    with pytest.raises(ValueError, match="flush_every"):
        train_fit("cnn_bn", "adam", ours("sharded", **SMALL), epochs=2, initial_epoch=1,
                  restore=ckpt.path)


@pytest.mark.parametrize("make, match", [
    (lambda: tf.keras.optimizers.SGD(0.1, clipnorm=1.0), "clipnorm"),
    (lambda: tf.keras.optimizers.Adam(0.1, global_clipnorm=1.0), "clipnorm"),
    (lambda: tf.keras.optimizers.Adafactor(0.1), "element-wise"),
    (lambda: tf.keras.optimizers.Adam(0.1, use_ema=True), "use_ema"),
])
def test_what_slices_cannot_do_is_refused_on_every_rank(make, match):
    with pytest.raises(ValueError, match=match):
        hvdo.DistributedOptimizer(make(), strategy="sharded")


def test_constraint_is_refused_before_any_collective():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(
        4, kernel_constraint=tf.keras.constraints.MaxNorm(1.0), input_shape=(3,))])
    model.compile(ours("sharded")(tf.keras.optimizers.SGD(0.1)), loss="mse")
    with pytest.raises(ValueError, match="constraint"):
        model.fit(np.ones((4, 3)), np.ones((4, 4)), epochs=1, verbose=0,
                  callbacks=[hvdo.OverlapCallback()])


def test_keras_file_holds_the_whole_state_in_the_plain_layout():
    """``model.save('m.keras')`` with a sharded optimizer writes what stock Horovod's would:
    loaded without the plugin, the optimizer's variables equal stock Horovod's after the same
    training (every rank's slices joined, nothing lost)."""
    def run(wrap):
        tf.keras.utils.set_random_seed(3)
        model = MODELS["odd_sizes"]()
        model.compile(optimizer=wrap(OPTIMIZERS["adam"]()), loss=LOSS)
        x, y = rank_data("odd_sizes", BATCH * 4)
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                  callbacks=[hvdo.OverlapCallback()])
        return model

    path = Path(hvd_tf.broadcast_object(tempfile.mkdtemp(), 0, name="keras_file_dir"))
    run(ours("sharded", **SMALL)).save(path / f"rank{hvd.rank()}.keras")
    got = tf.keras.models.load_model(path / f"rank{hvd.rank()}.keras").optimizer
    ref = run(stock).optimizer  # (stock Horovod's own .keras files need its custom objects)
    assert type(got).__name__ == "Adam" and not hasattr(got, "_hvdo")
    assert len(got.variables) == len(ref.variables) == 1 + 2 * 6
    for a, b in zip(got.variables, ref.variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7, err_msg=a.name)


_ONE_RANK = """
import sys
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
import hvd_overlap.keras as hvdo
from tests.multirank.helpers import BATCH, LOSS, MODELS, OPTIMIZERS
hvd.init()
assert hvd.size() == 1
data = np.load(sys.argv[1])
tf.keras.utils.set_random_seed(3)
model = MODELS["odd_sizes"]()
opt = hvdo.DistributedOptimizer(OPTIMIZERS["adam"](), strategy="sharded", bucket_bytes=2048)
model.compile(optimizer=opt, loss=LOSS)
save = tf.keras.callbacks.ModelCheckpoint(sys.argv[2], save_weights_only=True)
model.fit(data["x"], data["y"], batch_size=2 * BATCH, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvdo.OverlapCallback(), save])
"""


def test_checkpoint_from_one_rank_resumes_on_two():
    """The checkpoint keeps whole arrays, so the number of ranks can change: one process trains
    an epoch on both ranks' batches side by side (the same averaged gradients), saves; two
    ranks resume and end where two ranks training throughout end (fp32 rounding apart)."""
    assert hvd.size() == 2
    x, y = rank_data("odd_sizes", BATCH * STEPS_PER_EPOCH)
    both = hvd_tf.allgather_object((x, y), name="one_rank_data")
    # every rank runs the one-rank job itself (none waits in a collective meanwhile, which
    # Horovod's stall shutdown would end on a slow machine) and resumes from its own file
    base = Path(tempfile.mkdtemp())
    ckpt = str(base / "ckpt")
    # batch k of one rank = batch k of rank 0, then batch k of rank 1
    xs = np.concatenate([np.concatenate([d[0][k * BATCH:(k + 1) * BATCH] for d in both])
                         for k in range(STEPS_PER_EPOCH)])
    ys = np.concatenate([np.concatenate([d[1][k * BATCH:(k + 1) * BATCH] for d in both])
                         for k in range(STEPS_PER_EPOCH)])
    np.savez(base / "data.npz", x=xs, y=ys)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    done = subprocess.run([sys.executable, "-c", _ONE_RANK, str(base / "data.npz"), ckpt],
                          env=env, cwd=Path(__file__).parents[2], capture_output=True,
                          text=True, timeout=240)
    ok = done.returncode == 0
    message = done.stderr[-3000:]
    oks = hvd_tf.allgather_object(ok, name="one_rank_done")
    assert all(oks), message or "the one-rank run failed on the other rank"
    whole = train_fit("odd_sizes", "adam", stock, epochs=2)
    resumed = train_fit("odd_sizes", "adam", ours("sharded", **SMALL), epochs=2,
                        initial_epoch=1, restore=ckpt)
    assert_weights_close(resumed, whole, rtol=1e-4, atol=1e-5)
    # the optimizer state mattered: without it the resumed run ends elsewhere
    fresh = train_fit("odd_sizes", "adam", ours("sharded", **SMALL), epochs=2, initial_epoch=1,
                      restore=ckpt, restore_optimizer=False)
    assert max_abs_diff(fresh, whole) > 1e-3
