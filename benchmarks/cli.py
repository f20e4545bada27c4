"""``python -m benchmarks``: this repository's experiments -- the benchmark, emulated hosts,
the calibration, the simulator's validation and the docs tables made from bench runs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from benchmarks.config import LOCAL, MODEL_NAMES, BenchConfig
from benchmarks.tta_task import WIDTH


def _runs(paths: tuple[str, ...], page: str | None = None) -> list[dict]:
    """The bench JSON files (``python -m benchmarks bench --json``), in order; with ``page``,
    each with its ``source``: the file as a link from that page."""
    from benchmarks.results import link

    return [{**json.loads(Path(p).read_text()), **({"source": link(p, page)} if page else {})}
            for p in paths]


@click.group()
def main() -> None:
    """The lab of hvd-overlap: benchmarks, emulated networks, calibration, docs tables.
    Run from the repository root (``benchmarks`` is not part of the wheel)."""


@main.command()
@click.option("--model", type=click.Choice(MODEL_NAMES), default="vgg", show_default=True)
@click.option("--np", "np_", type=int, default=2, show_default=True, help="ranks (local)")
@click.option("--batch-size", type=int, default=64, show_default=True, help="per rank")
@click.option("--steps", type=int, default=10, show_default=True, help="timed steps per round")
@click.option("--warmup", type=int, default=2, show_default=True, help="untimed steps per round")
@click.option("--rounds", type=int, default=3, show_default=True,
              help="interleaved rounds (every strategy once per round)")
@click.option("--strategies", help="comma-separated; default: every strategy, then local; "
                                       "add auto for strategy='auto' (it chooses before timing); "
                                       "a strategy is spelled as the plugin spells it, options "
                                       "after '+' (sharded+exchange+rows, hybrid+defer=2, "
                                       "layerwise+auto: bucket_bytes='auto'); "
                                       "NAME#2 is a second, independent entry of a fixed "
                                       "strategy (stock,stock#2: the bench's own noise)")
@click.option("--net", help="plain loopback (the default), or an emulated link rate such as "
                             "1gbit, 500mbit (root)")
@click.option("--regime", type=float,
              help="instead of --net: measure the compute-only step, then emulate the link "
                   "rate at which stock's gradient bytes take REGIME times it on the wire "
                   "(root)")
@click.option("--net-model", type=click.Choice(["hosts", "loopback"]), default="hosts",
              show_default=True, help="emulated network: one namespace per rank on a switch, "
              "full-duplex links (hosts), or every rank on one shaped loopback (loopback)")
@click.option("--no-pin", is_flag=True, help="do not pin each rank to its own core(s)")
@click.option("--tiny", is_flag=True, help="widths / 16 (smoke tests)")
@click.option("--one-per-launch", is_flag=True,
              help="every strategy in a launch (process) of its own, as stock's, instead of "
                   "the plugin's strategies sharing one launch per round")
@click.option("--history", type=int, default=0, show_default=True,
              help="untimed steps every strategy trains (fits of 10) before its timed ones, as "
                   "auto does while it chooses: every strategy timed at the same process age")
@click.option("--whole-fit", type=int, default=0, show_default=True,
              help="first train one fit of this many steps (epochs of at most 100) per "
                   "strategy, timed end to end: tracing and auto's settling included "
                   "(needs --one-per-launch)")
@click.option("--timeout", type=float, default=1800, show_default=True,
              help="seconds before the launch is stopped")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write numbers here")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="bar chart (.png)")
@click.option("--timelines", "timeline_dir", type=click.Path(file_okay=False),
              help="keep the Horovod timelines here (STRATEGY.json, from the timeline launches)")
def bench(model: str, np_: int, batch_size: int, steps: int, warmup: int, rounds: int,
          strategies: str | None, net: str | None, regime: float | None, net_model: str,
          no_pin: bool, tiny: bool,
          one_per_launch: bool, history: int, whole_fit: int, timeout: float,
          json_path: str | None,
          plot_path: str | None, timeline_dir: str | None) -> None:
    """Measure every strategy against real stock Horovod (`stock`, in processes that never
    import the plugin) and the compute-only bound (`local`), interleaved."""
    from benchmarks import launch, report

    fields = {"strategies": tuple(s.strip() for s in strategies.split(",") if s.strip())
              } if strategies is not None else {}
    if regime is not None and net is not None:
        raise click.UsageError("--regime chooses the link rate itself: give --net or --regime")
    try:
        cfg = BenchConfig(model=model, np=np_, batch_size=batch_size, steps=steps,
                          warmup=warmup, rounds=rounds, net=net or "plain",
                          net_model=net_model, pin=not no_pin, tiny=tiny,
                          one_per_launch=one_per_launch, history=history, timeout=timeout,
                          regime=regime, whole_fit=whole_fit, **fields).validate()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    chosen: dict | None = None
    if regime is not None:
        cfg, chosen = _at_regime(cfg)
    click.echo(f"bench: {', '.join(cfg.strategies)} on {cfg.model}, {cfg.np} ranks, "
               f"net {cfg.net}{'' if cfg.net == 'plain' else f' ({cfg.net_model})'} ...",
               err=True)
    try:
        raw = launch.run_bench(cfg, lambda line: click.echo(f"  {line}", err=True),
                               timeline_dir)
    except (launch.BenchError, RuntimeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if raw is None:
        return  # a rank other than 0 (already under horovodrun)
    if chosen:
        raw["regime"] = chosen
    summary = report.summarize(raw)
    click.echo(report.headline(raw))
    click.echo(report.format_table(summary, stand_in=bool(raw.get("stock_stand_in"))))
    if (line := report.regime_line(raw, summary)):
        click.echo(line)
    for pick in raw.get("auto_choices", []):
        click.echo(f"auto, round {pick['round'] + 1}: chose {pick['choice']} after "
                   f"{pick['steps']} untimed steps ({pick['seconds']:.1f} s); measured "
                   + ", ".join(f"{k} {v:.1f} ms" for k, v in pick["measured_ms"].items())
                   + "".join(f"; again: {k} {v:.1f} ms"
                             for k, v in pick.get("confirmed_ms", {}).items())
                   + report.model_compute_note(pick.get("model_compute_ms"), raw, summary))
    if (fits := report.whole_fit_lines(raw)):
        click.echo(fits)
    if json_path:
        report.write_json(json_path, raw, summary)
    if plot_path:
        report.plot(plot_path, {f"{model}, net {net}, {batch_size}/rank": summary})


def _at_regime(cfg: BenchConfig) -> tuple[BenchConfig, dict]:
    """``--regime``: measure the compute-only step, choose the rate (``benchmarks.regime``);
    the config at that rate and what was chosen (the JSON's ``regime``)."""
    from dataclasses import replace

    from benchmarks import launch, report
    from benchmarks import regime as reg
    from benchmarks.netns import LOOPBACK, NetnsError, check_requirements
    from hvd_overlap.core.sim.cluster import parse_rate

    try:
        check_requirements()
    except NetnsError as e:
        raise click.ClickException(f"--regime emulates the link: {e}") from None
    click.echo(f"regime {cfg.regime:g}: measuring the compute-only step (local, plain "
               "loopback) ...", err=True)
    try:
        probe = reg.measure_compute_only(cfg, lambda line: click.echo(f"  {line}", err=True))
        compute = report.step_time(probe, LOCAL)
        assert cfg.regime is not None
        rate = reg.regime_rate(cfg.regime, compute, probe["grad_bytes"], probe["ranks"],
                               shared=cfg.net_model == LOOPBACK)
    except (launch.BenchError, RuntimeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    wire = reg.ring_bytes(probe["grad_bytes"], probe["ranks"])
    click.echo(f"regime {cfg.regime:g}: compute-only step {compute * 1e3:.1f} ms, stock sends "
               f"{wire / 2**20:.1f} MiB/rank/step: link rate {rate} "
               f"({parse_rate(rate) * 8 / 1e6:.1f} Mbit/s, link efficiency "
               f"{reg.LINK_EFFICIENCY:g})")
    return replace(cfg, net=rate), {
        "asked": cfg.regime, "rate": rate, "rate_bytes_per_s": parse_rate(rate),
        "probe_compute_s": compute, "stock_bytes_per_rank": wire,
        "link_efficiency": reg.LINK_EFFICIENCY}


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--np", "np_", type=int, default=2, show_default=True, help="emulated hosts")
@click.option("--net", default="1gbit", show_default=True,
              help="link rate of every host (tc syntax), or plain (unshaped)")
@click.option("--no-pin", is_flag=True, help="do not pin rank k to core k mod cores")
@click.option("--timeout", type=float, default=3600, show_default=True,
              help="seconds before every rank is stopped")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def hostrun(np_: int, net: str, no_pin: bool, timeout: float, command: tuple[str, ...]) -> None:
    """Run COMMAND as a Horovod Gloo job on NP emulated hosts (root): one network namespace per
    rank with its own address and host name, on a switch, each link shaped to NET in both
    directions; ranks started through Horovod's rendezvous as horovodrun starts them.

    python -m benchmarks hostrun --np 2 --net 1gbit -- python train.py
    """
    from benchmarks.hostrun import run_on_hosts
    from benchmarks.netns import NetnsError, emulated_hosts, parse_net

    try:
        rate = parse_net(net)
        with emulated_hosts(np_, rate) as hosts:
            code = run_on_hosts(list(command), hosts, timeout=timeout, pin=not no_pin,
                                on_line=lambda line: click.echo(line, nl=False))
    except (NetnsError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if code:
        raise click.ClickException(f"a rank exited with code {code}" if code > 0 else
                                   f"stopped after --timeout {timeout:.0f} s")


@main.command()
@click.option("--net", "nets", multiple=True, default=("plain",), show_default=True,
              help="plain, or an emulated rate such as 1gbit (root); repeat for several")
@click.option("--net-model", type=click.Choice(["hosts", "loopback"]), default="hosts",
              show_default=True, help="emulated network of the rates (see bench)")
@click.option("--np", "ranks", type=int, multiple=True, default=(2,), show_default=True,
              help="rank counts (emulated hosts, or local ranks); repeat for several, 2 "
                   "among them: how the costs grow with the ranks is then fitted")
@click.option("--repeats", type=int, default=9, show_default=True,
              help="collectives timed per size (their median counts)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), required=True)
@click.option("--merge", is_flag=True, help="keep the networks already in the JSON file")
@click.option("--timeout", type=float, default=600, show_default=True)
def calibrate(nets: tuple[str, ...], net_model: str, ranks: tuple[int, ...], repeats: int,
              json_path: str, merge: bool, timeout: float) -> None:
    """Measure Horovod's per-collective costs here (Gloo, pinned): the simulator's
    negotiation, per-tensor cost, bandwidth per collective type and CPU steal per network,
    and with several ``--np`` the laws by which they grow with the ranks.
    Networks are keyed by their label: ``plain``, ``1gbit hosts``, ``1gbit loopback``."""
    from benchmarks import calibrate as cal
    from benchmarks.launch import BenchError
    from benchmarks.netns import parse_net
    from benchmarks.validation import net_key
    from hvd_overlap.core.sim.cluster import parse_rate
    from hvd_overlap.tools.collective_costs import check_file, fit_line, laws_line, record

    counts = sorted(set(ranks))
    if repeats < 1:
        raise click.UsageError("--repeats: at least 1")
    if 2 not in counts or min(counts) < 2:
        raise click.UsageError("--np: rank counts of 2 or more, 2 among them (the laws are "
                               "anchored at 2 ranks)")
    doc = json.loads(Path(json_path).read_text()) if merge and Path(json_path).exists() else {}
    try:
        check_file(doc, json_path)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    command = (f"python -m benchmarks calibrate --net-model {net_model} "
               + " ".join(f"--net {n}" for n in nets) + "".join(f" --np {p}" for p in counts)
               + (f" --repeats {repeats}" if repeats != 9 else "") + f" --json {json_path}"
               + (" --merge" if merge else ""))
    for net in nets:
        key = net_key(net, net_model)
        rate = parse_net(net)
        for p in counts:
            try:
                measured = cal.calibrate(net, timeout, net_model, p, repeats)
            except (BenchError, RuntimeError, ValueError) as e:
                raise click.ClickException(str(e)) from None
            click.echo(f"{key}, {p} ranks: {fit_line(measured['fit'])}")
            doc = record(doc, key, p, measured, None if rate is None else parse_rate(rate))
        if "laws" in doc["nets"][key]:
            click.echo(f"{key}: {laws_line(doc['nets'][key]['laws'])}")
    doc["command"] = "; ".join(c for c in (doc.get("command"), command) if c)
    doc["what"] = ("Horovod over Gloo, pinned, at 2 ranks (a net's 'fit') and at the rank "
                   "counts of its 'ranks', with the laws fitted over them; see "
                   "benchmarks/calibrate.py")
    Path(json_path).write_text(json.dumps(doc, indent=1))


@main.command()
@click.option("--model", type=click.Choice(MODEL_NAMES), default="vgg", show_default=True)
@click.option("--np", "np_", type=int, default=4, show_default=True, help="emulated hosts")
@click.option("--batch-size", type=int, default=32, show_default=True, help="per rank")
@click.option("--steps", type=int, default=10, show_default=True,
              help="timed steps of the compute-only probe")
@click.option("--warmup", type=int, default=5, show_default=True)
@click.option("--regime", type=float, help="choose the rate as bench --regime does")
@click.option("--net", help="instead of --regime: the link rate (tc syntax)")
@click.option("--net-model", type=click.Choice(["hosts", "loopback"]), default="hosts",
              show_default=True)
@click.option("--strategies", default="stock,sharded,sharded+exchange", show_default=True,
              help="bench names; the best allreduce plan (layerwise or hybrid) is always added")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), required=True)
def predict(model: str, np_: int, batch_size: int, steps: int, warmup: int,
            regime: float | None, net: str | None, net_model: str, strategies: str,
            json_path: str) -> None:
    """Predict a bench configuration before measuring it: measure only its compute-only step,
    choose the link, write the simulator's step times (``benchmarks.prediction``) and the bench
    command that measures them."""
    import datetime

    from benchmarks import launch, report
    from benchmarks import prediction as pred
    from benchmarks import regime as reg
    from hvd_overlap.core.sim.cluster import parse_rate

    if (regime is None) == (net is None):
        raise click.UsageError("give --regime or --net")
    names = tuple(x.strip() for x in strategies.split(",") if x.strip())
    try:
        cfg = BenchConfig(model=model, np=np_, batch_size=batch_size, steps=steps,
                          warmup=warmup, rounds=1, strategies=(LOCAL,), net=net or "plain",
                          net_model=net_model, regime=regime).validate()
        probe = reg.measure_compute_only(cfg, lambda line: click.echo(f"  {line}", err=True))
    except (ValueError, launch.BenchError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    compute = report.step_time(probe, LOCAL)
    if regime is not None:
        net = reg.regime_rate(regime, compute, probe["grad_bytes"], probe["ranks"],
                              shared=net_model == "loopback")
    assert net is not None
    try:
        out = pred.predict(model, batch_size, compute, net, np_, net_model, names)
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    strategies_run = ",".join(dict.fromkeys((*names, out["best_allreduce"], LOCAL)))
    wire = reg.ring_bytes(probe["grad_bytes"], probe["ranks"]) / parse_rate(net)
    out = {"format": pred.PREDICTION_FORMAT,
           "made": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "config": {"model": model, "batch_size": batch_size, "np": np_, "net": net,
                      "net_model": net_model},
           "regime_asked": regime, "stock_ideal_wire_over_compute": wire / compute,
           "probe_step_times_s": probe["step_times"][LOCAL], **out,
           "bench_command": f"python -m benchmarks bench --model {model} --np {np_} "
                            f"--batch-size {batch_size} --net {net} --net-model {net_model} "
                            f"--strategies {strategies_run} --one-per-launch"}
    Path(json_path).write_text(json.dumps(out, indent=1))
    click.echo(f"{model} {batch_size}/rank, {np_} ranks, {net} {net_model}: compute-only "
               f"{compute * 1e3:.1f} ms; predicted " + ", ".join(
                   f"{s} {p['step_s'] * 1e3:.0f} ms" for s, p in out["predicted"].items())
               + f"; best allreduce plan {out['best_allreduce']}")
    if (host := pred.host_rate(np_, net_model)) is not None and parse_rate(net) > host:
        click.echo(f"note: {net} is faster than this host carries between {np_} ranks without a "
                   f"limit ({host * 8e-6:.0f} Mbit/s, the calibration's 'plain'): the run's "
                   "regime will be above the one asked; the prediction uses the host's rate",
                   err=True)
    click.echo(f"measure with: {out['bench_command']} --json BENCH.json")


@main.command("gpu-profile")
@click.argument("raw_paths", metavar="RAW.json...", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="folder for the profiles (hvd_overlap/core/profiles ships them)")
def gpu_profile(raw_paths: tuple[str, ...], out_dir: str) -> None:
    """Turn GPU layer timings (``benchmarks/gpu_layers.py``, run on a GPU machine with
    PyTorch) into the simulator's profiles, one per model and precision."""
    from benchmarks.gpu_profile import convert

    try:
        written = convert([Path(p) for p in raw_paths], Path(out_dir))
    except (ValueError, KeyError) as e:
        raise click.ClickException(f"{e}") from None
    for path, prof in written:
        click.echo(f"{prof.model}: {len(prof.layers)} layers, compute "
                   f"{prof.compute_s * 1e3:.2f} ms/step at batch {prof.batch_size} "
                   f"({prof.meta['device']}, {prof.meta['precision']}) -> {path}")


@main.command("check-predictions")
@click.argument("pairs", metavar="PREDICTION.json BENCH.json ...", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False))
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False),
              help="also write the table here")
