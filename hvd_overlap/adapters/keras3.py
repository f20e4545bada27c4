"""Keras 3's internals (``keras`` 3 on TensorFlow, what ``tf.keras`` is on TF >= 2.16 without
``TF_USE_LEGACY_KERAS``), behind the interface of ``keras2``; ``adapters/__init__`` picks one at
import. Each function names one internal, says what Keras 3 does there and why the plugin needs
it; ``tests/test_compat.py`` asserts the version and the attributes used here.

How Keras 3 differs for the plugin, and what follows:
- Every update goes through ``Optimizer.apply(grads, variables)`` (``apply_gradients`` calls it;
  so do the loss-scale optimizer and custom loops): the generated class takes ``apply`` too
  (``ENTRY_METHODS``), and the plain update is the parent's ``apply``.
- Variables are ``keras.Variable`` (no ``ref()``; a short ``name``, the unique one is ``path``),
  each over a ``tf.Variable`` (``.value``): ``var_key``, ``var_name``, ``tf_variable``.
- The loss-scale optimizer decides on the gradients it is given whether a step is skipped, so
  it must see global gradients: it goes inside the distributed optimizer (``compile`` then does
  not add its own), never around it.
- The sharded update's slices are ``keras.Variable`` s, so that the optimizer builds their slots
  (named ``<slice path>_<slot>``); ``head_variables`` (iteration, learning rate) lead the
  ``.keras`` layout.
- The dense factor exchange replaces Keras 3's ``Dense.call`` (``is_plain_dense``), which Keras
  calls with a ``training`` argument.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

# the shared half of the interface (``common.__all__``), re-exported
from hvd_overlap.adapters.common import *  # noqa: F403
from hvd_overlap.adapters.common import SHARED_HOOK_NAMES
from hvd_overlap.adapters.generation import other_generation_message

# the optimizer slots of the sharded update's slices, re-exported
from hvd_overlap.adapters.keras3_slots import *  # noqa: F403

#: the Keras generation this adapter serves
GENERATION = 3
#: the Keras 3 releases this adapter was checked with (with TensorFlow 2.18):
#: ``tests/test_compat.py`` fails on any other
KERAS_VERSIONS: tuple[str, ...] = ("3.15",)

#: Methods and properties of the plugin's own classes that keep a private name because Keras,
#: TensorFlow or Horovod call them by it (their bodies call this module): (class, name, caller).
HOOK_NAMES: tuple[tuple[str, str, str], ...] = SHARED_HOOK_NAMES + (
    ("DistributedMixin", "_apply_weight_decay", "Keras 3 Optimizer.apply"),
    ("DistributedMixin", "_compute_gradients", "Horovod's name (Keras 3 never calls it)"),
)

_NADAM_SHARDED = (
    "Keras 3's Nadam keeps its momentum-schedule product in a variable beside its slots, which "
    "the sharded update's per-slice state does not hold; use Adam (or another element-wise "
    "optimizer) with strategy {strategy!r}, or Nadam with strategy='hybrid', 'deferred' or "
    "'layerwise'")
_LOSS_SCALE_PARTS = (
    "with mixed precision on Keras 3 the loss-scale optimizer decides, on the gradients of one "
    "apply call, whether the step is skipped and how the scale moves; strategy {strategy!r} "
    "applies a step in parts, which would decide once per part. Use strategy='layerwise' or "
    "'horovod' with mixed_float16 (or train with tf-keras, where every strategy runs it)")


def _apply_entry(self: Any, grads: Sequence[Any], trainable_variables: Any = None) -> Any:
    """``Optimizer.apply`` of the generated class: the distributed update
    (``DistributedMixin.apply_gradients``), after refusing a loss-scale optimizer around it."""
    problem = outside_loss_scale_problem(self)
    if problem:
        raise ValueError(problem)
    if trainable_variables is None:
        trainable_variables = self._trainable_variables  # Keras 3's list once built
    return self.apply_gradients(zip(grads, trainable_variables, strict=True))


#: methods the generated optimizer class adds besides ``DistributedMixin``'s: ``apply``, the
#: one door of every Keras 3 update (``fit``'s ``apply_gradients``, custom loops, an outer
#: loss-scale optimizer)
ENTRY_METHODS: dict[str, Callable[..., Any]] = {"apply": _apply_entry}


# -- what the plugin accepts --------------------------------------------------------------------

def optimizer_problem(opt: Any) -> str | None:
    """Why ``opt`` cannot be wrapped (not a Keras 3 optimizer), or None."""
    if isinstance(opt, keras.optimizers.Optimizer):
        return None
    return other_generation_message(opt, GENERATION) or (
        f"expected a Keras optimizer (keras.optimizers.*), got {type(opt).__name__}")


def optimizer_classes(legacy: bool = False) -> dict[str, type]:
    """The optimizer classes by name (SGD, Adam, ...) of ``keras.optimizers``, with the
    loss-scale optimizer (the one ``wrap_for_mixed_precision`` puts inside); Keras 3 has no
    legacy family (``legacy`` is refused, naming the fix)."""
    if legacy:
        raise ValueError("legacy_opts=True: Keras 3 has no legacy optimizers; drop it")
    o = keras.optimizers
    return {name: c for name, c in vars(o).items()
            if isinstance(c, type) and issubclass(c, o.Optimizer) and c is not o.Optimizer}


def element_wise_optimizers() -> tuple[type, ...]:
    """Optimizers whose update of an element reads only that element's gradient and state."""
    o = keras.optimizers
    return (o.SGD, o.Adam, o.AdamW, o.RMSprop, o.Adagrad, o.Adadelta, o.Adamax, o.Nadam, o.Ftrl,
            o.Lion)


