"""The internals both Keras generations share (same name, same meaning in Keras 2.15, tf-keras
2.17/2.18 and Keras 3 on TensorFlow), re-exported by ``keras2`` and ``keras3``: TensorFlow's
checkpoint hooks, instance-level patching, the train function ``fit`` reads every step, the
``.keras`` store layout, and Horovod's gradient function."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf
from tensorflow.python.ops import control_flow_util as _control_flow_util
from tensorflow.python.trackable import base as _trackable

__all__ = ["SHARED_HOOK_NAMES", "Trackable", "fill_store", "forget_train_function",
           "horovod_allreduce_grads_fn", "new_train_function", "parent_trackable_children",
           "patch_method", "plain_optimizer_class", "read_store", "refuse_xla", "restore_method",
           "set_train_function", "track_child", "wrapped_optimizer"]

#: Methods of the plugin's own classes that keep a private name because TensorFlow or Horovod
#: call them by it, on either Keras generation: (class, name, caller). Each adapter's
#: ``HOOK_NAMES`` adds those Keras itself calls.
SHARED_HOOK_NAMES: tuple[tuple[str, str, str], ...] = (
    ("DistributedMixin", "_trackable_children", "TF checkpointing asks a Trackable for them"),
    ("DistributedMixin", "_agg_helper", "Horovod's attribute (backward_passes_per_step)"),
    ("ShardedCheckpoint", "_serialize_to_tensors", "TF checkpoint saving"),
    ("ShardedCheckpoint", "_restore_from_tensors", "TF checkpoint restoring"),
)

#: TF's base of checkpointable objects (no public alias): ``ShardedCheckpoint`` subclasses it
#: to save its own tensors via the ``_serialize_to_tensors`` hooks of ``HOOK_NAMES``.
Trackable = _trackable.Trackable


def plain_optimizer_class(cls: type) -> type:
    """The user's optimizer class behind a generated distributed class: its MRO is (generated
    class, ``DistributedMixin``, user's class, ...)."""
    return cls.__mro__[2]


def parent_trackable_children(parent: Any, save_type: str, **kwargs: Any) -> dict[str, Any]:
    """``Trackable._trackable_children`` of the plain optimizer (``parent``: a ``super()``):
    what TF checkpoints under it; the mixin's override filters it (sharded slots)."""
    return parent._trackable_children(save_type, **kwargs)


def track_child(obj: Any, child: Any, name: str) -> None:
    """``Trackable._track_trackable``: make ``child`` a named checkpoint dependency of ``obj``
    (the sharded state is saved and restored with the optimizer)."""
    obj._track_trackable(child, name=name)


def fill_store(store: Any, arrays: Sequence[Any]) -> None:
    """Write a ``.keras`` file's optimizer entry as ``save_own_variables`` does:
    ``store[str(i)]`` for the i-th of ``variables`` (``iterations`` first)."""
    for i, a in enumerate(arrays):
        store[str(i)] = a


def read_store(store: Any) -> list[Any]:
    """The arrays of an optimizer entry written by ``save_own_variables``, in order."""
    return [store[str(k)] for k in range(len(store.keys()))]


def patch_method(obj: Any, name: str, fn: Callable[..., Any]) -> Any:
    """Replace ``obj.name`` by ``fn`` as an instance attribute; return what the instance
    itself held before (None: the class's method). Keras reads the attribute when it is used
    (``__call__`` calls ``self.call``, ``make_train_function`` reads ``self.train_step``), so
    the replacement takes effect from the next trace."""
    previous = vars(obj).get(name)
    setattr(obj, name, fn)
    return previous


def restore_method(obj: Any, name: str, previous: Any = None) -> None:
    """Undo ``patch_method``: put ``previous`` back, or (None) delete the instance attribute
    so the class's method is seen again."""
    if previous is not None:
        setattr(obj, name, previous)
    elif name in vars(obj):
        delattr(obj, name)


def wrapped_optimizer(opt: Any) -> Any:
    """The plugin's optimizer behind a model's ``optimizer``: itself, or, with Keras 2 mixed
    precision, the one inside the ``LossScaleOptimizer`` that ``compile`` wrapped around it (on
    Keras 3 the plugin's optimizer is the loss-scale optimizer itself)."""
    if hasattr(opt, "register_bucket_method"):
        return opt
    return getattr(opt, "inner_optimizer", opt)


def new_train_function(model: Any) -> Any:
    """A freshly traced-on-first-call train function of ``model`` (``make_train_function(
    force=True)``, which stores it in ``model.train_function``; Keras 3's returns None)."""
    model.make_train_function(force=True)
    return model.train_function


def set_train_function(model: Any, fn: Any) -> None:
    """``fit`` calls ``model.train_function`` afresh at every step (Keras 2 and 3), so a
    callback's ``on_train_batch_begin`` can choose the function the step runs."""
    model.train_function = fn


def forget_train_function(model: Any) -> None:
    """Drop the cached train function: the next ``fit`` (``make_train_function``) traces
    ``train_step`` again."""
    model.train_function = None


def refuse_xla(strategy: str) -> None:
    """Horovod's collectives have no XLA kernels: a train step compiled with XLA
    (``compile(jit_compile=True)``; Keras 3 turns it on by itself where a GPU is visible)
    cannot run them. Raise, naming the fix, while the step is traced (every rank traces the
    same step, before any collective)."""
    graph = tf.compat.v1.get_default_graph()
    if _control_flow_util.GraphOrParentsInXlaContext(graph):
        raise ValueError(
            f"hvd_overlap (strategy {strategy!r}): the train step is compiled with XLA "
            "(jit_compile), which cannot run Horovod's collectives; compile the model with "
            "model.compile(..., jit_compile=False) (Keras 3 enables it by default where a GPU "
            "is visible)")


def horovod_allreduce_grads_fn(*args: Any, **kwargs: Any) -> Callable[..., Any]:
    """``horovod.tensorflow._make_allreduce_grads_fn``: the gradient function stock
    ``hvd.DistributedOptimizer`` uses (its arguments), so the ``horovod`` strategy sends
    exactly as Horovod does."""
    return hvd._make_allreduce_grads_fn(*args, **kwargs)