def check_predictions(pairs: tuple[str, ...], md_path: str | None) -> None:
    """Predictions (``predict``) against the bench runs that measured them, in pairs, with the
    trivial predictor's error beside each row."""
    from benchmarks import prediction as pred

    if len(pairs) % 2:
        raise click.UsageError("give PREDICTION.json BENCH.json pairs")
    rows = []
    for p, b in zip(pairs[::2], pairs[1::2], strict=True):
        d = json.loads(Path(p).read_text())
        if d.get("format") != pred.PREDICTION_FORMAT:
            raise click.ClickException(f"{p}: not written by `python -m benchmarks predict`")
        try:
            rows += pred.check(d, json.loads(Path(b).read_text()))
        except (ValueError, KeyError) as e:
            raise click.ClickException(f"{p} against {b}: {e}") from None
    table = pred.markdown(rows)
    click.echo(table)
    if md_path:
        Path(md_path).write_text(table)


@main.command("auto-grid")
@click.argument("profile_paths", nargs=-1)
@click.option("--np", "np_", default="2-512", show_default=True, help="rank counts")
@click.option("--bandwidth", "bandwidths", default="1gbit,10gbit,25gbit,100gbit",
              show_default=True, help="per-rank link rates, comma-separated")
@click.option("--latency", "latencies", default="2us,10us,50us", show_default=True,
              help="per-hop latencies, comma-separated")