def split_update_problem(opt: Any, strategy: str) -> str | None:
    """Why ``opt``'s update cannot be applied in parts exactly, or None: Keras 3's Nadam keeps
    its momentum-schedule product in a variable (``momentum_schedule``), so it can."""
    return None


def generation_problem(opt: Any, strategy: str, *, shards: bool = False,
                       splits: bool = False) -> str | None:
    """What Keras 3 cannot run of ``strategy`` (sharding, applying the update in parts) with
    ``opt``: Nadam's sharded update, and a split update under a loss-scale
    optimizer."""
    if shards and isinstance(opt, keras.optimizers.Nadam):
        return _NADAM_SHARDED.format(strategy=strategy)
    if splits and isinstance(opt, keras.optimizers.LossScaleOptimizer):
        return _LOSS_SCALE_PARTS.format(strategy=strategy)
    return None


def wrap_for_mixed_precision(opt: Any) -> Any:
    """The optimizer to wrap: under a ``mixed_float16`` global policy, ``opt`` inside a
    ``LossScaleOptimizer`` (which ``compile`` would otherwise put around the distributed one,
    where it would decide on one rank's gradients: ranks would disagree on skipping a step)."""
    policy = keras.mixed_precision.dtype_policy()
    if policy.name == "mixed_float16" and \
            not isinstance(opt, keras.optimizers.LossScaleOptimizer):
        return keras.optimizers.LossScaleOptimizer(opt)
    return opt


def outside_loss_scale_problem(opt: Any) -> str | None:
    """Why ``opt`` cannot be updated now: a ``LossScaleOptimizer`` around it (``compile`` adds
    one to a ``mixed_float16`` model whose optimizer is not one) is calling its ``apply``."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        caller = frame.f_locals.get("self")
        if isinstance(caller, keras.optimizers.LossScaleOptimizer) and \
                getattr(caller, "inner_optimizer", None) is opt:
            return ("a LossScaleOptimizer wraps the hvd_overlap DistributedOptimizer (compile "
                    "adds one for a mixed_float16 model): it would decide on one rank's "
                    "gradients whether to skip a step, and ranks would disagree. Wrap it the "
                    "other way round: DistributedOptimizer(keras.optimizers."
                    "LossScaleOptimizer(opt)), or set the mixed_float16 policy before creating "
                    "the DistributedOptimizer (it then adds the loss-scale optimizer inside)")
        frame = frame.f_back
    return None


def plain_apply(parent: Any) -> Callable[..., Any]:
    """The plain optimizer's update (``parent``: a ``super()``) as ``apply(pairs)``."""
    def apply(pairs: Sequence[tuple[Any, Any]], *args: Any, **kwargs: Any) -> Any:
        pairs = list(pairs)
        return parent.apply([g for g, _ in pairs], [v for _, v in pairs])
    return apply


