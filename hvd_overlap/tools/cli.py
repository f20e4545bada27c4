"""``hvd-overlap``: inspect plans and Horovod timelines, and benchmark the strategies."""

from __future__ import annotations

import click

from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES
from hvd_overlap.core.simulate import STRATEGIES as SIM_STRATEGIES
from hvd_overlap.tools.bench.config import MODEL_NAMES, BenchConfig


@click.group()
@click.version_option(package_name="hvd-overlap")
def main() -> None:
    """hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + Keras."""


@main.command()
@click.argument("model_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--strategy", default="layerwise", show_default=True)
@click.option("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES, show_default=True)
@click.option("--exchange", type=click.Choice(["never", "auto", "always"]), default="never",
              show_default=True, help="sharded: the dense factor exchange")
@click.option("--exchange-forward", type=click.Choice(["auto", "gather", "rows"]),
              default="auto", show_default=True,
              help="with --exchange: the exchanged kernels' forward")
@click.option("--np", "ranks", type=int, default=2, show_default=True,
              help="ranks (the exchange's choice)")
@click.option("--batch-size", type=int, default=32, show_default=True,
              help="per rank (the exchange's choice; each dense layer taken as called once)")
def plan(model_file: str, strategy: str, bucket_bytes: int, exchange: str,
         exchange_forward: str, ranks: int, batch_size: int) -> None:
    """Print the communication plan of a saved Keras model (.keras or .h5)."""
    import tensorflow as tf

    from hvd_overlap.comm.planner import var_specs
    from hvd_overlap.core.exchange import NEVER, DenseShape, label_exchange
    from hvd_overlap.core.strategies import PlanOptions, get_strategy

    if exchange != NEVER and not get_strategy(strategy).shards:
        raise click.UsageError("--exchange is part of the sharded strategies (--strategy sharded "
                               "or sharded_hybrid)")
    model = tf.keras.models.load_model(model_file, compile=False)
    kernels: frozenset = frozenset()
    if exchange != NEVER:
        from hvd_overlap.keras.exchange import exchangeable_layers

        kernels = frozenset(layer.kernel.ref() for layer in exchangeable_layers(model))
    specs = var_specs(model.trainable_variables, exchangeable=kernels)
    built = get_strategy(strategy).build_plan(
        specs, PlanOptions(bucket_bytes, exchange=exchange, exchange_forward=exchange_forward,
                           ranks=ranks))
    if exchange != NEVER:
        built = label_exchange(built, {s.index: DenseShape(*s.shape, batch=batch_size)
                                       for s in specs if s.exchangeable}, exchange, ranks,
                               exchange_forward)
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
                                       "a sharded strategy takes options after '+': exchange, "
                                       "gather, rows, alltoall, auto (bucket_bytes='auto'); "
                                       "NAME#2 is a second, independent entry of a fixed "
                                       "strategy (stock,stock#2: the bench's own noise)")
@click.option("--net", default="plain", show_default=True,
              help="plain loopback, or an emulated link rate such as 1gbit, 500mbit (root)")
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
@click.option("--timeout", type=float, default=1800, show_default=True,
              help="seconds before the launch is stopped")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write numbers here")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="bar chart (.png)")