@click.option("--family", type=click.Choice(["every", "whole", "sharded"]), default="every",
              show_default=True, help="every: strategy='auto'; whole: strategy='auto' with an "
                                      "optimizer that cannot be sharded; sharded: "
                                      "strategy='sharded' with bucket_bytes='auto'")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False),
              help="also write the summary table here")
def auto_grid(profile_paths: tuple[str, ...], np_: str, bandwidths: str, latencies: str,
              family: str, md_path: str | None) -> None:
    """What strategy="auto" would choose over a grid of clusters, and its predicted speedup
    over stock Horovod (default PROFILEs: vgg16, resnet50, resnet101)."""
    from benchmarks.validation import lab_profile
    from hvd_overlap.core import autoplan
    from hvd_overlap.tools.simulate_report import cluster_from_options, parse_ranks

    names = profile_paths or ("vgg16", "resnet50", "resnet101")
    try:
        profiles = {n: lab_profile(n) for n in names}
        points = autoplan.grid(
            profiles, parse_ranks(np_), bandwidths.split(","), latencies.split(","),
            lambda p, bw, lat: cluster_from_options(p, bw, lat), family)
    except (ValueError, FileNotFoundError) as e:
        raise click.UsageError(str(e)) from None
    table = autoplan.grid_markdown(points)
    click.echo(table)
    if md_path:
        Path(md_path).write_text(table)


