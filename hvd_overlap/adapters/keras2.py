"""Every private Keras / TensorFlow / Horovod internal the plugin relies on, in one file.

The rest of ``hvd_overlap`` calls public API and this module only. Each function names one
internal, says what Keras 2.15 (TF 2.15, Horovod 0.28) does there and why the plugin needs it;
the same internals are in tf-keras 2.17 (TF 2.17 with ``TF_USE_LEGACY_KERAS=1``).
On a Keras upgrade, re-check this file: ``tests/test_compat.py`` asserts the version and that
each attribute used here still exists, so it fails first, naming the attribute.

The plugin needs ``tf.keras`` to be Keras 2. On TF >= 2.16 it is Keras 3 unless tf-keras is
installed and ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported: importing this
module refuses Keras 3 at once (``require_keras_2``), before any collective.

``comm`` and ``growth`` import it inside the function that needs it (``comm`` is imported by
``hvd_overlap.keras`` itself, so a top-level import would be circular).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf
from tensorflow.python.trackable import base as _trackable

#: the Keras 2 releases behind ``tf.keras`` this adapter was checked with (``keras`` 2.15 of
#: TF 2.15; ``tf_keras`` 2.17 and 2.18 of TF 2.17 and 2.18): ``tests/test_compat.py`` fails on
#: any other
KERAS_VERSIONS: tuple[str, ...] = ("2.15", "2.17", "2.18")


class KerasVersionError(ImportError):
    """``tf.keras`` is not Keras 2 (TF >= 2.16 without tf-keras and ``TF_USE_LEGACY_KERAS=1``)."""


def keras_behind_tf_keras() -> tuple[str, str]:
    """(package, version) of the Keras that ``tf.keras`` resolves to: ``keras`` 2.15 on TF
    2.15; on TF >= 2.16 ``keras`` 3.x, or ``tf_keras`` 2.x with ``TF_USE_LEGACY_KERAS=1``.
    TF's lazy ``tf.keras`` loads that package on first use."""
    package = tf.keras.__name__.split(".")[0]
    return package, str(getattr(sys.modules.get(package), "__version__", "unknown"))


def keras_3_message(tf_version: str, package: str, keras_version: str) -> str | None:
    """Why the plugin cannot run with this ``tf.keras`` and the fix, or None if it can
    (Keras 2). Pure, so the rule is tested with any versions."""
    if keras_version.split(".")[0] == "2":
        return None
    minor = ".".join(tf_version.split(".")[:2])
    return (f"hvd_overlap.keras needs tf.keras to be Keras 2, but on TensorFlow {tf_version} "
            f"tf.keras is {package} {keras_version} (Keras 3). Fix: pip install "
            f"'tf-keras=={minor}.*' (the tf-keras matching TensorFlow {minor}) and "
            f"export TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (in the environment "
            f"of every rank, or os.environ at the very top of the script)")


def require_keras_2() -> None:
    """Raise ``KerasVersionError`` naming the fix unless ``tf.keras`` is Keras 2."""
    message = keras_3_message(tf.__version__, *keras_behind_tf_keras())
    if message:
        raise KerasVersionError(message)


def keras_3_object_message(obj: Any) -> str | None:
    """The fix, if ``obj``'s class comes from a Keras 3 package (e.g. ``keras.optimizers.Adam``
    of ``keras`` 3 while ``tf.keras`` is tf-keras): such an optimizer cannot be wrapped."""
    package = type(obj).__module__.split(".")[0]
    version = str(getattr(sys.modules.get(package), "__version__", ""))
    if version.split(".")[0] != "3":
        return None
    return (f"{type(obj).__name__} is a Keras 3 optimizer ({package} {version}); the plugin, "
            f"as Horovod, wraps Keras 2 ones: use tf.keras.optimizers.{type(obj).__name__} "
            f"(tf-keras's, with TF_USE_LEGACY_KERAS=1 set before TensorFlow is imported)")

#: Methods and properties of the plugin's own classes that keep a private name because Keras,
#: TensorFlow or Horovod call them by it (their bodies call this module): (class, name, caller).
HOOK_NAMES: tuple[tuple[str, str, str], ...] = (
    ("DistributedMixin", "_trackable_children", "TF checkpointing asks a Trackable for them"),
    ("DistributedMixin", "_apply_weight_decay", "Keras 2.11+ Optimizer.apply_gradients"),
    ("DistributedMixin", "_compute_gradients", "legacy Optimizer.minimize; Horovod's name"),
    ("DistributedMixin", "_agg_helper", "Horovod's attribute (backward_passes_per_step)"),
    ("ShardedCheckpoint", "_serialize_to_tensors", "TF checkpoint saving"),
    ("ShardedCheckpoint", "_restore_from_tensors", "TF checkpoint restoring"),
)