def is_legacy_optimizer(opt: Any) -> bool:
    """Keras 3 has no legacy optimizers."""
    return False


def legacy_compute_gradients(parent: Any) -> Callable[..., Any] | None:
    """None: Keras 3 optimizers compute no gradients."""
    return None


def plain_weight_decay(parent: Any) -> Callable[[Sequence[Any]], Any] | None:
    """``Optimizer._apply_weight_decay`` of ``parent`` (a ``super()``): decoupled decay, which
    ``apply`` runs before the update."""
    return getattr(parent, "_apply_weight_decay", None)


# -- variables -------------------------------------------------------------------------------------

def tf_variable(v: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a ``keras.Variable`` (``value``); a ``tf.Variable`` itself."""
    return v.value if isinstance(v, keras.Variable) else v


def read_value(v: Any) -> tf.Tensor:
    """The variable's value now (its ``tf.Variable``'s read, ordered after earlier assignments
    in the function; ``keras.Variable`` has no ``read_value``)."""
    return tf_variable(v).read_value()


def var_key(v: Any) -> Any:
    """A hashable key of a variable's identity: its ``tf.Variable``'s ``ref()``."""
    return tf_variable(v).ref()


def var_name(v: Any) -> str:
    """A variable's unique name, ``<layer path>/<name>`` (``keras.Variable.path``)."""
    return v.path if isinstance(v, keras.Variable) else v.name


def momentum_schedule(opt: Any, variables: Sequence[Any]) -> Any:
    """Keras 3 Nadam's momentum-schedule product ``_u_product``, which every ``apply`` call
    advances (made by ``build``); None for other optimizers."""
    if not isinstance(opt, keras.optimizers.Nadam):
        return None
    return getattr(opt, "_u_product", None)


def hyper_variables(opt: Any) -> list[Any]:
    """The variables holding hyperparameters a callback may change between steps: the learning
    rate (``_learning_rate``, a variable unless it is a schedule)."""
    lr = getattr(opt, "_learning_rate", None)
    return [lr] if isinstance(lr, keras.Variable | tf.Variable) else []


def carry_weight_decay_exclusions(source: Any, target: Any) -> None:
    """What ``exclude_from_weight_decay`` set on ``source`` (variable keys, a name pattern),
    onto ``target``: ``get_config`` leaves it out, so a copy made ``from_config`` would decay
    every variable."""
    if hasattr(source, "_exclude_from_weight_decay"):
        target._exclude_from_weight_decay = set(source._exclude_from_weight_decay)
        target._exclude_from_weight_decay_pattern = getattr(
            source, "_exclude_from_weight_decay_pattern", None)
        target._exclude_from_weight_decay_cache = {}
    inner = getattr(source, "inner_optimizer", None)  # (a loss-scale optimizer's)
    if inner is not None:
        carry_weight_decay_exclusions(inner, target.inner_optimizer)


def uses_weight_decay(opt: Any, var: Any) -> bool:
    """``_use_weight_decay``: False for variables excluded from decoupled weight decay."""
    return opt._use_weight_decay(var)


# -- graphs and layers ----------------------------------------------------------------------------

def is_plain_dense(layer: Any) -> bool:
    """True for a ``Dense`` layer whose ``call`` is Keras 3's own (``matmul``, bias,
    activation), without LoRA or quantization (their kernels are not one variable): the factor
    exchange replaces that ``call`` with one computing the same."""
    return (isinstance(layer, keras.layers.Dense)
            and type(layer).call is keras.layers.Dense.call
            and not getattr(layer, "lora_enabled", False)
            and getattr(layer, "quantization_mode", None) is None)


def all_layers(model: Any) -> list[Any]:
    """``model`` and every layer inside it, nested ones too (``_flatten_layers``)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def compute_dtype_object(layer: Any) -> tf.DType:
    """The ``tf.DType`` Keras casts a layer's inputs to (``compute_dtype``)."""
    return tf.as_dtype(layer.compute_dtype)
