"""``hvd-overlap calibrate``: this job's collective costs, for ``simulate --calibration``."""

from __future__ import annotations

import click


@click.command()
@click.option("--json", "json_path", type=click.Path(dir_okay=False), required=True,
              help="the calibration file: created, or this measurement added to it")
@click.option("--name", "net_name", default="cluster", show_default=True,
              help="the network's name in the file (one file can hold several; simulate "
                   "--calibration-net picks one)")
@click.option("--link", help="the link's nominal rate per rank (25gbit, 100gbit): each "
                             "collective's rate is then kept as a share of it, which "
                             "simulate --bandwidth scales")
@click.option("--repeats", type=int, default=9, show_default=True,
              help="collectives timed per size (their median counts; fewer: quicker)")
def calibrate(json_path: str, net_name: str, link: str | None, repeats: int) -> None:
    """Measure this job's collective costs for `simulate --calibration`: run it under
    `horovodrun -np N` (N >= 2), then again at other rank counts with the same --json
    (2 among them): how the costs grow with the ranks is fitted over them."""
    import json
    from pathlib import Path

    import horovod.tensorflow as hvd

    from hvd_overlap.core.sim.cluster import parse_rate
    from hvd_overlap.tools import collective_costs as cc

    try:  # the same arguments on every rank: each refuses them before any collective
        rate = None if link is None else parse_rate(link)
    except ValueError as e:
        raise click.UsageError(f"--link {link!r}: {e}") from None
    if repeats < 1:
        raise click.UsageError("--repeats: at least 1")
    path = Path(json_path)

    def problem() -> str | None:  # rank 0's file, agreed on by every rank
        if hvd.size() < 2:
            return "run it under horovodrun -np N with N >= 2 (one rank has no collectives)"
        if hvd.rank() != 0:
            return None
        if not path.parent.is_dir():
            return f"--json {json_path}: no folder {path.parent}"
        try:
            cc.check_file(json.loads(path.read_text()) if path.exists() else {}, json_path)
        except (ValueError, json.JSONDecodeError) as e:
            return f"--json {json_path}: {e}"
        return None

    hvd.init()
    why = hvd.broadcast_object(problem(), root_rank=0, name="hvdo.calibrate.check")
    hvd.shutdown()
    if why:
        raise click.UsageError(why)
    measured = cc.measure_cycles(repeats)
    ranks = hvd.size()
    if measured is not None:  # rank 0
        command = (f"horovodrun -np {ranks} hvd-overlap calibrate --json {json_path} --name "
                   f"{net_name}" + (f" --link {link}" if link else "")
                   + (f" --repeats {repeats}" if repeats != 9 else ""))
        old = json.loads(path.read_text()) if path.exists() else {}
        doc = cc.record(old, net_name, ranks, measured, rate, command)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        click.echo(f"{net_name}, {ranks} ranks: {cc.fit_line(measured['fit'])} -> {json_path}")
        laws = doc["nets"][net_name].get("laws")
        if laws:
            click.echo(f"{net_name}, laws over {laws['ranks']} ranks: {cc.laws_line(laws)}")
        elif ranks != 2 and "fit" not in doc["nets"][net_name]:
            click.echo("run it at 2 ranks too: the laws are anchored there")
        else:
            click.echo("run it at another rank count too: the laws need two")
    hvd.shutdown()