#: TF's base of checkpointable objects (no public alias in TF 2.15): ``ShardedCheckpoint``
#: subclasses it to save its own tensors via the ``_serialize_to_tensors`` hooks above.
Trackable = _trackable.Trackable


# -- the optimizer's class and Keras's hooks -----------------------------------------------------

def plain_optimizer_class(cls: type) -> type:
    """The user's optimizer class behind a generated distributed class: its MRO is (generated
    class, ``DistributedMixin``, user's class, ...)."""
    return cls.__mro__[2]


def is_legacy_optimizer(opt: Any) -> bool:
    """True for ``tf.keras.optimizers.legacy`` optimizers (OptimizerV2: ``add_slot`` slots,
    ``_hyper`` hyperparameters), False for the Keras 2.11+ ones (slots in ``variables``)."""
    return isinstance(opt, tf.keras.optimizers.legacy.Optimizer)


def parent_trackable_children(parent: Any, save_type: str, **kwargs: Any) -> dict[str, Any]:
    """``Trackable._trackable_children`` of the plain optimizer (``parent``: a ``super()``):
    what TF checkpoints under it; the mixin's override filters it (sharded slots)."""
    return parent._trackable_children(save_type, **kwargs)


def legacy_compute_gradients(parent: Any) -> Callable[..., Any] | None:
    """The legacy optimizers' ``_compute_gradients`` (which their ``minimize`` calls), bound
    to ``parent`` (a ``super()``); None on Keras 2.11+ optimizers, which have none."""
    return getattr(parent, "_compute_gradients", None)


def plain_weight_decay(parent: Any) -> Callable[[Sequence[tf.Variable]], Any] | None:
    """Keras 2.11+ ``Optimizer._apply_weight_decay`` (decoupled decay, called by
    ``apply_gradients`` before the update) of ``parent`` (a ``super()``); None on legacy ones."""
    return getattr(parent, "_apply_weight_decay", None)


def track_child(obj: Any, child: Any, name: str) -> None:
    """``Trackable._track_trackable``: make ``child`` a named checkpoint dependency of ``obj``
    (the sharded state is saved and restored with the optimizer)."""
    obj._track_trackable(child, name=name)


# -- optimizer variables: slots and hyperparameters ----------------------------------------------

def create_legacy_slots(opt: Any, variables: Sequence[tf.Variable]) -> None:
    """Legacy ``OptimizerV2._create_all_weights``: iterations, hyperparameters and the slots
    of ``variables`` (only those not made yet), as its ``apply_gradients`` does first."""
    opt._create_all_weights(variables)


def mark_unbuilt(opt: Any) -> None:
    """Keras 2.11+ ``build`` returns at once once ``_built``; clear it so a later plan's
    slices (auto's plan switch) get slots too."""
    opt._built = False


def shared_name(var: tf.Variable) -> str:
    """``Variable._shared_name`` (the name without ``:0``): Keras 2.11+ names a slot
    ``<slot>/<_shared_name of its variable>`` (``add_variable_from_reference``)."""
    return var._shared_name


def slot_of(v: tf.Variable) -> tuple[str, str]:
    """(slot name, variable name) of a Keras 2.11+ optimizer variable named
    ``[<optimizer>/]<slot>/<variable>``."""
    prefix, _, var_name = v.name.split(":")[0].rpartition("/")
    return prefix.rpartition("/")[2], var_name


def slot_variables(opt: Any) -> list[tf.Variable]:
    """A built Keras 2.11+ optimizer's variables after its step counter: ``variables`` lists
    ``iterations`` first, then the slots in ``build`` order (``save_own_variables``'s order)."""
    return list(opt.variables[1:])


def hide_optimizer_variables(opt: Any, hidden: set[int]) -> None:
    """Drop the variables with these ids from ``opt.variables()`` (its private list: legacy
    ``_weights``, Keras 2.11+ ``_variables``), and so from broadcasts and its checkpoint."""
    if is_legacy_optimizer(opt):
        opt._weights = [v for v in opt._weights if id(v) not in hidden]
    else:
        opt._variables = [v for v in opt._variables if id(v) not in hidden]


