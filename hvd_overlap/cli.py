"""``hvd-overlap``: inspect plans and Horovod timelines from the command line."""

from __future__ import annotations

import click

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
def timeline(timeline_file: str, limit: int) -> None:
    """List the collectives of a Horovod timeline in the order they ran, with their times."""
    from hvd_overlap.timeline import merge_groups, read_timeline

    trips = merge_groups(read_timeline(timeline_file))
    if not trips:
        raise click.ClickException(f"{timeline_file}: no completed collectives in this timeline")
    t0 = trips[0].enqueued
    click.echo(f"{'start_ms':>9} {'wait_ms':>8} {'comm_ms':>8}  {'op':<10} tensor")
    for c in trips[:limit]:
        click.echo(f"{(c.start - t0) / 1e3:>9.2f} {(c.start - c.enqueued) / 1e3:>8.2f} "
                   f"{(c.end - c.start) / 1e3:>8.2f}  {c.op:<10} {c.tensor}")
    total = sum(c.end - c.start for c in trips) / 1e3
    click.echo(f"{len(trips)} collectives, {total:.1f} ms on the wire in all")