@main.command()
@click.argument("bench_paths", metavar="BENCH.json...", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False))
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False),
              help="also write the table here")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the checks")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="measured against predicted step times (.png)")
@click.option("--calibration", "calibration_path", type=click.Path(exists=True, dir_okay=False),
              help="the calibration file (default: the 2-rank one the validation was made with)")
def validate(bench_paths: tuple[str, ...], md_path: str | None, json_path: str | None,
             plot_path: str | None, calibration_path: str | None) -> None:
    """The simulator's predicted step times against bench runs (``bench --json`` files), with
    this machine's calibration and the bench models' measured profiles:
    ``python -m benchmarks validate benchmarks/results/bench/*.json``."""
    from benchmarks import results, validation

    try:
        table, checks = validation.validation_markdown(
            bench_paths, calibration_path or validation.OVERHEADS)
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise click.ClickException(f"cannot validate: {e}") from None
    click.echo(table)
    if md_path:
        options = " ".join([f"--markdown {md_path}", *([f"--json {json_path}"] if json_path
                                                        else []),
                            *([f"--plot {plot_path}"] if plot_path else [])])
        Path(md_path).write_text(
            "# The simulator's step times against measured ones\n\n" + table
            + results.regenerate("scripts/bench-results", md_path, "python -m benchmarks validate",
                                 bench_paths, options))
    if json_path:
        Path(json_path).write_text(json.dumps([{**c.__dict__, "error": c.error}
                                               for c in checks], indent=1))
    if plot_path:
        validation.plot_validation(plot_path, checks)