def forget_legacy_slots(opt: Any, dropped: set[int]) -> None:
    """A legacy optimizer keeps slots in ``_slots`` (variable key -> slot name -> slot): forget
    the entries holding these ids. A Keras 2.11+ one replaces its lists when built again."""
    if not is_legacy_optimizer(opt):
        return
    opt._slots = {k: d for k, d in opt._slots.items()
                  if not any(id(v) in dropped for v in d.values())}


def uses_weight_decay(opt: Any, var: tf.Variable) -> bool:
    """Keras 2.11+ ``_use_weight_decay``: False for variables excluded from decoupled weight
    decay (``exclude_from_weight_decay``, by identity or name)."""
    return opt._use_weight_decay(var)


def legacy_nadam_momentum_cache(opt: Any, variables: Sequence[tf.Variable]
                                ) -> tf.Variable | None:
    """The legacy Nadam's momentum-schedule product ``_m_cache``, which every
    ``apply_gradients`` call advances (created with the slots of ``variables`` if need be);
    None for other optimizers."""
    if not isinstance(opt, tf.keras.optimizers.legacy.Nadam):
        return None
    opt._create_all_weights(variables)
    return opt._m_cache


def hyper_variables(opt: Any) -> list[tf.Variable]:
    """The variables holding hyperparameters a callback may change between steps. Keras keeps
    them privately: Keras 2.11+ only the learning rate, in ``_learning_rate``; legacy ones all
    of them, in ``_hyper``, made variables here by ``_create_hypers`` if they are not yet."""
    if hasattr(opt, "_create_hypers"):  # legacy
        _ = opt.iterations  # first, as Keras makes them: the optimizer's weights keep its order
        opt._create_hypers()
        hypers = [v for _, v in sorted(opt._hyper.items())]
    else:
        hypers = [getattr(opt, "_learning_rate", None)]
    return [h for h in hypers if isinstance(h, tf.Variable)]


def fill_store(store: Any, arrays: Sequence[Any]) -> None:
    """Write a ``.keras`` file's optimizer entry as Keras 2.11+ ``save_own_variables`` does:
    ``store[str(i)]`` for the i-th of ``variables`` (``iterations`` first)."""
    for i, a in enumerate(arrays):
        store[str(i)] = a


def read_store(store: Any) -> list[Any]:
    """The arrays of an optimizer entry written by ``save_own_variables``, in order."""
    return [store[str(k)] for k in range(len(store.keys()))]


# -- graphs and layers ----------------------------------------------------------------------------

def compute_dtype_object(layer: Any) -> tf.DType:
    """``Layer._compute_dtype_object``: the ``tf.DType`` Keras casts a layer's inputs to in
    ``__call__`` (the exchanged ``Dense`` call does the same cast itself)."""
    return layer._compute_dtype_object


# -- patching Keras objects ----------------------------------------------------------------------

def patch_method(obj: Any, name: str, fn: Callable[..., Any]) -> Any:
    """Replace ``obj.name`` by ``fn`` as an instance attribute; return what the instance
    itself held before (None: the class's method). Keras 2.15 reads the attribute when it is
    used (``__call__`` calls ``self.call``, ``make_train_function`` reads ``self.train_step``),
    so the replacement takes effect from the next trace."""
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


def set_train_function(model: Any, fn: Any) -> None:
    """Keras 2.15 ``fit`` calls ``model.train_function`` afresh at every step, so a callback's
    ``on_train_batch_begin`` can choose the function the step runs."""
    model.train_function = fn


def forget_train_function(model: Any) -> None:
    """Drop the cached train function: the next ``fit`` (``make_train_function``) traces
    ``train_step`` again."""
    model.train_function = None


# -- Horovod ---------------------------------------------------------------------------------------

def horovod_allreduce_grads_fn(*args: Any, **kwargs: Any) -> Callable[..., Any]:
    """``horovod.tensorflow._make_allreduce_grads_fn``: the gradient function stock
    ``hvd.DistributedOptimizer`` uses (its arguments), so the ``horovod`` strategy sends
    exactly as Horovod does."""
    return hvd._make_allreduce_grads_fn(*args, **kwargs)


require_keras_2()  # on import: every module of hvd_overlap.keras imports this one