def bench(model: str, np_: int, batch_size: int, steps: int, warmup: int, rounds: int,
          strategies: str | None, net: str, net_model: str, no_pin: bool, tiny: bool,
          one_per_launch: bool, history: int, timeout: float, json_path: str | None,
          plot_path: str | None) -> None:
    """Measure every strategy against real stock Horovod (`stock`, in processes that never
    import the plugin) and the compute-only bound (`local`), interleaved."""
    from hvd_overlap.tools.bench import launch, report

    fields = {"strategies": tuple(s.strip() for s in strategies.split(",") if s.strip())
              } if strategies is not None else {}
    try:
        cfg = BenchConfig(model=model, np=np_, batch_size=batch_size, steps=steps,
                          warmup=warmup, rounds=rounds, net=net, net_model=net_model,
                          pin=not no_pin, tiny=tiny, one_per_launch=one_per_launch,
                          history=history, timeout=timeout, **fields).validate()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    click.echo(f"bench: {', '.join(cfg.strategies)} on {cfg.model}, {cfg.np} ranks, "
               f"net {cfg.net}{'' if cfg.net == 'plain' else f' ({cfg.net_model})'} ...",
               err=True)
    try:
        raw = launch.run_bench(cfg, lambda line: click.echo(f"  {line}", err=True))
    except (launch.BenchError, RuntimeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if raw is None:
        return  # a rank other than 0 (already under horovodrun)
    summary = report.summarize(raw)
    click.echo(report.headline(raw))
    click.echo(report.format_table(summary))
    for pick in raw.get("auto_choices", []):
        click.echo(f"auto, round {pick['round'] + 1}: chose {pick['choice']} after "
                   f"{pick['steps']} untimed steps ({pick['seconds']:.1f} s); measured "
                   + ", ".join(f"{k} {v:.1f} ms" for k, v in pick["measured_ms"].items())
                   + "".join(f"; again: {k} {v:.1f} ms"
                             for k, v in pick.get("confirmed_ms", {}).items()))
    if json_path:
        report.write_json(json_path, raw, summary)
    if plot_path:
        report.plot(plot_path, {f"{model}, net {net}, {batch_size}/rank": summary})


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

    hvd-overlap hostrun --np 2 --net 1gbit -- python train.py
    """
    from hvd_overlap.tools.hostrun import run_on_hosts
    from hvd_overlap.tools.netns import NetnsError, emulated_hosts, parse_net

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


@main.command()
@click.argument("profile_paths", metavar="[PROFILE]...", nargs=-1)
@click.option("--np", "np_", default="2-4096", show_default=True,
              help="rank counts: 64, 2,8,64, or a power-of-two range 2-4096")
@click.option("--bandwidth", default="25gbit", show_default=True,
              help="per-rank link: 10gbit, 100gbit, or bytes/s")
@click.option("--latency", default="10us", show_default=True, help="per ring hop")
@click.option("--strategies", default=",".join(SIM_STRATEGIES + ("auto",)), show_default=True,
              help="'auto': the fastest predicted whole-state plan; 'auto_sharded': the "
                   "fastest sharded one (hvd-overlap auto-grid); 'sharded+exchange', "
                   "'sharded_hybrid+exchange': with exchange='auto' (the dense factor "
                   "exchange; each dense layer's choice is listed)")
@click.option("--cycle-ms", type=float, default=1.0, show_default=True,
              help="HOROVOD_CYCLE_TIME")
@click.option("--negotiation-ms", type=float,
              help="per-cycle coordination at 2 ranks [default: measured here]")
@click.option("--negotiation-growth", type=click.Choice(["log2", "linear", "none"]),
              default="log2", show_default=True, help="how coordination grows with ranks")
@click.option("--tensor-us", type=float, help="cost per tensor [default: measured here]")
@click.option("--cpu-steal", type=float, default=0.0, show_default=True,
              help="share of compute lost while a transfer runs (0 on GPUs)")
@click.option("--comm-slowdown", type=float, default=1.0, show_default=True,
              help="transfers take this much longer while compute runs (1 on GPUs)")
@click.option("--fusion-mb", type=float, default=128, show_default=True,
              help="HOROVOD_FUSION_THRESHOLD (MiB)")
@click.option("--bucket-mb", type=float, default=4, show_default=True, help="plan bucket_bytes")
@click.option("--defer", type=int,
              help="input-side buckets deferred to the next step by hybrid, sharded and "
                   "sharded_hybrid (-1: all) [default: half the bytes; sharded: all]")
@click.option("--device-tflops", type=float,
              help="re-time FLOPs profiles at this rate (TFLOP/s)")
@click.option("--published", "published", multiple=True, type=float,
              help="a published efficiency at the largest --np, one per PROFILE (plot star)")
@click.option("--validate", is_flag=True,
              help="the arguments are bench JSON files (`hvd-overlap bench --json`): print "
                   "predicted vs measured step times instead")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False),
              help="also write a markdown table here (validation, or efficiency per ranks)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write results")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="efficiency against ranks, one panel per PROFILE (.png)")
def simulate(profile_paths: tuple[str, ...], np_: str, bandwidth: str, latency: str,
             strategies: str, cycle_ms: float, negotiation_ms: float | None,
             negotiation_growth: str, tensor_us: float | None, cpu_steal: float,
             comm_slowdown: float, fusion_mb: float, bucket_mb: float, defer: int | None,
             device_tflops: float | None, published: tuple[float, ...], validate: bool,
             md_path: str | None, json_path: str | None, plot_path: str | None) -> None:
    """Predict the step time of each strategy on a cluster from PROFILEs (files from
    `hvd-overlap profile`, or shipped ones: resnet50, resnet101, vgg16, ...).

    With --validate, compare with benchmark runs instead:
    `hvd-overlap simulate --validate docs/bench_*.json`.
    """
    import json
    from dataclasses import replace
    from pathlib import Path

    from hvd_overlap.core import autoplan
    from hvd_overlap.core import simulate as sim
    from hvd_overlap.tools import scaling

    if validate:
        if not profile_paths:
            raise click.UsageError("--validate: give bench JSON files (hvd-overlap bench --json)")
        try:
            table, checks = scaling.validation_markdown(profile_paths)
        except (ValueError, FileNotFoundError, KeyError) as e:
            raise click.ClickException(f"cannot validate: {e}") from None
        click.echo(table)
        if md_path:
            Path(md_path).write_text(table)
        if json_path:
            Path(json_path).write_text(json.dumps([{**c.__dict__, "error": c.error}
                                                   for c in checks], indent=1))
        if plot_path:
            scaling.plot_validation(plot_path, checks)
        return
    if not profile_paths:
        raise click.UsageError(f"give a PROFILE (shipped: {', '.join(sim.shipped_profiles())}) "
                               "or --validate BENCH.json")
    if published and len(published) != len(profile_paths):
        raise click.UsageError("--published: one value per PROFILE")
    try:
        cluster = scaling.cluster_from_options(
            2, bandwidth, latency, cycle_s=cycle_ms * 1e-3,
            negotiation_s=None if negotiation_ms is None else negotiation_ms * 1e-3,
            negotiation_growth=negotiation_growth,
            tensor_s=None if tensor_us is None else tensor_us * 1e-6, cpu_steal=cpu_steal,
            comm_slowdown=comm_slowdown, fusion_bytes=int(fusion_mb * 2**20),
            bucket_bytes=int(bucket_mb * 2**20))
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        autos = {"auto": "whole", "auto_sharded": "sharded"}
        unknown = [s for s in names if s not in sim.STRATEGIES + tuple(autos)]
        if unknown or not names:
            raise ValueError(f"--strategies {','.join(unknown) or '(empty)'}: choose from "
                             f"{', '.join(sim.STRATEGIES + tuple(autos))}")
        ranks = scaling.parse_ranks(np_)
        runs, choices, exchanges = {}, {}, {}
        for path in profile_paths:
            prof = sim.load_profile(path)
            if device_tflops is not None:
                if not prof.meta.get("device_tflops"):
                    raise ValueError(f"{path}: --device-tflops re-times FLOPs profiles only "
                                     "(`hvd-overlap profile --device-tflops`)")
                prof = prof.scaled(prof.meta["device_tflops"] / device_tflops)
            results = sim.sweep(prof, cluster, ranks, [n for n in names if n not in autos],
                                defer)
            choices[path] = []
            for name in (n for n in names if n in autos):
                picked = autoplan.sweep(prof, cluster, ranks, autos[name])
                choices[path] += [(name, c) for c in picked]
                results += [replace(c.result, strategy=name) for c in picked]
            results.sort(key=lambda r: (ranks.index(r.ranks), r.strategy in autos))
            runs[path] = (prof, results)
            exchanging = [n for n in names if n in sim.EXCHANGE_STRATEGIES]
            exchanges[path] = [c for p in ranks for c in sim.exchange_choices(
                prof, p, exchanging[0], cluster.bucket_bytes)] if exchanging else []
    except (ValueError, FileNotFoundError) as e:
        raise click.UsageError(str(e)) from None
    click.echo(f"link {bandwidth}/rank, latency {latency}/hop, cycle {cycle_ms} ms, fusion "
               f"{fusion_mb:g} MiB, negotiation {cluster.negotiation_s * 1e3:.3f} ms x "
               f"{negotiation_growth}(P), {cluster.tensor_s * 1e6:.0f} us/tensor, cpu steal "
               f"{cpu_steal}, comm slowdown {comm_slowdown}"
               + ("" if defer is None else f", defer {defer}"))
    for path, (prof, results) in runs.items():
        click.echo(f"\n{prof.model}: batch {prof.batch_size}/rank, "
                   f"{prof.grad_bytes / 2**20:.1f} MiB of gradients, compute "
                   f"{prof.compute_s * 1e3:.1f} ms/step")
        click.echo(scaling.format_results(results))
        for name, c in choices.get(path, []):
            click.echo(f"{name} at {c.result.ranks} ranks: {c.reason()}")
        if exchanges[path]:
            click.echo("\ndense factor exchange (exchange='auto'), per dense layer: MiB one "
                       "rank sends per step")
            click.echo(scaling.format_exchange(exchanges[path]))
    titles = {p: f"{prof.model} (b{prof.batch_size}), {bandwidth}"
              for p, (prof, _) in runs.items()}
    if md_path:
        Path(md_path).write_text(scaling.efficiency_markdown(
            {titles[p]: res for p, (_, res) in runs.items()}))
    if json_path:
        Path(json_path).write_text(json.dumps(
            {"cluster": cluster.__dict__, "profiles": {
                p: {"model": prof.model, "batch_size": prof.batch_size,
                    "compute_s": prof.compute_s, "results": [r.to_dict() for r in results],
                    "exchange": [c.to_dict() for c in exchanges[p]],
                    "auto": [{"as": name, "ranks": c.result.ranks, **c.best.keywords(),
                              "speedup_vs_stock": c.speedup} for name, c in choices.get(p, [])]}
                for p, (prof, results) in runs.items()}}, indent=1))
    if plot_path:
        scaling.plot_scaling(plot_path, {titles[p]: res for p, (_, res) in runs.items()},
                             dict(zip(titles.values(), published, strict=False)))


@main.command("auto-grid")
@click.argument("profile_paths", nargs=-1)
@click.option("--np", "np_", default="2-512", show_default=True, help="rank counts")
@click.option("--bandwidth", "bandwidths", default="1gbit,10gbit,25gbit,100gbit",
              show_default=True, help="per-rank link rates, comma-separated")
@click.option("--latency", "latencies", default="2us,10us,50us", show_default=True,
              help="per-hop latencies, comma-separated")
@click.option("--family", type=click.Choice(["whole", "sharded"]), default="whole",
              show_default=True, help="whole: strategy='auto'; sharded: strategy='sharded' "
                                      "with bucket_bytes='auto'")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False),
              help="also write the summary table here")
def auto_grid(profile_paths: tuple[str, ...], np_: str, bandwidths: str, latencies: str,
              family: str, md_path: str | None) -> None:
    """What strategy="auto" would choose over a grid of clusters, and its predicted speedup
    over stock Horovod (default PROFILEs: vgg16, resnet50, resnet101)."""
    from pathlib import Path

    from hvd_overlap.core import autoplan
    from hvd_overlap.core import simulate as sim
    from hvd_overlap.tools import scaling

    names = profile_paths or ("vgg16", "resnet50", "resnet101")
    try:
        profiles = {n: sim.load_profile(n) for n in names}
        points = autoplan.grid(
            profiles, scaling.parse_ranks(np_), bandwidths.split(","), latencies.split(","),
            lambda p, bw, lat: scaling.cluster_from_options(p, bw, lat), family)
    except (ValueError, FileNotFoundError) as e:
        raise click.UsageError(str(e)) from None
    table = autoplan.grid_markdown(points)
    click.echo(table)
    if md_path:
        Path(md_path).write_text(table)


@main.command()
@click.option("--net", "nets", multiple=True, default=("plain",), show_default=True,
              help="plain, or an emulated rate such as 1gbit (root); repeat for several")
@click.option("--net-model", type=click.Choice(["hosts", "loopback"]), default="hosts",
              show_default=True, help="emulated network of the rates (see hvd-overlap bench)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), required=True)
@click.option("--merge", is_flag=True, help="keep the networks already in the JSON file")
@click.option("--timeout", type=float, default=600, show_default=True)
def calibrate(nets: tuple[str, ...], net_model: str, json_path: str, merge: bool,
              timeout: float) -> None:
    """Measure Horovod's per-collective costs here (2 ranks, Gloo, pinned): the simulator's
    negotiation, per-tensor cost, bandwidth per collective type and CPU steal per network.
    Networks are keyed by their label: ``plain``, ``1gbit hosts``, ``1gbit loopback``."""
    import json
    from pathlib import Path

    from hvd_overlap.tools import calibrate as cal
    from hvd_overlap.tools.bench.launch import BenchError
    from hvd_overlap.tools.scaling import OVERHEADS_FORMAT, net_key

    old = json.loads(Path(json_path).read_text()) if merge and Path(json_path).exists() else {}
    out: dict[str, dict] = dict(old.get("nets", {}))
    commands = [old["command"]] if old.get("command") else []
    for net in nets:
        key = net_key(net, net_model)
        try:
            out[key] = cal.calibrate(net, timeout, net_model)
        except (BenchError, RuntimeError, ValueError) as e:
            raise click.ClickException(str(e)) from None
        f = out[key]["fit"]
        phases = ", ".join(f"{k.split('_bandwidth')[0]} {f[k] / 1e6:.0f} MB/s" for k in
                           ("reduce_scatter_bandwidth", "allgather_bandwidth",
                            "alltoall_gather_bandwidth") if k in f)
        click.echo(f"{key}: overhead {f['overhead_s'] * 1e3:.3f} ms, cycle period "
                   f"{f['cycle_period_s'] * 1e3:.3f} ms, bandwidth {f['bandwidth'] / 1e6:.0f} "
                   f"MB/s, {f['tensor_s'] * 1e6:.0f} us/tensor, cpu steal "
                   f"{f['cpu_steal']:.2f}, comm slowdown {f['comm_slowdown']:.2f}; {phases}")
    commands.append(f"hvd-overlap calibrate --net-model {net_model} "
                    + " ".join(f"--net {n}" for n in nets) + f" --json {json_path}"
                    + (" --merge" if merge else ""))
    Path(json_path).write_text(json.dumps({
        "format": OVERHEADS_FORMAT, "what": "2 ranks, Horovod over Gloo, pinned; see "
        "hvd_overlap/calibrate.py", "command": "; ".join(commands), "nets": out,
        **({"cluster_defaults": old["cluster_defaults"]} if "cluster_defaults" in old else {})},
        indent=1))
