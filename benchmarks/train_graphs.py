"""What each strategy's traced train function holds, side by side: structural evidence that
the machine's load cannot move (docs/auto.md, "After the choice").

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.train_graphs resnet56 \\
        stock horovod auto

For each entry (``stock``: ``hvd.DistributedOptimizer``; ``auto``: settled, with
``OverlapCallback``, on the plan it picks, stock's fusion when nothing is worth a trial; any
other: the plugin's strategy of that name) rank 0 prints the ops of the train function the last
step ran (its graph and the functions nested in it: conds, calls), by type where they differ,
its control edges, and a digest of its structure (ops with the types of their inputs; the
optimizer's name in op names aside): equal digests, the same graph. Needs 2 ranks (the plugin's
dense-layer patching and ``auto``'s link probe run only there).
"""

from __future__ import annotations

import collections
import hashlib
import re
import sys
from typing import Any

import tensorflow as tf

from benchmarks.config import STOCK


class _LastFunction(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.fn = self.model.train_function  # (OverlapCallback forgets it at fit's end)


def train_graph(model_name: str, strategy: str, steps: int = 12, batch: int = 8) -> Any:
    """The graph of the train function the last of ``steps`` steps ran (``auto``: after it
    settled, in a second fit)."""
    import horovod.tensorflow as hvd

    from hvd_overlap.tools.models import build_model, synthetic_batch

    tf.keras.utils.set_random_seed(1)
    model = build_model(model_name)
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    callbacks: list[Any] = [_LastFunction()]
    if strategy == STOCK:
        import horovod.tensorflow.keras as hvd_keras

        opt = hvd_keras.DistributedOptimizer(opt)
    else:
        import hvd_overlap.keras as hk

        opt = hk.DistributedOptimizer(opt, strategy=strategy)
        if opt.defers:
            callbacks.append(hk.OverlapCallback())
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensors(
        synthetic_batch(batch, seed=hvd.rank(), model=model_name)).repeat()
    for _ in range(20):  # auto: fits of ``steps`` until it settled (others: one fit)
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
        if getattr(getattr(opt, "_hvdo", None), "settled", True):
            break
    model.fit(data, epochs=1, steps_per_epoch=3, verbose=0, callbacks=callbacks)
    fn = callbacks[0].fn
    return fn._list_all_concrete_functions()[-1].graph.as_graph_def()


def summary(graph_def: Any) -> dict[str, Any]:
    """Ops by type (the graph and its nested functions), control edges, a structure digest."""
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    ops = collections.Counter(n.op for n in nodes)
    control = sum(i.startswith("^") for n in nodes for i in n.input)
    kinds = {n.name: n.op for n in graph_def.node}
    top = sorted((n.op, tuple(sorted(kinds.get(i.lstrip("^").split(":")[0], "?")
                                     for i in n.input))) for n in graph_def.node)
    nested = sorted(tuple(sorted(n.op for n in f.node_def)) for f in graph_def.library.function)
    collectives = sorted(re.sub(r"^[^/]*_Allreduce", "OPT_Allreduce", n.name)
                         for n in nodes if n.op.startswith("Horovod"))
    digest = hashlib.sha1(repr((top, nested, collectives)).encode()).hexdigest()[:12]
    return {"ops": ops, "control": control, "functions": len(graph_def.library.function),
            "digest": digest}


def main(argv: list[str]) -> None:
    import horovod.tensorflow as hvd

    hvd.init()
    model_name, *strategies = argv
    got = {s: summary(train_graph(model_name, s)) for s in strategies}
    if hvd.rank() != 0:
        return
    for s, g in got.items():
        horovod = {k: c for k, c in g["ops"].items() if k.startswith("Horovod")}
        print(f"{s:10s} {sum(g['ops'].values())} ops ({g['functions']} nested functions), "
              f"{g['control']} control edges, {horovod}, structure {g['digest']}")
    names = sorted(set().union(*(g["ops"] for g in got.values())))
    for op in names:
        counts = [got[s]["ops"][op] for s in strategies]
        if len(set(counts)) > 1:
            print(f"  {op:32s} " + " ".join(f"{c:6d}" for c in counts))


if __name__ == "__main__":
    main(sys.argv[1:])
