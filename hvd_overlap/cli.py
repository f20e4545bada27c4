"""``hvd-overlap``: inspect plans and Horovod timelines, and benchmark the strategies."""

from __future__ import annotations

import click

from hvd_overlap.bench.config import MODEL_NAMES, BenchConfig
from hvd_overlap.plan import DEFAULT_BUCKET_BYTES


@click.group()
@click.version_option(package_name="hvd-overlap")
def main() -> None:
    """hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + Keras."""


@main.command()
@click.argument("model_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--strategy", default="layerwise", show_default=True)
@click.option("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES, show_default=True)
def plan(model_file: str, strategy: str, bucket_bytes: int) -> None:
    """Print the communication plan of a saved Keras model (.keras or .h5)."""
    import tensorflow as tf

    from hvd_overlap.reducer import var_specs
    from hvd_overlap.strategies import CommSettings, get_strategy

    model = tf.keras.models.load_model(model_file, compile=False)
    settings = CommSettings(name="plan", op=None, compression=None, bucket_bytes=bucket_bytes)
    click.echo(get_strategy(strategy)(settings).build_plan(
        var_specs(model.trainable_variables)).describe())


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
    from hvd_overlap.timeline import merge_groups, read_timeline
    from hvd_overlap.timeline_report import analyze, format_steps, plot_gantt

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

@main.command()
@click.option("--model", type=click.Choice(MODEL_NAMES), default="vgg", show_default=True)
@click.option("--np", "np_", type=int, default=2, show_default=True, help="ranks (local)")
@click.option("--batch-size", type=int, default=64, show_default=True, help="per rank")
@click.option("--steps", type=int, default=10, show_default=True, help="timed steps per round")
@click.option("--warmup", type=int, default=2, show_default=True, help="untimed steps per round")
@click.option("--rounds", type=int, default=3, show_default=True,
              help="interleaved rounds (every strategy once per round)")
@click.option("--strategies", help="comma-separated; default: every strategy, then local")
@click.option("--net", default="plain", show_default=True,
              help="plain loopback, or an emulated link rate such as 1gbit, 500mbit (root)")
@click.option("--no-pin", is_flag=True, help="do not pin each rank to its own core(s)")
@click.option("--tiny", is_flag=True, help="widths / 16 (smoke tests)")
@click.option("--timeout", type=float, default=1800, show_default=True,
              help="seconds before the launch is stopped")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write numbers here")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="bar chart (.png)")
def bench(model: str, np_: int, batch_size: int, steps: int, warmup: int, rounds: int,
          strategies: str | None, net: str, no_pin: bool, tiny: bool, timeout: float,
          json_path: str | None, plot_path: str | None) -> None:
    """Measure every strategy (and `local`, no communication) in one interleaved run."""
    from hvd_overlap.bench import launch, report

    fields = {"strategies": tuple(s.strip() for s in strategies.split(",") if s.strip())
              } if strategies is not None else {}
    try:
        cfg = BenchConfig(model=model, np=np_, batch_size=batch_size, steps=steps,
                          warmup=warmup, rounds=rounds, net=net, pin=not no_pin, tiny=tiny,
                          timeout=timeout, **fields).validate()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    click.echo(f"bench: {', '.join(cfg.strategies)} on {cfg.model}, {cfg.np} ranks, "
               f"net {cfg.net} ...", err=True)
    try:
        raw = launch.run_bench(cfg, lambda line: click.echo(f"  {line}", err=True))
    except (launch.BenchError, RuntimeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if raw is None:
        return  # a rank other than 0 (already under horovodrun)
    summary = report.summarize(raw)
    click.echo(report.headline(raw))
    click.echo(report.format_table(summary))
    if json_path:
        report.write_json(json_path, raw, summary)
    if plot_path:
        report.plot(plot_path, {f"{model}, net {net}, {batch_size}/rank": summary})
