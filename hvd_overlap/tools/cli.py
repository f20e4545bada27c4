"""``hvd-overlap``: check the stack (``doctor``), inspect plans and Horovod timelines, profile
models, measure a cluster's collective costs (``calibrate``) and predict the strategies' step
times on a cluster (``simulate``); the last three and ``doctor`` live in modules of their own.
(The benchmarks are the repository's own lab, ``python -m benchmarks``, not in the package.)"""

from __future__ import annotations

import click

from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES
from hvd_overlap.tools.calibrate_command import calibrate
from hvd_overlap.tools.doctor import doctor
from hvd_overlap.tools.simulate_command import simulate


@click.group()
@click.version_option(package_name="hvd-overlap")
def main() -> None:
    """hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + Keras."""


@main.command()
@click.argument("model_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--strategy", default="layerwise", show_default=True,
              help="a strategy in the plugin's spelling: NAME[+OPTION...], e.g. "
                   "sharded+exchange+rows, hybrid+defer=2+bucket=8M")
@click.option("--bucket-bytes", type=int, default=None,
              help=f"the bucket budget (default {DEFAULT_BUCKET_BYTES}; or +bucket=N)")
@click.option("--exchange", type=click.Choice(["never", "auto", "always"]), default="never",
              show_default=True, help="sharded: the dense factor exchange (or +exchange)")
@click.option("--exchange-forward", type=click.Choice(["auto", "gather", "rows"]),
              default="auto", show_default=True,
              help="with --exchange: the exchanged kernels' forward (or +gather, +rows)")
@click.option("--np", "ranks", type=int, default=2, show_default=True,
              help="ranks (the exchange's choice)")
@click.option("--batch-size", type=int, default=32, show_default=True,
              help="per rank (the exchange's choice; each dense layer taken as called once)")
