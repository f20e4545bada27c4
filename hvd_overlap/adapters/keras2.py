"""Keras 2's internals (``tf.keras`` of TF 2.15, tf-keras 2.17/2.18 with
``TF_USE_LEGACY_KERAS=1``), behind the interface ``keras3`` offers too; ``adapters/__init__``
picks one at import. Each function names one internal, says what Keras 2 does there and why the
plugin needs it. On a Keras upgrade, re-check this file: ``tests/test_compat.py`` asserts the
version and that each attribute used here still exists, so it fails first, naming it.

``comm`` and ``growth`` import it (through ``hvd_overlap.adapters``), never ``keras``.
"""


from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

# the shared half of the interface (``common.__all__``), re-exported
from hvd_overlap.adapters.common import *  # noqa: F403
from hvd_overlap.adapters.common import SHARED_HOOK_NAMES
from hvd_overlap.adapters.generation import other_generation_message

#: the Keras generation this adapter serves
GENERATION = 2
#: the Keras 2 releases behind ``tf.keras`` this adapter was checked with (``keras`` 2.15 of
#: TF 2.15; ``tf_keras`` 2.17 and 2.18 of TF 2.17 and 2.18): ``tests/test_compat.py`` fails on
#: any other
KERAS_VERSIONS: tuple[str, ...] = ("2.15", "2.17", "2.18")
#: the Keras package the plugin builds on (callbacks, layers, models): ``tf.keras`` itself
keras = tf.keras
#: methods the generated optimizer class adds besides ``DistributedMixin``'s: none (Keras 2's
#: ``fit``, ``minimize`` and custom loops all reach ``apply_gradients``)
ENTRY_METHODS: dict[str, Callable[..., Any]] = {}

#: Keras 2.15's Nadam multiplies its momentum-schedule product once per variable whose traced
#: Python counter differs from the step, so stock Horovod's own weights change with the number
#: of times the train function was traced (measured: one extra trace after 3 of 10 steps took
#: the product from 1.8e-10 to 7.4e-11; the formula gives 2.0e-3). The legacy Nadam keeps it in
#: a variable: the executors advance it once per step, exactly.
_NADAM = ("tf.keras.optimizers.Nadam keeps its momentum-schedule product in a Python counter "
          "that each trace of the train function bakes in, so even stock Horovod's weights "
          "depend on how often the train function was traced; strategy {strategy!r} traces it "
          "again and applies a step in parts, so no run can be compared with stock's. Use "
          "tf.keras.optimizers.legacy.Nadam (exact with every strategy), Adam, or "
          "strategy='layerwise'")


# -- what the plugin accepts --------------------------------------------------------------------

def optimizer_problem(opt: Any) -> str | None:
    """Why ``opt`` cannot be wrapped (not a Keras 2 optimizer), or None."""
    if isinstance(opt, tf.keras.optimizers.Optimizer | tf.keras.optimizers.legacy.Optimizer):
        return None
    return other_generation_message(opt, GENERATION) or (
        f"expected a Keras optimizer (tf.keras.optimizers.*), got {type(opt).__name__}")


def optimizer_classes(legacy: bool = False) -> dict[str, type]:
    """The optimizer classes of one family by name (SGD, Adam, ...): ``tf.keras.optimizers``,
    or ``tf.keras.optimizers.legacy`` with ``legacy``; no loss-scale optimizer."""
    module = tf.keras.optimizers.legacy if legacy else tf.keras.optimizers
    return {name: c for name, c in vars(module).items()
            if isinstance(c, type) and issubclass(c, module.Optimizer)
            and c is not module.Optimizer and "LossScale" not in name}


def element_wise_optimizers() -> tuple[type, ...]:
    """Optimizers whose update of an element reads only that element's gradient and state."""
    o, legacy = tf.keras.optimizers, tf.keras.optimizers.legacy
    return (o.SGD, o.Adam, o.AdamW, o.RMSprop, o.Adagrad, o.Adadelta, o.Adamax, o.Nadam, o.Ftrl,
            o.Lion, legacy.SGD, legacy.Adam, legacy.RMSprop, legacy.Adagrad, legacy.Adadelta,
            legacy.Adamax, legacy.Nadam, legacy.Ftrl)


def split_update_problem(opt: Any, strategy: str) -> str | None:
    """Why ``opt``'s update cannot be applied in parts (a bucket at a time) exactly, or None:
    Keras 2.11+'s Nadam (``_NADAM``)."""
    if type(opt) is tf.keras.optimizers.Nadam:
        return _NADAM.format(strategy=strategy)
    return None


def generation_problem(opt: Any, strategy: str, *, shards: bool = False,
                       splits: bool = False) -> str | None:
    """What this Keras generation cannot run of ``strategy`` (sharding, applying the update in
    parts) with ``opt``: nothing on Keras 2."""
    return None


def wrap_for_mixed_precision(opt: Any) -> Any:
    """The optimizer to wrap: ``opt`` itself (Keras 2's ``compile`` puts its loss-scale
    optimizer around the distributed one, and that one asks it for global gradients)."""
    return opt


def outside_loss_scale_problem(opt: Any) -> str | None:
    """Why ``opt`` cannot run inside a loss-scale optimizer ``compile`` added: never on Keras 2."""
    return None