_RUNS = click.argument("run_paths", metavar="RUN.json...", nargs=-1, required=True,
                       type=click.Path(exists=True, dir_okay=False))


@main.command("bench-results")
@click.argument("md_path", metavar="OUT.md", type=click.Path(dir_okay=False))
@click.argument("png_path", metavar="OUT.png", type=click.Path(dir_okay=False))
@_RUNS
def bench_results(md_path: str, png_path: str, run_paths: tuple[str, ...]) -> None:
    """The docs table (OUT.md) and bar chart (OUT.png) over bench runs
    (``scripts/bench-results``); each run's ``command`` is quoted."""
    from benchmarks import report, results

    runs = _runs(run_paths)
    Path(md_path).write_text(results.markdown(runs) + results.regenerate(
        "scripts/bench-results", md_path, f"python -m benchmarks bench-results {md_path} "
        f"{png_path}", run_paths))
    report.plot(png_path, {results.label(r["raw"]): r["strategies"] for r in runs})


@main.command("exchange-results")
@click.argument("md_path", metavar="OUT.md", type=click.Path(dir_okay=False))
@_RUNS
def exchange_results(md_path: str, run_paths: tuple[str, ...]) -> None:
    """The dense factor exchange's docs table over bench runs (``scripts/exchange-bench``)."""
    from benchmarks import exchange_results as tables
    from benchmarks.results import regenerate

    Path(md_path).write_text(tables.markdown(_runs(run_paths)) + regenerate(
        "scripts/exchange-bench", md_path, f"python -m benchmarks exchange-results {md_path}",
        run_paths))