def plan(model_file: str, strategy: str, bucket_bytes: int | None, exchange: str,
         exchange_forward: str, ranks: int, batch_size: int) -> None:
    """Print the communication plan of a saved Keras model (.keras or .h5)."""
    import tensorflow as tf

    from hvd_overlap.comm.planner import var_specs
    from hvd_overlap.core.exchange import NEVER, DenseShape
    from hvd_overlap.core.spelling import resolve

    try:
        chosen = resolve(strategy, bucket_bytes=bucket_bytes or DEFAULT_BUCKET_BYTES,
                         exchange=exchange, exchange_forward=exchange_forward)
    except (TypeError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    if chosen.tuned:
        raise click.UsageError(f"{chosen.spec()}: 'auto' settings are chosen while training; "
                               "name the plan to print (e.g. --strategy hybrid+bucket=8M)")
    layers = chosen.exchange_modes()[0]
    model = tf.keras.models.load_model(model_file, compile=False)
    kernels: frozenset = frozenset()
    if layers != NEVER:
        from hvd_overlap.adapters import keras_api
        from hvd_overlap.keras.exchange import exchangeable_layers

        kernels = frozenset(keras_api.var_key(la.kernel) for la in exchangeable_layers(model))
    specs = var_specs(model.trainable_variables, exchangeable=kernels)
    built = chosen.label(chosen.build_plan(specs, ranks),
                         {s.index: DenseShape(*s.shape, batch=batch_size)
                          for s in specs if s.exchangeable}, ranks)
    click.echo(built.describe())


@main.command()
@click.argument("timeline_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--limit", type=int, default=40, show_default=True, help="rows to print")
@click.option("--per-step", type=int, default=None,
              help="collectives per step (default: a step is one occurrence of every name)")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Gantt chart of the first steps (.png)")
@click.option("--plot-steps", type=int, default=4, show_default=True, help="steps in the plot")
def timeline(timeline_file: str, limit: int, per_step: int | None, plot_path: str | None,
             plot_steps: int) -> None:
    """List the collectives of a Horovod timeline in the order they ran, with their times, then
    per step: communication time, the part hidden behind backprop, and the order."""
    from hvd_overlap.tools.timeline import merge_groups, read_timeline
    from hvd_overlap.tools.timeline_report import analyze, format_steps, plot_gantt

    trips = merge_groups(read_timeline(timeline_file))
    if not trips:
        raise click.ClickException(f"{timeline_file}: no completed collectives in this timeline")
    if per_step is not None and per_step < 1:
        raise click.UsageError("--per-step must be at least 1")
    t0 = trips[0].enqueued
    click.echo(f"{'start_ms':>9} {'wait_ms':>8} {'comm_ms':>8}  {'op':<10} tensor")
    for c in trips[:limit]:
        click.echo(f"{(c.start - t0) / 1e3:>9.2f} {(c.start - c.enqueued) / 1e3:>8.2f} "
                   f"{(c.end - c.start) / 1e3:>8.2f}  {c.op:<10} {c.tensor}")
    steps = analyze(trips, per_step)
    click.echo("")
    click.echo(format_steps(steps, limit))
    if plot_path:
        plot_gantt(plot_path, steps, plot_steps)
    total = sum(c.end - c.start for c in trips) / 1e3
    comm, hidden = sum(r.comm for r in steps) / 1e3, sum(r.hidden for r in steps) / 1e3
    outside = len(trips) - sum(len(r.collectives) for r in steps)
    click.echo(f"{len(trips)} collectives ({outside} outside steps) in {len(steps)} steps, "
               f"{total:.1f} ms on the wire in "
               f"all; hidden behind backprop {hidden:.1f} of {comm:.1f} ms "
               f"({100 * hidden / comm if comm else 0:.0f}%)")


def _load_model(spec: str, image_size: int):
    """A bench model, a ``tf.keras.applications`` one, or ``module:function`` returning one."""
    import importlib

    from hvd_overlap.tools.flops import APPLICATIONS, build_application
    from hvd_overlap.tools.models import MODELS, build_model

    if spec in MODELS:
        return build_model(spec)
    if spec in APPLICATIONS:
        return build_application(spec, image_size)
    if ":" not in spec:
        raise click.UsageError(f"MODEL {spec!r}: a bench model ({', '.join(MODELS)}), an "
                               f"application ({', '.join(APPLICATIONS)}) or module:function")
    module, func = spec.split(":", 1)
    return getattr(importlib.import_module(module), func)()


@main.command()
@click.argument("model_spec", metavar="MODEL")
@click.option("--batch-size", type=int, default=64, show_default=True, help="per rank")
@click.option("--device-tflops", type=float,
              help="derive compute from FLOPs at this rate (TFLOP/s) instead of measuring here")
@click.option("--image-size", type=int, default=224, show_default=True,
              help="input size of the applications (resnet50, resnet101, vgg16)")
@click.option("--repeats", type=int, default=5, show_default=True, help="steps per median")
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="profile JSON to write")
def profile(model_spec: str, batch_size: int, device_tflops: float | None, image_size: int,
            repeats: int, out_path: str) -> None:
    """Per-layer forward/backward seconds and gradient bytes of MODEL, in forward order.

    MODEL is a bench model (vgg, resnet20, mlp), resnet50 / resnet101 / vgg16 (224x224,
    random weights), or module:function returning a Keras model. Without --device-tflops the
    times are measured on this host (run it as the ranks run: pinned, e.g. `taskset -c 0`,
    with TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS set).
    """
    import os

    import numpy as np

    model = _load_model(model_spec, image_size)
    name = model_spec.rsplit(":", 1)[-1]
    if device_tflops is not None:
        from hvd_overlap.tools.flops import flops_profile

        prof = flops_profile(model, batch_size, device_tflops, name)
    else:
        from hvd_overlap.tools.profile import measured_profile

        shape = (batch_size, *model.input_shape[1:])
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        prof = measured_profile(model, x, repeats, name)
        prof.meta["conditions"] = {
            "cores": sorted(os.sched_getaffinity(0)), **{k: os.environ.get(k) for k in (
                "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}}
    prof.save(out_path)
    click.echo(f"{prof.model}: {len(prof.layers)} layers, {prof.grad_bytes / 2**20:.1f} MiB of "
               f"gradients, compute {prof.compute_s * 1e3:.1f} ms/step at batch "
               f"{prof.batch_size} ({prof.meta['source']}) -> {out_path}")


# the commands kept in modules of their own
for _command in (calibrate, doctor, simulate):
    main.add_command(_command)
