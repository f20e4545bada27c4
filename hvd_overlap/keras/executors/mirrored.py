"""A sharded plan ``strategy="auto"`` runs: the sharded update, its state mirrored in the
optimizer's own whole slots (``hvd_overlap.keras.mirrored_state``), so that checkpoints,
``.keras`` files and broadcasts see what stock Horovod's would, whatever plan runs."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_overlap.keras.executors.base import Executor
from hvd_overlap.keras.executors.sharded import ShardedExecutor
from hvd_overlap.keras.mirrored_state import MirroredState
from hvd_overlap.keras.sharded_slots import stale_state_error


class MirroredShardedExecutor(ShardedExecutor):
    """``sharded`` / ``sharded_hybrid`` (with or without the exchange) whose slices start from
    the whole slots and are gathered back into them at checkpoint points and when it ends."""

    state_class = MirroredState
    state: MirroredState

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.ran_to: int | None = None  # the step the slices were at when last flushed

    def flush(self) -> None:
        super().flush()
        if self.state.layout is not None and tf.executing_eagerly():
            self.ran_to = self.state.step

    def gather_state(self) -> None:
        """The slices' state into the whole slots (every rank), where checkpoints read it."""
        if self.state.layout is not None:
            self.state.to_whole()

    def release(self) -> None:
        """The plan ends (auto switches away, after a flush): the state goes back whole, and
        the exchange's layers compute as Keras's again (every rank)."""
        self.state.release()
        self.exchange.deactivate()

    def reload(self) -> None:
        """The whole slots may have been restored (a checkpoint loaded between fits, or by a
        callback): if the step counter moved since the last flush, or the whole slots hold
        this step's state, cut the slices from them again (eager, local)."""
        st = self.state
        if st.layout is None:
            return
        step = st.step
        if step != self.ran_to or step == st.gathered_at:
            st.from_whole()

    @property
    def checkpoint_entry(self) -> Any:
        return None  # the optimizer's own variables are the checkpoint

    def build(self, var_list) -> Any:
        return Executor.build(self, var_list)

    def save_own_variables(self, store: Any) -> Any:
        """As stock's: the whole slots -- current only after ``gather_state`` (every rank)."""
        st = self.state
        if st.layout is not None and st.gathered_at != st.step:
            raise stale_state_error(st.step, st.gathered_at)
        return Executor.save_own_variables(self, store)

    def load_own_variables(self, store: Any) -> Any:
        out = Executor.load_own_variables(self, store)
        if self.state.layout is not None:
            self.state.from_whole()
        return out