@main.command("auto-results")
@click.argument("md_path", metavar="OUT.md", type=click.Path(dir_okay=False))
@_RUNS
def auto_results(md_path: str, run_paths: tuple[str, ...]) -> None:
    """The measured grid of strategy="auto" over bench runs with auto among their strategies
    (``scripts/auto-bench``), with bootstrap intervals of its ratios."""
    from benchmarks import auto_results as tables
    from benchmarks.results import regenerate

    Path(md_path).write_text(tables.markdown(_runs(run_paths, md_path)) + regenerate(
        "scripts/auto-bench", md_path, f"python -m benchmarks auto-results {md_path}",
        run_paths))


@main.command("time-to-accuracy")
@click.option("--regime", type=float, default=2.0, show_default=True,
              help="stock's wire time / the compute-only step, at the small batch")
@click.option("--seeds", default="1,2,3", show_default=True, help="comma-separated")
@click.option("--epochs", type=int, default=24, show_default=True)
@click.option("--timeout", type=float, default=900, show_default=True,
              help="seconds per launch before every rank is stopped")
@click.option("--width", type=int, default=WIDTH, show_default=True,
              help="the MLP's hidden layers (a width x width kernel for the exchange)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="writes time_to_accuracy.json, .md and .png here")
@click.option("--from-json", is_flag=True, help="redraw from OUT/time_to_accuracy.json")
@click.option("--verbose", is_flag=True, help="show every rank's output")
def time_to_accuracy(regime: float, seeds: str, epochs: int, timeout: float, width: int,
                     out_dir: str, from_json: bool, verbose: bool) -> None:
    """Wall time to a target test accuracy on 2 emulated hosts (root): stock Horovod and the
    plugin's strategy="auto", each with the small batch and with batch growth; 3 seeds,
    interleaved launches. Writes the table (.md), the plot (.png) and every run (.json)."""
    from benchmarks import time_to_accuracy as tta
    from benchmarks.netns import NetnsError

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "time_to_accuracy.json"
    if from_json:
        result = json.loads(path.read_text())
    else:
        try:
            result = tta.run(regime, [int(s) for s in seeds.split(",")], epochs, timeout,
                             on_progress=click.echo,
                             on_line=(lambda line: click.echo(line, nl=False)) if verbose
                             else (lambda line: None), width=width)
        except (NetnsError, ValueError, RuntimeError) as e:
            raise click.ClickException(str(e)) from None
        path.write_text(json.dumps(result, indent=1))
    text = tta.markdown(result) + "\n" + tta.prediction(result)
    (out / "time_to_accuracy.md").write_text(text)
    tta.plot(result, out / "time_to_accuracy.png")
    click.echo(text)
