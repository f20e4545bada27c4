"""``strategy="auto"`` over every exact plan: switched into and out of a sharded plan with the
dense factor exchange, a run still gives stock Horovod's weights, and its checkpoints hold the
optimizer state as stock's do (a stock run resumes from them)."""

from __future__ import annotations

import horovod.tensorflow as hvd_tf
import pytest
import tensorflow as tf

from hvd_overlap.core.choice import (
    Exchange,
    Hybrid,
    Sharded,
    StockHorovod,
    Strategy,
)
from hvd_overlap.keras.executors import auto
from hvd_overlap.keras.mirrored_state import MirroredState
from tests.multirank.helpers import (
    ModelCheckpointInTmp,
    assert_weights_close,
    max_abs_diff,
    same_on_all_ranks,
    stock,
    stock_reference,
    train_fit,
)
from tests.multirank.test_auto import auto_with, short_trials  # noqa: F401 (autouse here too)

HORO = StockHorovod()
#: dense_big's 1024x1024 on the rows
EXCHANGE = Sharded(bucket_bytes=8192, exchange=Exchange(forward="rows"))
DENSE_ONLY = Sharded(bucket_bytes=8192, exchange=Exchange(forward="rows"),
                     shard="dense")  # the rest whole
HYBRID = Hybrid(bucket_bytes=2048, defer=2)
TRIALS = [EXCHANGE, HYBRID]
MODEL = "dense_big"


def choose_the_exchange(monkeypatch, plan: Strategy = EXCHANGE) -> None:
    """Every trial of the exchange plan measures fastest (the same on every rank)."""
    ms = {HORO: 100.0, plan: 50.0, HYBRID: 90.0}

    def agree(self, values):
        return [ms[self.current] / 1e3, 1.0]
    monkeypatch.setattr(auto.AutoExecutor, "_agree", agree)


@pytest.mark.parametrize("opt_name", ["adam_decay", "legacy_sgd_nesterov"])
def test_switching_into_and_out_of_the_exchange_matches_stock(opt_name, exchanged):
    ckpt = ModelCheckpointInTmp()
    wrap = auto_with(TRIALS)
    got = train_fit(MODEL, opt_name, wrap, validation=True, callbacks=[ckpt.callback])
    ex = wrap.made[0]._hvdo
    assert ex.settled, ex.log
    assert set(ex.measured) == {HORO, *TRIALS} and ex.switches >= len(TRIALS)
    assert exchanged["n"] > 0, "the exchange plan never carried a kernel"
    assert_weights_close(got, stock_reference(MODEL, opt_name))
    assert same_on_all_ranks(got)
    assert ckpt.saved() == 2


@pytest.mark.parametrize("plan", [EXCHANGE, DENSE_ONLY], ids=["sharded", "dense_only"])
def test_a_checkpoint_of_the_exchange_plan_is_stocks_and_resumes_exactly(monkeypatch, exchanged,
                                                                         plan):
    """auto settles on the exchange plan (every bucket sharded, or only the dense kernels);
    the checkpoint saved while it runs holds the optimizer's own variables (no state of the
    plugin's), and both auto and stock Horovod resume from it to the uninterrupted run's
    weights."""
    choose_the_exchange(monkeypatch, plan)
    trials = [plan, HYBRID]
    whole = train_fit(MODEL, "adam_decay", auto_with(trials), epochs=4)
    ckpt = ModelCheckpointInTmp()
    wrap = auto_with(trials)
    train_fit(MODEL, "adam_decay", wrap, epochs=3, callbacks=[ckpt.callback])
    ex = wrap.made[0]._hvdo
    assert ex.settled and ex.current == plan, ex.log
    assert exchanged["n"] > 0
    assert any(b.whole for b in wrap.made[0].plan.buckets) == (plan == DENSE_ONLY)
    saved = tf.train.load_checkpoint(ckpt.path).get_variable_to_shape_map()
    assert not [k for k in saved if "hvd_overlap" in k], "plugin state in the checkpoint"
    resumed = train_fit(MODEL, "adam_decay", auto_with(trials), epochs=4, initial_epoch=3,
                        restore=ckpt.path)
    assert_weights_close(resumed, whole)
    by_stock = train_fit(MODEL, "adam_decay", stock, epochs=4, initial_epoch=3, restore=ckpt.path)
    assert_weights_close(by_stock, whole)
    assert_weights_close(whole, train_fit(MODEL, "adam_decay", stock, epochs=4))
    assert same_on_all_ranks(resumed)


def test_slices_that_do_not_start_from_the_whole_state_end_elsewhere(monkeypatch):
    """Negative control: a sharded plan whose slices start from fresh slots (the optimizer's
    state not cut into them) ends away from stock's weights."""
    monkeypatch.setattr(MirroredState, "from_whole", lambda self: None)
    got = train_fit(MODEL, "adam_decay", auto_with(TRIALS))
    assert max_abs_diff(got, stock_reference(MODEL, "adam_decay")) > 1e-4
    assert hvd_tf.size() == 2