def plain_apply(parent: Any) -> Callable[..., Any]:
    """The plain optimizer's update (``parent``: a ``super()``): ``apply_gradients(pairs)``."""
    return parent.apply_gradients


# -- variables -------------------------------------------------------------------------------------

def var_key(v: Any) -> Any:
    """A hashable key of a variable's identity (``Variable.ref()``)."""
    return v.ref()


def var_name(v: Any) -> str:
    """A variable's unique name, ``<layer path>/<name>:0`` (``layer_of`` splits it)."""
    return v.name


def tf_variable(v: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a Keras variable: the variable itself on Keras 2."""
    return v


def read_value(v: Any) -> tf.Tensor:
    """The variable's value now (a read ordered after earlier assignments in the function)."""
    return v.read_value()


#: Methods and properties of the plugin's own classes that keep a private name because Keras,
#: TensorFlow or Horovod call them by it (their bodies call this module): (class, name, caller).
HOOK_NAMES: tuple[tuple[str, str, str], ...] = SHARED_HOOK_NAMES + (
    ("DistributedMixin", "_apply_weight_decay", "Keras 2.11+ Optimizer.apply_gradients"),
    ("DistributedMixin", "_compute_gradients", "legacy Optimizer.minimize; Horovod's name"),
)


# -- the optimizer's class and Keras's hooks -----------------------------------------------------


def is_legacy_optimizer(opt: Any) -> bool:
    """True for ``tf.keras.optimizers.legacy`` optimizers (OptimizerV2: ``add_slot`` slots,
    ``_hyper`` hyperparameters), False for the Keras 2.11+ ones (slots in ``variables``)."""
    return isinstance(opt, tf.keras.optimizers.legacy.Optimizer)


def legacy_compute_gradients(parent: Any) -> Callable[..., Any] | None:
    """The legacy optimizers' ``_compute_gradients`` (which their ``minimize`` calls), bound
    to ``parent`` (a ``super()``); None on Keras 2.11+ optimizers, which have none."""
    return getattr(parent, "_compute_gradients", None)


def plain_weight_decay(parent: Any) -> Callable[[Sequence[tf.Variable]], Any] | None:
    """Keras 2.11+ ``Optimizer._apply_weight_decay`` (decoupled decay, called by
    ``apply_gradients`` before the update) of ``parent`` (a ``super()``); None on legacy ones."""
    return getattr(parent, "_apply_weight_decay", None)


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


def slot_of(v: tf.Variable, owners: Collection[str]) -> tuple[str, str] | None:
    """(slot name, owner) of a Keras 2.11+ optimizer variable named
    ``[<optimizer>/]<slot>/<owner>`` if ``owner`` is one of ``owners`` (``shared_name``s),
    else None."""
    prefix, _, var_name = v.name.split(":")[0].rpartition("/")
    return (prefix.rpartition("/")[2], var_name) if var_name in owners else None


def make_variable(value: np.ndarray, name: str) -> tf.Variable:
    """A variable the plugin keeps (a parameter slice, a stand-in): a ``tf.Variable``."""
    return tf.Variable(value, trainable=False, name=name)


def head_variables(opt: Any) -> list[tf.Variable]:
    """The Keras 2.11+ optimizer's variables before its slots (``save_own_variables``'s
    layout): ``iterations``."""
    return [opt.iterations]


def slot_variables(opt: Any) -> list[tf.Variable]:
    """A built Keras 2.11+ optimizer's variables after ``head_variables``: ``variables`` lists
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


def carry_weight_decay_exclusions(source: Any, target: Any) -> None:
    """What ``exclude_from_weight_decay`` set on ``source`` (variables, names), onto
    ``target``: ``get_config`` leaves it out, so a copy made ``from_config`` (stock Horovod's
    wrapper is one) would decay every variable."""
    names = getattr(source, "_exclude_from_weight_decay_names", None)
    if names or getattr(source, "_exclude_from_weight_decay", None):
        target.exclude_from_weight_decay(var_list=list(source._exclude_from_weight_decay),
                                         var_names=list(names or []))


def uses_weight_decay(opt: Any, var: tf.Variable) -> bool:
    """Keras 2.11+ ``_use_weight_decay``: False for variables excluded from decoupled weight
    decay (``exclude_from_weight_decay``, by identity or name)."""
    return opt._use_weight_decay(var)


def momentum_schedule(opt: Any, variables: Sequence[tf.Variable]) -> tf.Variable | None:
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


# -- graphs and layers ----------------------------------------------------------------------------

def is_plain_dense(layer: Any) -> bool:
    """True for a ``Dense`` layer whose ``call`` is Keras 2's own (the factor exchange replaces
    that ``call`` with one computing the same, so a subclass's own ``call`` is left alone)."""
    return isinstance(layer, tf.keras.layers.Dense) and \
        type(layer).call is tf.keras.layers.Dense.call


def all_layers(model: Any) -> list[Any]:
    """``model`` and every layer inside it, nested ones too (``tf.Module.submodules``)."""
    return [model, *model.submodules]


def compute_dtype_object(layer: Any) -> tf.DType:
    """``Layer._compute_dtype_object``: the ``tf.DType`` Keras casts a layer's inputs to in
    ``__call__`` (the exchanged ``Dense`` call does the same cast itself)."""
    return layer._compute_dtype_object




# -- Horovod ---------------------------------------------------------------------------------------
