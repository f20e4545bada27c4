"""Benchmark settings, validated before anything is launched."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from hvd_overlap.core.choice import Auto
from hvd_overlap.core.spelling import parse

#: The baseline: real ``horovod.tensorflow.keras.DistributedOptimizer``, run in processes that
#: never import the plugin's runtime.
STOCK = "stock"
#: The compute-only bound: the same training with the plain, unwrapped optimizer.
LOCAL = "local"
#: What runs in the clean processes (the others run in processes with the plugin loaded).
CLEAN = (STOCK, LOCAL)
MODEL_NAMES = ("vgg", "resnet20", "resnet56", "mlp", "cnn", "text")
#: ``strategy="auto"``: measured when asked for (``--strategies ...,auto``), not by default
AUTO = Auto.name
#: ``NAME#K`` in ``--strategies`` (K >= 2): another, independent entry of the fixed strategy
#: NAME, launched and timed as NAME is -- ``stock,stock#2`` measures the bench's own noise (an
#: A/A control: the same code in two entries, so any ratio between them is the machine's).
REPLICA = "#"
#: the longest epoch of a ``--whole-fit`` run (its fit flushes at every epoch's end, as a user's)
FIT_EPOCH_STEPS = 100


def base_name(name: str) -> str:
    """The strategy a bench entry runs: ``stock#2`` -> ``stock`` (other names unchanged)."""
    return name.split(REPLICA, 1)[0]


def plugin_options(name: str) -> tuple[str, dict[str, object]]:
    """A bench strategy name as ``DistributedOptimizer``'s strategy and extra keywords, read by
    the plugin's one strategy parser (``hvd_overlap.core.spelling.parse``:
    ``sharded+exchange+alltoall`` -> ``"sharded"``, ``exchange="auto"``,
    ``gather_with="alltoall"``; a replica's ``#K`` dropped; ``stock``/``local`` as they are).
    Raises ValueError for an unknown strategy or option, or one the strategy has no use for."""
    base = base_name(name)
    if base in CLEAN:
        return base, {}
    try:
        chosen = parse(base)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--strategies {name}: {e}") from None
    return chosen.name, chosen.keywords()


def keras_generation() -> int:
    """2 or 3: the Keras generation ``tf.keras`` is in this process (read from the package it
    resolves to, without importing the plugin)."""
    import sys

    import tensorflow as tf

    package = sys.modules.get(tf.keras.__name__.split(".")[0])
    return 3 if str(getattr(package, "__version__", "2")).startswith("3") else 2


#: what the report says where ``stock`` ran the plugin's stand-in (Keras 3)
STAND_IN = ("stock on Keras 3 is a stand-in: the plugin's `horovod` strategy (stock's fusion "
            "through the plugin), because Horovod's own Keras optimizer averages no gradients "
            "on Keras 3; docs/keras3.md gives how far that stand-in is from real stock on "
            "Keras 2")


def is_clean_group(strategies: Iterable[str]) -> bool:
    """True if these strategies all run in the clean (plugin-free) baseline process."""
    return {base_name(s) for s in strategies} <= set(CLEAN)


def _check_replica(name: str, strategies: tuple[str, ...]) -> None:
    """Raise ValueError for a malformed replica entry (``NAME#K``)."""
    if REPLICA not in name:
        return
    base, k = name.split(REPLICA, 1)
    if not k.isdigit() or int(k) < 2:
        raise ValueError(f"--strategies {name}: a replica is NAME#K with K >= 2 (stock#2)")
    if base == AUTO or plugin_options(base)[1].get("bucket_bytes") == AUTO:
        raise ValueError(f"--strategies {name}: replicas are for fixed strategies; auto "
                         "settles once per launch (compare it with stock#2 instead)")
    if base not in strategies:
        raise ValueError(f"--strategies {name}: list {base} too (the replica is its control)")


def all_strategies() -> tuple[str, ...]:
    """``stock``, every strategy of ``hvd_overlap.STRATEGIES`` (read at run time), ``local``."""
    from hvd_overlap import STRATEGIES

    return (STOCK, *STRATEGIES, LOCAL)


@dataclass(frozen=True)
class BenchConfig:
    """What to measure. ``batch_size`` is per rank; ``steps`` are timed per round and strategy,
    after ``warmup`` untimed ones; ``net`` is ``plain`` (this machine's loopback, unshaped) or a
    tc rate (``1gbit``) of the emulated network ``net_model`` (``hosts`` or ``loopback``, see
    ``benchmarks.netns``). ``one_per_launch``: every strategy in a launch of its own
    (otherwise the plugin's strategies share one launch per round, and stock and local
    another). ``history``: untimed steps every strategy trains, in fits of 10, before its timed
    ones -- as ``auto`` does while it chooses (its choice counts towards them) --, so that every
    strategy is timed at the same age of its process. ``regime``: the regime asked for with
    ``--regime`` (``net`` is then the rate chosen for it, see ``benchmarks.regime``).
    ``whole_fit``: steps of one fit every strategy trains first, in its fresh process (epochs of
    at most ``FIT_EPOCH_STEPS``), timed end to end -- tracing and ``auto``'s settling included,
    what a user waits for -- before its steady steps are timed."""

    model: str = "vgg"
    np: int = 2
    batch_size: int = 64
    steps: int = 10
    warmup: int = 2
    rounds: int = 3
    strategies: tuple[str, ...] = field(default_factory=all_strategies)
    net: str = "plain"
    net_model: str = "hosts"
    pin: bool = True
    tiny: bool = False
    seed: int = 0
    timeout: float = 1800.0
    one_per_launch: bool = False
    history: int = 0
    regime: float | None = None
    whole_fit: int = 0

    def validate(self) -> BenchConfig:
        """Raise ValueError naming the bad setting; return self."""
        from benchmarks.netns import parse_net

        if self.model not in MODEL_NAMES:
            raise ValueError(f"--model {self.model!r}: choose one of {', '.join(MODEL_NAMES)}")
        for name in ("np", "batch_size", "steps", "warmup", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.timeout <= 0:
            raise ValueError("--timeout must be positive")
        if self.regime is not None and not self.regime > 0:
            raise ValueError("--regime is stock's wire time / the compute-only step: a "
                             "positive number")
        if self.whole_fit < 0:
            raise ValueError("--whole-fit is a number of steps: 0 (none) or more")
        if self.whole_fit and not self.one_per_launch:
            raise ValueError("--whole-fit times a fit from a fresh process, as a user's: add "
                             "--one-per-launch")
        if self.history < 0:
            raise ValueError("--history is a number of untimed steps: 0 or more")
        known = (*all_strategies(), AUTO)
        unknown = [s for s in self.strategies if plugin_options(s)[0] not in known]
        if unknown or not self.strategies:
            raise ValueError(f"--strategies {','.join(unknown) or '(empty)'}: choose from "
                             f"{', '.join(known)} (with +OPTIONs: hvd_overlap.core.choice)")
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError("--strategies: a strategy is named twice (a second entry of "
                             "the same strategy is NAME#2)")
        for s in self.strategies:
            _check_replica(s, self.strategies)
        parse_net(self.net)
        from benchmarks.netns import NET_MODELS

        if self.net_model not in NET_MODELS:
            raise ValueError(f"--net-model {self.net_model!r}: choose one of "
                             f"{', '.join(NET_MODELS)}")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        d = json.loads(text)
        d["strategies"] = tuple(d["strategies"])
        return cls(**d)
